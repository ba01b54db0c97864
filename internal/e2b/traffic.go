package e2b

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httputil"
	"strconv"
	"strings"
	"time"

	"github.com/emberbox/emberbox/internal/api"
	"github.com/emberbox/emberbox/internal/errdefs"
	"github.com/emberbox/emberbox/internal/sandbox"
)

// Headers of sandbox traffic.
const (
	headerSandboxID   = "E2b-Sandbox-Id"
	headerSandboxPort = "E2b-Sandbox-Port"
	headerAccessToken = "X-Access-Token"
	headerTraffic     = "E2B-Traffic-Access-Token"
)

// serveSandbox authenticates a request for a sandbox's port and hands it to
// the port's service.
func (h *Handler) serveSandbox(w http.ResponseWriter, r *http.Request, id string, port int) {
	if id == "" || len(id) > 64 || strings.ContainsAny(id, "/.:?#% ") {
		writeError(w, newError(http.StatusBadRequest, "invalid sandbox id"))
		return
	}
	owner, err := h.tokenOwner(r, id, port)
	if err != nil {
		writeError(w, err)
		return
	}
	sb, g, err := h.cfg.Manager.Guest(r.Context(), owner, id)
	if err != nil {
		if errdefs.IsNotFound(err) {
			err = newError(http.StatusNotFound, fmt.Sprintf("sandbox %q not found", id))
		}
		writeError(w, err)
		return
	}
	r = r.WithContext(sandbox.WithRouted(r.Context(), sandbox.Routed{Sandbox: sb, Guest: g, Home: homeOf(sb)}))
	var next http.Handler
	switch port {
	case EnvdPort:
		next = h.cfg.Envd
	case InterpreterPort:
		next = h.cfg.Interpreter
	default:
		h.proxyPort(w, r, sb.ID, port)
		return
	}
	if next == nil {
		writeError(w, newError(http.StatusBadGateway, fmt.Sprintf("port %d is not served", port)))
		return
	}
	next.ServeHTTP(w, r)
}

// e2bHome is the sandbox user's home and working directory in E2B's
// layout. The agent links it to the image's home (/workspace), so both
// protocols name one directory.
const e2bHome = "/home/user"

// homeOf is the home E2B's envd presents for sb: E2B's for a sandbox E2B's
// protocol created, the guest's own for one the Runtime API did.
func homeOf(sb *sandbox.Sandbox) string {
	if sb.Labels[templateLabel] != "" {
		return e2bHome
	}
	return ""
}

// tokenOwner authenticates a request for the sandbox and port by its
// token, under the API's rate limits, and returns the sandbox's owner.
// envd takes its access token only; any other port the traffic token or
// the access token. A token whose key was revoked, expired or rotated past
// the grace of the secret it was issued under is refused as a bad one is.
func (h *Handler) tokenOwner(r *http.Request, id string, port int) (string, error) {
	if err := h.authBlocked(r); err != nil {
		return "", err
	}
	owner, err := h.checkToken(r, id, port)
	if err != nil {
		if ae := (*apiError)(nil); errors.As(err, &ae) && ae.Code == http.StatusUnauthorized {
			h.authFailed(r)
		}
		return "", err
	}
	if err := h.allow(r, owner); err != nil {
		return "", err
	}
	return owner, nil
}

// checkToken opens the request's token (its MAC first, so a forged one
// costs no look-up) and checks its generation against the key's secrets.
func (h *Handler) checkToken(r *http.Request, id string, port int) (string, error) {
	tok, ok := h.openToken(r, id, port)
	if !ok {
		return "", newError(http.StatusUnauthorized,
			"missing or invalid access token for this sandbox: send the envdAccessToken of its create or connect answer in X-Access-Token")
	}
	gens, err := h.cfg.Keys.Generations(r.Context(), tok.owner)
	if err != nil {
		return "", fmt.Errorf("checking an access token of sandbox %s: %w", id, err)
	}
	if !h.cfg.Tokens.Current(tok, gens) {
		return "", newError(http.StatusUnauthorized,
			"access token no longer valid: the key it was issued to was revoked, expired or rotated; connect again with a current key")
	}
	return tok.owner, nil
}

// openToken finds a token of the request that opens the sandbox's port.
func (h *Handler) openToken(r *http.Request, id string, port int) (token, bool) {
	if tok := r.Header.Get(headerAccessToken); tok != "" {
		if t, ok := h.cfg.Tokens.Open(purposeEnvd, id, tok); ok {
			return t, true
		}
	}
	if port != EnvdPort {
		if tok := r.Header.Get(headerTraffic); tok != "" {
			return h.cfg.Tokens.Open(purposeTraffic, id, tok)
		}
	}
	return token{}, false
}

// targetHostSuffix marks the transport's dial addresses, <id>.sandbox:port,
// so pooled connections stay per sandbox and port.
const targetHostSuffix = ".sandbox"

func newPortTransport() *http.Transport {
	return &http.Transport{
		DialContext:            dialRouted,
		MaxIdleConnsPerHost:    4,
		IdleConnTimeout:        30 * time.Second,
		MaxResponseHeaderBytes: 64 << 10,
	}
}

// dialRouted connects to the port of the sandbox the request was routed to
// (the dial's context carries the request's values).
func dialRouted(ctx context.Context, _, addr string) (net.Conn, error) {
	host, p, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, err
	}
	id, ok := strings.CutSuffix(host, targetHostSuffix)
	rt, found := sandbox.RoutedFrom(ctx)
	if !ok || !found || rt.Sandbox.ID != id {
		return nil, errors.New("e2b: dial without its routed sandbox")
	}
	port, err := strconv.Atoi(p)
	if err != nil {
		return nil, err
	}
	return rt.Guest.DialPort(ctx, port)
}

// proxyPort proxies HTTP (and upgrades, so WebSockets) to a port inside the
// sandbox, without the credentials that reached us.
func (h *Handler) proxyPort(w http.ResponseWriter, r *http.Request, id string, port int) {
	proxy := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL.Scheme = "http"
			pr.Out.URL.Host = id + targetHostSuffix + ":" + strconv.Itoa(port)
			pr.Out.Host = "localhost:" + strconv.Itoa(port)
			pr.SetXForwarded()
			// No credential of ours reaches the guest, whoever it
			// belongs to; nor do the routing headers.
			api.StripCredentials(pr.Out)
			pr.Out.Header.Del(headerSandboxID)
			pr.Out.Header.Del(headerSandboxPort)
		},
		Transport: h.transport,
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			if errdefs.Code(err) == "port_refused" {
				writeError(w, newError(http.StatusBadGateway, fmt.Sprintf("nothing listens on port %d in sandbox %s", port, id)))
				return
			}
			h.log.Debug("e2b port proxy", "sandbox", id, "port", port, "err", err)
			writeError(w, newError(http.StatusBadGateway, fmt.Sprintf("port %d of sandbox %s: %v", port, id, err)))
		},
	}
	proxy.ServeHTTP(w, r)
}
