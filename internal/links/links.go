// Package links signs and checks the file links of sandboxes: URLs that anyone
// may use without an API key to download or upload one path until they expire
// or the sandbox's links are revoked.
//
// A link's token is base64url(JSON claims) "." base64url(HMAC-SHA256 of the
// first part) under a server key kept in the data dir. Revocation bumps a
// generation number kept per sandbox (Generations); a token carries the
// generation it was signed under and is refused once that is not current.
//
// The claims are sandbox, owner, path, method, expiry, generation, archive,
// filename, wake, maxBytes and a nonce; the 32-byte key is made once by
// `LoadKey` in `<data>/link.key` (0600, written to a temporary file and
// `link(2)`ed into place, so two starting servers agree). `Signer.Open` checks
// signature, expiry and generation (the store's `link_generations` table);
// `Revoke` bumps it. Refusals are 403 `link_invalid`, `link_expired`,
// `link_revoked`. Links live at most 7 days (default 1 h); a key revoked later
// does not end its links: revoke them with the sandbox's `files:revoke-links`.
package links

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/emberbox/emberbox/internal/errdefs"
)

// Limits of links.
const (
	DefaultTTL = time.Hour
	MaxTTL     = 7 * 24 * time.Hour
	KeyBytes   = 32
	// MaxTokenLen bounds a token before it is decoded; claims hold one
	// path (at most 4 KiB) and a file name.
	MaxTokenLen = 16 << 10
)

// Codes of the errors Open returns.
const (
	CodeInvalid = "link_invalid" // ErrPermission (403): not a token this server signed
	CodeExpired = "link_expired" // ErrPermission
	CodeRevoked = "link_revoked" // ErrPermission: the sandbox's links were revoked since
)

// b64 is strict: a token has one spelling.
var b64 = base64.RawURLEncoding.Strict()

// Claims are what a link allows.
type Claims struct {
	SandboxID string `json:"s"`
	Owner     string `json:"o"`
	Path      string `json:"p"`
	Method    string `json:"m"` // GET or PUT
	Expires   int64  `json:"e"` // unix seconds
	Gen       int64  `json:"g"`
	Archive   bool   `json:"a,omitempty"` // GET: the directory as .tar.gz
	Filename  string `json:"f,omitempty"` // GET: the download's name
	Wake      bool   `json:"w,omitempty"` // wake a paused sandbox
	MaxBytes  int64  `json:"x,omitempty"` // PUT: the largest body taken
	Nonce     string `json:"n"`           // two links of one path differ
}

// Generations keeps the link generation of each sandbox durably.
type Generations interface {
	LinkGeneration(ctx context.Context, sandboxID string) (int64, error)
	// RevokeLinks bumps the generation and returns the new one.
	RevokeLinks(ctx context.Context, sandboxID string) (int64, error)
}

// Signer signs and opens links.
type Signer struct {
	key  []byte
	gens Generations
	now  func() time.Time
}

// NewSigner returns a signer with key (KeyBytes or more) and gens; now nil
// is time.Now.
func NewSigner(key []byte, gens Generations, now func() time.Time) (*Signer, error) {
	if len(key) < KeyBytes {
		return nil, fmt.Errorf("links: a key of %d bytes, want %d", len(key), KeyBytes)
	}
	if gens == nil {
		return nil, errors.New("links: no generations")
	}
	if now == nil {
		now = time.Now
	}
	return &Signer{key: key, gens: gens, now: now}, nil
}

// Sign makes a token for c, valid for ttl (DefaultTTL if 0, at most
// MaxTTL) under the sandbox's current generation. It returns the token and
// when it expires.
func (s *Signer) Sign(ctx context.Context, c Claims, ttl time.Duration) (string, time.Time, error) {
	if ttl <= 0 {
		ttl = DefaultTTL
	}
	ttl = min(ttl, MaxTTL)
	g, err := s.gens.LinkGeneration(ctx, c.SandboxID)
	if err != nil {
		return "", time.Time{}, err
	}
	exp := s.now().Add(ttl).Truncate(time.Second)
	c.Expires, c.Gen = exp.Unix(), g
	var nonce [9]byte
	_, _ = rand.Read(nonce[:])
	c.Nonce = b64.EncodeToString(nonce[:])
	body, err := json.Marshal(c)
	if err != nil {
		return "", time.Time{}, fmt.Errorf("signing a link: %w", err)
	}
	head := b64.EncodeToString(body)
	return head + "." + b64.EncodeToString(s.mac(head)), exp, nil
}

