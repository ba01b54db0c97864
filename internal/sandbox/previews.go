package sandbox

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"strconv"
	"strings"
	"time"

	"github.com/emberbox/emberbox/internal/errdefs"
)

// A preview shares one port of a sandbox at a URL the server serves
// (internal/api): public until it expires, or private, reached with the
// owner's key or a token the preview signs. A preview only ever reaches
// its own sandbox's port, over the guest stream (no network card).

// Visibilities of a preview.
const (
	PreviewPrivate = "private"
	PreviewPublic  = "public"
)

// Bounds of previews.
const (
	// MaxPreviews bounds the previews of one sandbox.
	MaxPreviews = 32
	// MinPreviewTTL and MaxPreviewTTL bound a preview's and a token's
	// lifetime; DefaultTokenTTL is a token's when nothing shorter applies.
	MinPreviewTTL   = time.Minute
	MaxPreviewTTL   = 7 * 24 * time.Hour
	DefaultTokenTTL = 24 * time.Hour
	// MaxEmbedOrigins bounds a preview's embed origins.
	MaxEmbedOrigins = 16
)

// Preview is the durable record of a shared port.
type Preview struct {
	ID         string // names it in its URL
	SandboxID  string
	OwnerKeyID string
	Port       int
	Visibility string
	// Secret signs the preview's tokens; a rotation replaces it, which
	// refuses every token signed before.
	Secret       []byte
	EmbedOrigins []string // sites that may frame it; empty: any
	CreatedAt    time.Time
	UpdatedAt    time.Time
	ExpiresAt    *time.Time // nil: until deleted
}

// PreviewSpec is what a create or change of a preview asks for. Nil and
// zero fields keep what an existing preview has.
type PreviewSpec struct {
	Port         int
	Visibility   string
	TTL          time.Duration
	ExpiresAt    *time.Time
	EmbedOrigins *[]string
}

// PreviewStore keeps previews; store.Store implements it.
type PreviewStore interface {
	// PutPreview inserts p, or replaces the preview of its sandbox and port.
	PutPreview(ctx context.Context, p *Preview) error
	GetPreview(ctx context.Context, sandboxID string, port int) (*Preview, error)
	ListPreviews(ctx context.Context, sandboxID string) ([]*Preview, error)
	// DeletePreviews removes a sandbox's preview of port, or all of them
	// when port is 0.
	DeletePreviews(ctx context.Context, sandboxID string, port int) error
}

// Previews keeps the previews of sandboxes. It reads the manager's
// records through previewHost; Manager.Previews returns the manager's.
type Previews struct {
	host    previewHost
	records Store // a PreviewStore, or this server keeps no previews
}

// previewHost is what previews need of the manager: a sandbox as its
// owner sees it, and the clock.
type previewHost interface {
	get(ctx context.Context, owner, id string) (*Sandbox, error)
	now() time.Time
}

func (pv *Previews) store() (PreviewStore, error) {
	ps, ok := pv.records.(PreviewStore)
	if !ok {
		return nil, errdefs.New(errdefs.ErrUnavailable, "previews_unavailable", "this server's store keeps no previews")
	}
	return ps, nil
}

func previewNotFound(id string, port int) error {
	return errdefs.New(errdefs.ErrNotFound, "preview_not_found", "sandbox %s shares no port %d", id, port).
		WithHint("POST /v1/sandboxes/{id}/previews shares a port")
}

