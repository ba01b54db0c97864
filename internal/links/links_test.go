package links

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/emberbox/emberbox/internal/errdefs"
)

type memGens struct {
	mu sync.Mutex
	g  map[string]int64
}

func (m *memGens) LinkGeneration(_ context.Context, id string) (int64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.g[id], nil
}

func (m *memGens) RevokeLinks(_ context.Context, id string) (int64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.g[id]++
	return m.g[id], nil
}

func newTestSigner(t *testing.T, now *time.Time) *Signer {
	t.Helper()
	s, err := NewSigner([]byte(strings.Repeat("k", KeyBytes)), &memGens{g: map[string]int64{}}, func() time.Time { return *now })
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestSignOpenExpireRevoke(t *testing.T) {
	ctx := context.Background()
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	s := newTestSigner(t, &now)
	tok, exp, err := s.Sign(ctx, Claims{SandboxID: "sbx_1", Owner: "key_a", Path: "/workspace/a", Method: "GET"}, 0)
	if err != nil || !exp.Equal(now.Add(DefaultTTL)) {
		t.Fatalf("sign: %v %v", exp, err)
	}
	c, err := s.Open(ctx, tok)
	if err != nil || c.Path != "/workspace/a" || c.Owner != "key_a" {
		t.Fatalf("open: %+v %v", c, err)
	}
	// Every byte matters: a token changed anywhere is not valid.
	for i := range tok {
		b := []byte(tok)
		b[i] ^= 1
		if _, err := s.Open(ctx, string(b)); errdefs.Code(err) != CodeInvalid {
			t.Fatalf("token changed at %d: %v", i, err)
		}
	}
	// Another server's key signs tokens this one refuses.
	other, _ := NewSigner([]byte(strings.Repeat("o", KeyBytes)), &memGens{g: map[string]int64{}}, nil)
	if _, err := other.Open(ctx, tok); errdefs.Code(err) != CodeInvalid {
		t.Fatalf("another key: %v", err)
	}
	// A TTL past the most is cut to it.
	if _, exp, _ := s.Sign(ctx, Claims{SandboxID: "sbx_1", Method: "PUT"}, 30*24*time.Hour); !exp.Equal(now.Add(MaxTTL)) {
		t.Fatalf("long ttl: %v", exp)
	}
	now = now.Add(DefaultTTL)
	if _, err := s.Open(ctx, tok); errdefs.Code(err) != CodeExpired || !errors.Is(err, errdefs.ErrPermission) {
		t.Fatalf("expired: %v", err)
	}
	now = now.Add(-time.Minute)
	if _, err := s.Revoke(ctx, "sbx_1"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Open(ctx, tok); errdefs.Code(err) != CodeRevoked {
		t.Fatalf("revoked: %v", err)
	}
	tok2, _, _ := s.Sign(ctx, Claims{SandboxID: "sbx_1", Method: "GET"}, time.Minute)
	if _, err := s.Open(ctx, tok2); err != nil {
		t.Fatalf("a link signed after the revoke: %v", err)
	}
	if _, err := s.Open(ctx, strings.Repeat("a", MaxTokenLen+1)); errdefs.Code(err) != CodeInvalid {
		t.Fatalf("huge token: %v", err)
	}
}

func TestLoadKey(t *testing.T) {
	p := filepath.Join(t.TempDir(), "link.key")
	k1, err := LoadKey(p)
	if err != nil || len(k1) != KeyBytes {
		t.Fatalf("make: %d %v", len(k1), err)
	}
	st, err := os.Stat(p)
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("mode: %v %v", st, err)
	}
	k2, err := LoadKey(p)
	if err != nil || string(k1) != string(k2) {
		t.Fatal("the key changed when loaded again")
	}
	if ents, _ := os.ReadDir(filepath.Dir(p)); len(ents) != 1 {
		t.Fatalf("left behind: %v", ents)
	}
	if err := os.WriteFile(p, []byte("short"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadKey(p); err == nil {
		t.Fatal("a short key was taken")
	}
}
