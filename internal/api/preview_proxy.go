package api

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/emberbox/emberbox/internal/errdefs"
	"github.com/emberbox/emberbox/internal/liveview"
	"github.com/emberbox/emberbox/internal/sandbox"
)

// A preview is served on a host of its own, <port>-<sandbox id>.<preview
// domain> (preview_host.go), proxied to its sandbox's port by
// net/http/httputil.ReverseProxy (HTTP and Upgrade, so WebSockets too)
// over a guest connection (Guest.DialPort). The target comes from the
// preview's record alone, so a preview reaches its own sandbox's port and
// nothing else. Whatever the client sends, no credential of ours reaches
// the guest; whatever the guest answers, nothing that reaches past the
// preview's own origin reaches the browser.

// previewHost serves the hosts of previews, beside the API's routes: the
// proxy, its transport and the checks before it.
type previewHost struct{ *server }

// previewHostSuffix marks the transport's dial addresses:
// <sandbox id>.preview:<port>.
const previewHostSuffix = ".preview"

// newPreviewTransport is the transport of every preview: its connections
// are guest streams, pooled per preview.
func (s previewHost) newPreviewTransport() *http.Transport {
	return &http.Transport{
		DialContext:            s.dialPreview,
		MaxIdleConnsPerHost:    4,
		IdleConnTimeout:        30 * time.Second,
		MaxResponseHeaderBytes: 64 << 10,
		ForceAttemptHTTP2:      false,
	}
}

// dialPreview connects to the port of the preview the address names.
func (s previewHost) dialPreview(ctx context.Context, _, addr string) (net.Conn, error) {
	host, portText, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, fmt.Errorf("preview address %q: %w", addr, err)
	}
	id, ok := strings.CutSuffix(host, previewHostSuffix)
	port, perr := strconv.Atoi(portText)
	if !ok || perr != nil {
		return nil, fmt.Errorf("%q is not a preview address", addr)
	}
	pm, err := s.previewManager()
	if err != nil {
		return nil, err
	}
	p, err := pm.OpenPreview(ctx, id, port)
	if err != nil {
		return nil, err
	}
	// The transport's dial context outlives the request and may never
	// end; the guest is held busy only for the dial, and the connection's
	// traffic counts as activity after it (sandbox.activeConn).
	gctx, cancel := context.WithCancel(ctx)
	defer cancel()
	_, g, err := s.mgr.Guest(gctx, p.OwnerKeyID, p.SandboxID)
	if err != nil {
		return nil, err
	}
	conn, err := g.DialPort(gctx, p.Port)
	if err != nil {
		return nil, err
	}
	return s.previewConns.add(p.ID, conn), nil
}

// servePreviewHost serves a request that came for a preview's host.
func (s previewHost) servePreviewHost(w http.ResponseWriter, r *http.Request) {
	id, port, _, ok := s.previewDomain.parseHost(r.Host)
	if !ok {
		s.writeError(w, r, newError(http.StatusNotFound, "preview_not_found", "This host names no preview.").
			withHint("A preview's address is "+s.previewDomain.form()+"; GET /v1/sandboxes/{id}/previews lists them."))
		return
	}
	pm, err := s.previewManager()
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	p, err := pm.OpenPreview(r.Context(), id, port)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	liveView := p.Port == liveview.Port && s.computer != nil
	if liveView && liveview.IsAsset(r.URL.Path) {
		// The view's scripts and styles are the same public files for
		// every sandbox; the page loads them from a frame whose requests
		// may carry no cookie (SameSite), so they need no token.
		s.serveLiveView(w, r, p)
		return
	}
	if err := s.previewAllowed(w, r, p); err != nil {
		s.writeError(w, r, err)
		return
	}
	if s.previewPaused(w, r, p) {
		return
	}
	if liveView {
		s.serveLiveView(w, r, p)
		return
	}
	proxy := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL.Scheme = "http"
			pr.Out.URL.Host = p.SandboxID + previewHostSuffix + ":" + strconv.Itoa(p.Port)
			pr.Out.Host = "localhost:" + strconv.Itoa(p.Port)
			pr.SetXForwarded()
			StripCredentials(pr.Out)
		},
		Transport: s.previewTransport,
		ModifyResponse: func(resp *http.Response) error {
			confineResponse(resp.Header)
			if len(p.EmbedOrigins) > 0 && resp.Header.Get("Content-Security-Policy") == "" {
				resp.Header.Set("Content-Security-Policy", "frame-ancestors "+strings.Join(p.EmbedOrigins, " "))
			}
			return nil
		},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			s.writeError(w, r, previewUnreachable(err))
		},
	}
	proxy.ServeHTTP(w, r)
}