// CreatePreview shares a port of owner's sandbox id, or changes the
// visibility, lifetime or embed origins of its preview.
func (pv *Previews) CreatePreview(ctx context.Context, owner, id string, spec PreviewSpec) (*Preview, error) {
	ps, err := pv.store()
	if err != nil {
		return nil, err
	}
	sb, err := pv.host.get(ctx, owner, id)
	if err != nil {
		return nil, err
	}
	if sb.State == StateDeleted || sb.State == StateDeleting {
		return nil, errdefs.New(errdefs.ErrConflict, "sandbox_deleted", "sandbox %s is deleted", id)
	}
	now := pv.host.now()
	expires, err := previewExpiry(now, spec.TTL, spec.ExpiresAt)
	if err != nil {
		return nil, err
	}
	p, err := ps.GetPreview(ctx, id, spec.Port)
	switch {
	case errdefs.IsNotFound(err):
		all, err := ps.ListPreviews(ctx, id)
		if err != nil {
			return nil, err
		}
		if len(all) >= MaxPreviews {
			return nil, errdefs.New(errdefs.ErrConflict, "too_many_previews", "sandbox %s already shares %d ports", id, MaxPreviews).
				WithHint("delete a preview first")
		}
		p = &Preview{ID: newPreviewID(), SandboxID: id, OwnerKeyID: owner, Port: spec.Port,
			Visibility: PreviewPrivate, Secret: newPreviewSecret(), CreatedAt: now}
	case err != nil:
		return nil, err
	}
	if spec.Visibility != "" {
		p.Visibility = spec.Visibility
	}
	if spec.EmbedOrigins != nil {
		p.EmbedOrigins = *spec.EmbedOrigins
	}
	if expires != nil {
		p.ExpiresAt = expires
	}
	p.UpdatedAt = now
	if err := ps.PutPreview(ctx, p); err != nil {
		return nil, err
	}
	return p, nil
}

// previewExpiry is the earlier of now+ttl and at, each checked against
// the bounds; nil if neither is given.
func previewExpiry(now time.Time, ttl time.Duration, at *time.Time) (*time.Time, error) {
	var out *time.Time
	if ttl != 0 {
		if ttl < MinPreviewTTL || ttl > MaxPreviewTTL {
			return nil, errdefs.New(errdefs.ErrInvalidArgument, "invalid_request", "ttlSeconds must be %d to %d",
				int(MinPreviewTTL.Seconds()), int(MaxPreviewTTL.Seconds()))
		}
		t := now.Add(ttl)
		out = &t
	}
	if at != nil {
		if d := at.Sub(now); d < MinPreviewTTL || d > MaxPreviewTTL {
			return nil, errdefs.New(errdefs.ErrInvalidArgument, "invalid_request", "expiresAt must be one minute to seven days from now")
		}
		if out == nil || at.Before(*out) {
			t := *at
			out = &t
		}
	}
	return out, nil
}

// ListPreviews returns the previews of owner's sandbox id that have not
// expired, by port.
func (pv *Previews) ListPreviews(ctx context.Context, owner, id string) ([]*Preview, error) {
	ps, err := pv.store()
	if err != nil {
		return nil, err
	}
	if _, err := pv.host.get(ctx, owner, id); err != nil {
		return nil, err
	}
	all, err := ps.ListPreviews(ctx, id)
	if err != nil {
		return nil, err
	}
	now := pv.host.now()
	out := all[:0]
	for _, p := range all {
		if p.live(now) {
			out = append(out, p)
		}
	}
	return out, nil
}

// GetPreview returns the preview of port of owner's sandbox id.
func (pv *Previews) GetPreview(ctx context.Context, owner, id string, port int) (*Preview, error) {
	ps, err := pv.store()
	if err != nil {
		return nil, err
	}
	if _, err := pv.host.get(ctx, owner, id); err != nil {
		return nil, err
	}
	p, err := ps.GetPreview(ctx, id, port)
	if errdefs.IsNotFound(err) || (err == nil && !p.live(pv.host.now())) {
		return nil, previewNotFound(id, port)
	}
	return p, err
}

// DeletePreview stops sharing port; deleting twice is not_found.
func (pv *Previews) DeletePreview(ctx context.Context, owner, id string, port int) (*Preview, error) {
	p, err := pv.GetPreview(ctx, owner, id, port)
	if err != nil {
		return nil, err
	}
	ps, _ := pv.store()
	if err := ps.DeletePreviews(ctx, id, port); err != nil {
		return nil, err
	}
	return p, nil
}

