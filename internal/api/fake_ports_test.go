package api

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"sort"
	"time"

	"github.com/emberbox/emberbox/internal/errdefs"
	"github.com/emberbox/emberbox/internal/sandbox"
)

// listen makes port of sandbox id reach addr through DialPort.
func (m *fakeManager) listen(id string, port int, addr string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.ports == nil {
		m.ports = map[string]string{}
	}
	m.ports[fmt.Sprintf("%s:%d", id, port)] = addr
}

func (g fakeGuest) DialPort(ctx context.Context, port int) (net.Conn, error) {
	g.m.mu.Lock()
	addr := g.m.ports[fmt.Sprintf("%s:%d", g.id, port)]
	g.m.mu.Unlock()
	if addr == "" {
		return nil, errdefs.New(errdefs.ErrUnavailable, "port_refused", "nothing accepts connections on port %d in the sandbox", port)
	}
	var d net.Dialer
	return d.DialContext(ctx, "tcp", addr)
}

// The preview calls keep previews in a map, with the sandbox package's
// own tokens.

func (m *fakeManager) CreatePreview(ctx context.Context, owner, id string, spec sandbox.PreviewSpec) (*sandbox.Preview, error) {
	if _, err := m.Get(ctx, owner, id); err != nil {
		return nil, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.previews == nil {
		m.previews = map[string]*sandbox.Preview{}
	}
	k := fmt.Sprintf("%s:%d", id, spec.Port)
	p := m.previews[k]
	now := time.Now()
	if p == nil {
		p = &sandbox.Preview{ID: "pv" + randomHex(16), SandboxID: id, OwnerKeyID: owner, Port: spec.Port,
			Visibility: sandbox.PreviewPrivate, Secret: []byte(randomHex(32)), CreatedAt: now}
		m.previews[k] = p
	}
	if spec.Visibility != "" {
		p.Visibility = spec.Visibility
	}
	if spec.TTL > 0 {
		t := now.Add(spec.TTL)
		p.ExpiresAt = &t
	}
	if spec.EmbedOrigins != nil {
		p.EmbedOrigins = *spec.EmbedOrigins
	}
	p.UpdatedAt = now
	cp := *p
	return &cp, nil
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func (m *fakeManager) ListPreviews(ctx context.Context, owner, id string) ([]*sandbox.Preview, error) {
	if _, err := m.Get(ctx, owner, id); err != nil {
		return nil, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []*sandbox.Preview
	for _, p := range m.previews {
		if p.SandboxID == id {
			cp := *p
			out = append(out, &cp)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Port < out[j].Port })
	return out, nil
}

func (m *fakeManager) GetPreview(ctx context.Context, owner, id string, port int) (*sandbox.Preview, error) {
	if _, err := m.Get(ctx, owner, id); err != nil {
		return nil, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	p := m.previews[fmt.Sprintf("%s:%d", id, port)]
	if p == nil {
		return nil, errdefs.New(errdefs.ErrNotFound, "preview_not_found", "no preview of port %d", port)
	}
	cp := *p
	return &cp, nil
}

func (m *fakeManager) DeletePreview(ctx context.Context, owner, id string, port int) (*sandbox.Preview, error) {
	p, err := m.GetPreview(ctx, owner, id, port)
	if err != nil {
		return nil, err
	}
	m.mu.Lock()
	delete(m.previews, fmt.Sprintf("%s:%d", id, port))
	m.mu.Unlock()
	return p, nil
}

func (m *fakeManager) RotatePreview(ctx context.Context, owner, id string, port int) (*sandbox.Preview, error) {
	if _, err := m.GetPreview(ctx, owner, id, port); err != nil {
		return nil, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	p := m.previews[fmt.Sprintf("%s:%d", id, port)]
	p.Secret = []byte(randomHex(32))
	cp := *p
	return &cp, nil
}

func (m *fakeManager) OpenPreview(ctx context.Context, id string, port int) (*sandbox.Preview, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	p := m.previews[fmt.Sprintf("%s:%d", id, port)]
	if p == nil || (p.ExpiresAt != nil && !time.Now().Before(*p.ExpiresAt)) {
		return nil, errdefs.New(errdefs.ErrNotFound, "preview_not_found", "no preview here")
	}
	cp := *p
	return &cp, nil
}