// serveLiveView serves the preview of a desktop's VNC port: the live view
// (internal/liveview), its WebSocket bridged to the VNC server, which
// starts on the first view.
func (s previewHost) serveLiveView(w http.ResponseWriter, r *http.Request, p *sandbox.Preview) {
	dial := func(ctx context.Context) (net.Conn, error) {
		_, g, err := s.mgr.Guest(ctx, p.OwnerKeyID, p.SandboxID)
		if err != nil {
			return nil, err
		}
		conn, err := s.computer.ViewConn(ctx, p.SandboxID, g)
		if err != nil {
			return nil, err
		}
		return s.previewConns.add(p.ID, conn), nil
	}
	liveview.Handler(dial, p.EmbedOrigins).ServeHTTP(w, r)
}

// previewAllowed checks a request to a private preview: the owner's key
// as a bearer token, or a token of the preview in the header, the query
// (then kept as a cookie of the preview's host) or the cookie.
func (s previewHost) previewAllowed(w http.ResponseWriter, r *http.Request, p *sandbox.Preview) error {
	if p.Visibility == sandbox.PreviewPublic {
		return nil
	}
	now := s.now()
	if tok := r.Header.Get(previewTokenHeader); tok != "" && p.CheckToken(tok, now) {
		return nil
	}
	if tok := r.URL.Query().Get(previewTokenQuery); tok != "" && p.CheckToken(tok, now) {
		// A browser opened urlWithToken: its next requests carry the
		// cookie, which no other origin sees (no Domain attribute).
		http.SetCookie(w, &http.Cookie{Name: previewCookie, Value: tok, Path: "/",
			HttpOnly: true, Secure: s.previewDomain.scheme == "https", SameSite: http.SameSiteLaxMode,
			MaxAge: tokenMaxAge(tok, now)})
		return nil
	}
	if ck, err := r.Cookie(previewCookie); err == nil && p.CheckToken(ck.Value, now) {
		return nil
	}
	if strings.HasPrefix(strings.ToLower(r.Header.Get("Authorization")), "bearer ") {
		if key, err := s.authenticate(r); err == nil && key.ID == p.OwnerKeyID {
			return nil
		}
	}
	return newError(http.StatusUnauthorized, "preview_token_required", "This preview is private.").
		withHint("Send its token as the x-runtime-preview-token header or the runtime_preview_token query parameter (GET /v1/sandboxes/{id}/previews/{port} gives one), or the owner's API key as a bearer token.")
}

// previewPaused answers for a preview whose sandbox is paused without
// autoWake: a visitor does not wake it at its owner's cost. It reports
// whether it answered.
func (s previewHost) previewPaused(w http.ResponseWriter, r *http.Request, p *sandbox.Preview) bool {
	sb, err := s.mgr.Get(r.Context(), p.OwnerKeyID, p.SandboxID)
	if err != nil || !sb.State.Paused() || sb.AutoWake {
		return false // Guest answers anything else
	}
	if !strings.Contains(r.Header.Get("Accept"), "text/html") {
		s.writeError(w, r, newError(http.StatusServiceUnavailable, "sandbox_paused", "The sandbox of this preview is paused.").
			withHint("Its owner wakes it (POST /v1/sandboxes/{id}:wake), or creates it with autoWake for visitors to wake it."))
		return true
	}
	h := w.Header()
	h.Set("Content-Type", "text/html; charset=utf-8")
	h.Set("Cache-Control", "no-store")
	h.Set("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'")
	w.WriteHeader(http.StatusServiceUnavailable)
	_, _ = io.WriteString(w, pausedPage)
	return true
}