// RotatePreview gives the preview a new secret: every token signed before
// is refused from now on.
func (pv *Previews) RotatePreview(ctx context.Context, owner, id string, port int) (*Preview, error) {
	p, err := pv.GetPreview(ctx, owner, id, port)
	if err != nil {
		return nil, err
	}
	ps, _ := pv.store()
	p.Secret, p.UpdatedAt = newPreviewSecret(), pv.host.now()
	if err := ps.PutPreview(ctx, p); err != nil {
		return nil, err
	}
	return p, nil
}

// OpenPreview returns the live preview of port of sandbox id, of any
// owner, for serving its host: not found if it does not exist, has
// expired, or its sandbox is deleted.
func (pv *Previews) OpenPreview(ctx context.Context, id string, port int) (*Preview, error) {
	ps, err := pv.store()
	if err != nil {
		return nil, err
	}
	nf := errdefs.New(errdefs.ErrNotFound, "preview_not_found", "no preview here: it was deleted or has expired")
	p, err := ps.GetPreview(ctx, id, port)
	if errdefs.IsNotFound(err) {
		return nil, nf
	}
	if err != nil {
		return nil, err
	}
	if !p.live(pv.host.now()) {
		return nil, nf
	}
	sb, err := pv.records.GetSandbox(ctx, p.SandboxID)
	if errdefs.IsNotFound(err) || (err == nil && (sb.State == StateDeleted || sb.State == StateDeleting)) {
		return nil, nf
	}
	if err != nil {
		return nil, err
	}
	return p, nil
}

func (p *Preview) live(now time.Time) bool { return p.ExpiresAt == nil || now.Before(*p.ExpiresAt) }

// TokenExpiry is when a token signed now lasts until: DefaultTokenTTL,
// or less if ttl, at or the preview's own end come first.
func (p *Preview) TokenExpiry(now time.Time, ttl time.Duration, at *time.Time) (time.Time, error) {
	exp := now.Add(DefaultTokenTTL)
	capped, err := previewExpiry(now, ttl, at)
	if err != nil {
		return time.Time{}, err
	}
	if capped != nil && capped.Before(exp) {
		exp = *capped
	}
	if p.ExpiresAt != nil && p.ExpiresAt.Before(exp) {
		exp = *p.ExpiresAt
	}
	return exp.Truncate(time.Second), nil
}

// Token signs a token for the preview that lasts until exp.
func (p *Preview) Token(exp time.Time) string {
	head := p.ID + "." + strconv.FormatInt(exp.Unix(), 10)
	return head + "." + p.sign(head)
}

// CheckToken reports whether token is one of this preview's, signed with
// its current secret, and not expired at now.
func (p *Preview) CheckToken(token string, now time.Time) bool {
	i := strings.LastIndexByte(token, '.')
	if i < 0 || len(token) > 256 {
		return false
	}
	head, sig := token[:i], token[i+1:]
	id, expText, ok := strings.Cut(head, ".")
	if !ok || id != p.ID {
		return false
	}
	exp, err := strconv.ParseInt(expText, 10, 64)
	if err != nil || now.Unix() >= exp {
		return false
	}
	return hmac.Equal([]byte(sig), []byte(p.sign(head)))
}

func (p *Preview) sign(head string) string {
	mac := hmac.New(sha256.New, p.Secret)
	mac.Write([]byte(head))
	return base64.RawURLEncoding.EncodeToString(mac.Sum(nil))
}

func newPreviewID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return "pv" + hex.EncodeToString(b[:])
}

func newPreviewSecret() []byte {
	b := make([]byte, 32)
	_, _ = rand.Read(b)
	return b
}

// ValidID reports whether id has the form of a sandbox id ("sbx_" and 20
// lowercase hex digits), as a preview's host name must carry it.
func ValidID(id string) bool { return validSandboxID(id) }
