package api

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httputil"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/emberbox/emberbox/internal/errdefs"
	"github.com/emberbox/emberbox/internal/sandbox"
)

// A preview's URL, /preview/<id>/<path>, is proxied to its sandbox's port
// by net/http/httputil.ReverseProxy (HTTP and Upgrade, so WebSockets too)
// over a guest connection (Guest.DialPort). The target comes from the
// preview's record alone, never from the request, so a preview reaches its
// own sandbox's port and nothing else.

// previewHostSuffix marks the transport's dial addresses: <id>.preview.
const previewHostSuffix = ".preview"

// newPreviewTransport is the transport of every preview: its connections
// are guest streams, pooled per preview.
func (s *server) newPreviewTransport() *http.Transport {
	return &http.Transport{
		DialContext:            s.dialPreview,
		MaxIdleConnsPerHost:    4,
		IdleConnTimeout:        30 * time.Second,
		MaxResponseHeaderBytes: 64 << 10,
		ForceAttemptHTTP2:      false,
	}
}

// dialPreview connects to the port of the preview the address names.
func (s *server) dialPreview(ctx context.Context, _, addr string) (net.Conn, error) {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, err
	}
	id, ok := strings.CutSuffix(host, previewHostSuffix)
	if !ok {
		return nil, errors.New("not a preview address")
	}
	pm, err := s.previewManager()
	if err != nil {
		return nil, err
	}
	p, err := pm.OpenPreview(ctx, id)
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

// servePreview serves a preview's URL.
func (s *server) servePreview(w http.ResponseWriter, r *http.Request) {
	rest := strings.TrimPrefix(r.URL.Path, previewPrefix)
	id, path, hasSlash := strings.Cut(rest, "/")
	if id == "" || len(id) > 64 || strings.ContainsAny(id, ".:") {
		s.writeError(w, r, routeNotFound(r))
		return
	}
	if !hasSlash {
		u := *r.URL
		u.Path += "/"
		http.Redirect(w, r, u.RequestURI(), http.StatusPermanentRedirect)
		return
	}
	pm, err := s.previewManager()
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	p, err := pm.OpenPreview(r.Context(), id)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	usedKey, err := s.previewAllowed(w, r, p)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	proxy := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL.Scheme = "http"
			pr.Out.URL.Host = p.ID + previewHostSuffix + ":" + strconv.Itoa(p.Port)
			pr.Out.URL.Path, pr.Out.URL.RawPath = "/"+path, ""
			pr.Out.Host = "localhost:" + strconv.Itoa(p.Port)
			pr.SetXForwarded()
			stripPreviewCredentials(pr.Out, usedKey)
		},
		Transport: s.previewTransport,
		ModifyResponse: func(resp *http.Response) error {
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

// previewAllowed checks a request to a private preview: the owner's key
// as a bearer token, or a token of the preview in the header, the query
// (then kept as a cookie) or the cookie. usedKey says the Authorization
// header was the key, which the guest must not see.
func (s *server) previewAllowed(w http.ResponseWriter, r *http.Request, p *sandbox.Preview) (usedKey bool, err error) {
	if p.Visibility == sandbox.PreviewPublic {
		return false, nil
	}
	now := s.now()
	if tok := r.Header.Get(previewTokenHeader); tok != "" && p.CheckToken(tok, now) {
		return false, nil
	}
	if tok := r.URL.Query().Get(previewTokenQuery); tok != "" && p.CheckToken(tok, now) {
		// A browser opened urlWithToken: its next requests carry the cookie.
		http.SetCookie(w, &http.Cookie{Name: previewCookie, Value: tok, Path: previewPrefix + p.ID + "/",
			HttpOnly: true, Secure: r.TLS != nil, SameSite: http.SameSiteLaxMode, MaxAge: tokenMaxAge(tok, now)})
		return false, nil
	}
	if ck, err := r.Cookie(previewCookie); err == nil && p.CheckToken(ck.Value, now) {
		return false, nil
	}
	if strings.HasPrefix(strings.ToLower(r.Header.Get("Authorization")), "bearer ") {
		if key, err := s.authenticate(r); err == nil && key.ID == p.OwnerKeyID {
			return true, nil
		}
	}
	return false, newError(http.StatusUnauthorized, "preview_token_required", "This preview is private.").
		withHint("Send its token as the x-runtime-preview-token header or the runtime_preview_token query parameter (GET /v1/sandboxes/{id}/previews/{port} gives one), or the owner's API key as a bearer token.")
}

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

// stripPreviewCredentials removes what authenticated the request before
// it reaches the guest: the preview token wherever it came, and the API key.
func stripPreviewCredentials(out *http.Request, usedKey bool) {
	out.Header.Del(previewTokenHeader)
	if usedKey {
		out.Header.Del("Authorization")
	}
	if q := out.URL.Query(); q.Has(previewTokenQuery) {
		q.Del(previewTokenQuery)
		out.URL.RawQuery = q.Encode()
	}
	cookies := out.Cookies()
	out.Header.Del("Cookie")
	for _, c := range cookies {
		if c.Name != previewCookie {
			out.AddCookie(c)
		}
	}
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