func (s *Signer) mac(head string) []byte {
	m := hmac.New(sha256.New, s.key)
	m.Write([]byte(head))
	return m.Sum(nil)
}

// Open checks a token's signature, expiry and generation and returns its
// claims.
func (s *Signer) Open(ctx context.Context, token string) (*Claims, error) {
	bad := errdefs.New(errdefs.ErrPermission, CodeInvalid, "This link is not valid.").
		WithHint("Ask whoever shared it for a new link.")
	head, sig, ok := strings.Cut(token, ".")
	if !ok || len(token) > MaxTokenLen {
		return nil, bad
	}
	got, err := b64.DecodeString(sig)
	if err != nil || !hmac.Equal(got, s.mac(head)) {
		return nil, bad
	}
	body, err := b64.DecodeString(head)
	if err != nil {
		return nil, bad
	}
	var c Claims
	if err := json.Unmarshal(body, &c); err != nil || c.SandboxID == "" || (c.Method != "GET" && c.Method != "PUT") {
		return nil, bad
	}
	if !s.now().Before(time.Unix(c.Expires, 0)) {
		return nil, errdefs.New(errdefs.ErrPermission, CodeExpired, "This link expired at %s.",
			time.Unix(c.Expires, 0).UTC().Format(time.RFC3339)).WithHint("Ask whoever shared it for a new link.")
	}
	g, err := s.gens.LinkGeneration(ctx, c.SandboxID)
	if err != nil {
		return nil, err
	}
	if g != c.Gen {
		return nil, errdefs.New(errdefs.ErrPermission, CodeRevoked, "This link was revoked.").
			WithHint("Ask whoever shared it for a new link.")
	}
	return &c, nil
}

// Revoke ends every link of sandboxID and returns its new generation.
func (s *Signer) Revoke(ctx context.Context, sandboxID string) (int64, error) {
	return s.gens.RevokeLinks(ctx, sandboxID)
}

// LoadKey returns the signing key kept at path, making it (random, 0600,
// written atomically) if there is none.
func LoadKey(path string) ([]byte, error) {
	key, err := os.ReadFile(path)
	if err == nil {
		if len(key) < KeyBytes {
			return nil, fmt.Errorf("link key %s: %d bytes, want %d", path, len(key), KeyBytes)
		}
		return key, nil
	}
	if !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("reading the link key: %w", err)
	}
	key = make([]byte, KeyBytes)
	if _, err := rand.Read(key); err != nil {
		return nil, fmt.Errorf("making the link key: %w", err)
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".link-key-*")
	if err != nil {
		return nil, fmt.Errorf("making the link key: %w", err)
	}
	defer os.Remove(tmp.Name()) // after the link below, only the temporary name goes
	if err := tmp.Chmod(0o600); err != nil {
		tmp.Close()
		return nil, fmt.Errorf("making the link key: %w", err)
	}
	if _, err := tmp.Write(key); err != nil {
		tmp.Close()
		return nil, fmt.Errorf("writing the link key: %w", err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return nil, fmt.Errorf("writing the link key: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return nil, fmt.Errorf("writing the link key: %w", err)
	}
	// link(2) refuses to replace: of two servers starting at once, the
	// second reads the first's key.
	if err := os.Link(tmp.Name(), path); err != nil {
		if errors.Is(err, os.ErrExist) {
			return LoadKey(path)
		}
		return nil, fmt.Errorf("installing the link key: %w", err)
	}
	return key, nil
}