// pausedPage is what a browser shows for a paused sandbox's preview.
const pausedPage = `<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Sandbox paused</title>
<style>body{font:16px/1.5 system-ui,sans-serif;max-width:36em;margin:15vh auto;padding:0 1em;color:#222}</style></head>
<body><h1>This sandbox is paused</h1>
<p>The server behind this preview is not running: its sandbox is paused. Visiting does not wake it.</p>
<p>Its owner can wake it, or create it with auto-wake so that visitors wake it.</p></body></html>
`

// tokenMaxAge is the seconds left of a token already checked.
func tokenMaxAge(tok string, now time.Time) int {
	parts := strings.Split(tok, ".")
	if len(parts) != 3 {
		return 0
	}
	exp, err := strconv.ParseInt(parts[1], 10, 64)
	if err != nil {
		return 0
	}
	return int(exp - now.Unix())
}

// confineResponse removes from a guest's answer what would reach past the
// preview's origin: a service worker's scope widened, cookies for a parent
// domain (or ours), and orders to clear the site's data.
func confineResponse(h http.Header) {
	h.Del("Service-Worker-Allowed")
	h.Del("Clear-Site-Data")
	kept := h.Values("Set-Cookie")[:0:0]
	for _, line := range h.Values("Set-Cookie") {
		if cookieStaysHome(line) {
			kept = append(kept, line)
		}
	}
	h.Del("Set-Cookie")
	for _, line := range kept {
		h.Add("Set-Cookie", line)
	}
}

// cookieStaysHome reports whether a Set-Cookie line sets a host-only
// cookie (no Domain attribute) that is not ours.
func cookieStaysHome(line string) bool {
	c, err := http.ParseSetCookie(line)
	if err != nil || c.Name == previewCookie {
		return false
	}
	_, attrs, _ := strings.Cut(line, ";")
	for attr := range strings.SplitSeq(attrs, ";") {
		name, _, _ := strings.Cut(attr, "=")
		if strings.EqualFold(strings.TrimSpace(name), "domain") {
			return false
		}
	}
	return true
}

// previewUnreachable is the answer when the guest port cannot be reached.
func previewUnreachable(err error) error {
	var ce *errdefs.CodedError
	if errors.As(err, &ce) {
		if ce.Code == "port_refused" {
			return newError(http.StatusBadGateway, "preview_unreachable", "Nothing answers on the preview's port in the sandbox.").
				withHint("Start a server listening on that port (0.0.0.0 or localhost) in the sandbox.")
		}
		return err
	}
	if errors.Is(err, context.Canceled) {
		return newError(statusClientClosed, "client_closed", "The request was cancelled.")
	}
	return newError(http.StatusBadGateway, "preview_unreachable", "The preview's server did not answer.")
}

// connSet tracks the guest connections each preview carries, so that a
// deleted preview's are closed at once.
type connSet struct {
	mu sync.Mutex
	m  map[string]map[*trackedConn]struct{}
}

type trackedConn struct {
	net.Conn
	set  *connSet
	id   string
	once sync.Once
}

func (c *trackedConn) Close() error {
	c.once.Do(func() {
		c.set.mu.Lock()
		delete(c.set.m[c.id], c)
		if len(c.set.m[c.id]) == 0 {
			delete(c.set.m, c.id)
		}
		c.set.mu.Unlock()
	})
	return c.Conn.Close()
}

func (cs *connSet) add(id string, conn net.Conn) net.Conn {
	tc := &trackedConn{Conn: conn, set: cs, id: id}
	cs.mu.Lock()
	defer cs.mu.Unlock()
	if cs.m == nil {
		cs.m = map[string]map[*trackedConn]struct{}{}
	}
	if cs.m[id] == nil {
		cs.m[id] = map[*trackedConn]struct{}{}
	}
	cs.m[id][tc] = struct{}{}
	return tc
}

// closeAll closes every connection of preview id.
func (cs *connSet) closeAll(id string) {
	cs.mu.Lock()
	conns := make([]*trackedConn, 0, len(cs.m[id]))
	for c := range cs.m[id] {
		conns = append(conns, c)
	}
	cs.mu.Unlock()
	for _, c := range conns {
		_ = c.Close()
	}
}
