package e2b

import (
	"context"
	"log/slog"
	"math"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/emberbox/emberbox/internal/api"
	"github.com/emberbox/emberbox/internal/guest"
	"github.com/emberbox/emberbox/internal/sandbox"
)

// Ports of E2B's in-sandbox services.
const (
	EnvdPort        = 49983
	InterpreterPort = 49999
)

// Keys authenticates API keys and tells which of a key's secrets still
// authenticate, so that the tokens issued to a secret's caller end with
// that secret.
type Keys interface {
	// Authenticate returns the key whose secret this is, or an error of
	// class errdefs.ErrNotFound for an unknown, revoked or expired key.
	Authenticate(ctx context.Context, secret string) (api.Key, error)
	// Generations returns the generations (api.Key.Generation) of key
	// id's secrets that authenticate now: the current secret's and,
	// during a rotation's grace, the one before's. A revoked, expired or
	// unknown key has none.
	Generations(ctx context.Context, id string) ([]string, error)
}

// Manager is what E2B's protocol calls in the sandbox manager. Every
// method takes the caller's key id as owner, as api.Sandboxes' do. An
// api.NetworkManager among its abilities (found by type assertion) sets
// egress policies.
type Manager interface {
	Create(ctx context.Context, owner string, spec sandbox.CreateSpec) (*sandbox.Sandbox, error)
	Get(ctx context.Context, owner, id string) (*sandbox.Sandbox, error)
	List(ctx context.Context, opts sandbox.ListOptions) (sandboxes []*sandbox.Sandbox, nextCursor string, err error)
	// WaitFor blocks until the sandbox is in one of states, is in a
	// terminal state, or ctx ends.
	WaitFor(ctx context.Context, owner, id string, states ...sandbox.State) (*sandbox.Sandbox, error)
	Delete(ctx context.Context, owner, id string) (*sandbox.Sandbox, error)
	Extend(ctx context.Context, owner, id string, d time.Duration) (*sandbox.Sandbox, error)
	Update(ctx context.Context, owner, id string, u sandbox.UpdateSpec) (*sandbox.Sandbox, error)
	Pause(ctx context.Context, owner, id string) (*sandbox.Sandbox, error)
	// Wake resumes a paused sandbox; timeout, if not nil, is its new time
	// limit in seconds.
	Wake(ctx context.Context, owner, id string, timeout *int) (*sandbox.Sandbox, error)
	// Guest returns a running sandbox and its guest, or the coded refusal
	// of its state.
	Guest(ctx context.Context, owner, id string) (*sandbox.Sandbox, guest.Handle, error)
}

// Idempotency remembers the answers to creates sent with an
// Idempotency-Key, per API key (see api.Idempotency).
type Idempotency interface {
	// Reserve claims key for a request with this fingerprint: reserved
	// if it was free, else rec is the existing record.
	Reserve(ctx context.Context, keyID, key, fingerprint string) (rec *api.IdempotentResult, reserved bool, err error)
	Complete(ctx context.Context, keyID, key string, status int, contentType string, body []byte) error
	Release(ctx context.Context, keyID, key string) error
}

// Config configures the handler New returns.
type Config struct {
	Manager Manager // required
	Keys    Keys    // required
	Tokens  *Tokens // required
	// Network keeps egress policies (sandbox.Manager.Networks); nil means
	// Manager's own if it enforces them.
	Network api.NetworkManager
	// Limiter holds the API's rate buckets (api.Config.Limiter), so that
	// E2B's control plane and sandbox traffic count against the same
	// per-key and failed-authentication limits; nil: no limits.
	Limiter *api.RateLimiter
	// Idempotency makes a create sent with an Idempotency-Key run once;
	// nil runs every create.
	Idempotency Idempotency
	// Envd serves port 49983 (E2B's envd); Interpreter port 49999 (E2B's
	// code interpreter). Both read the target from sandbox.RoutedFrom.
	// Nil answers 502 on that port.
	Envd        http.Handler
	Interpreter http.Handler
	// EnvdVersion is reported as envdVersion: E2B's SDKs switch features
	// on by it.
	EnvdVersion string
	// Domain, if set, routes {port}-{sandboxID}.{Domain} host names as
	// sandbox traffic, and is reported to the SDKs as the sandbox domain.
	Domain string
	// Next serves every request that is not E2B's (the Runtime API).
	Next   http.Handler
	Logger *slog.Logger
	// CreateWait bounds how long a create or resume waits for the sandbox
	// to run (E2B's create answers a running sandbox); default 5 minutes.
	CreateWait time.Duration
}

// Handler is the E2B front of the server.
type Handler struct {
	cfg       Config
	log       *slog.Logger
	control   *http.ServeMux
	transport *http.Transport
}

// New returns the handler. It panics if a required field is nil.
func New(cfg Config) *Handler {
	if cfg.Manager == nil || cfg.Keys == nil || cfg.Tokens == nil || cfg.Next == nil {
		panic("e2b.New: Manager, Keys, Tokens and Next are required")
	}
	if cfg.CreateWait <= 0 {
		cfg.CreateWait = 5 * time.Minute
	}
	h := &Handler{cfg: cfg, log: cfg.Logger}
	if h.log == nil {
		h.log = slog.New(slog.DiscardHandler)
	}
	h.control = h.controlMux()
	h.transport = newPortTransport()
	return h
}

// ServeHTTP routes sandbox traffic, then E2B's control plane, then
// everything else to Next.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if id := r.Header.Get(headerSandboxID); id != "" {
		port := EnvdPort
		if p := r.Header.Get(headerSandboxPort); p != "" {
			n, err := strconv.Atoi(p)
			if err != nil || n < 1 || n > 65535 {
				writeError(w, newError(http.StatusBadRequest, "E2b-Sandbox-Port must be a port number"))
				return
			}
			port = n
		}
		h.serveSandbox(w, r, id, port)
		return
	}
	if id, port, ok := h.hostTarget(r.Host); ok {
		h.serveSandbox(w, r, id, port)
		return
	}
	if isControlPath(r.URL.Path) {
		h.control.ServeHTTP(w, r)
		return
	}
	h.cfg.Next.ServeHTTP(w, r)
}

// Target names the sandbox r is for, as a cluster routes it to the node
// that runs it: the sandbox of E2B sandbox traffic (headers or host name)
// or of a control-plane path (/sandboxes/{id}…, /v2/sandboxes/{id}…).
// create says r makes a sandbox (POST /sandboxes or /v2/sandboxes), which
// a cluster places. Nothing here is checked: the handler that serves r
// does that.
func (h *Handler) Target(r *http.Request) (id string, create bool) {
	if id := r.Header.Get(headerSandboxID); id != "" {
		return id, false
	}
	if id, _, ok := h.hostTarget(r.Host); ok {
		return id, false
	}
	for _, prefix := range []string{"/sandboxes", "/v2/sandboxes"} {
		rest, ok := strings.CutPrefix(r.URL.Path, prefix)
		if !ok {
			continue
		}
		if rest == "" || rest == "/" {
			return "", r.Method == http.MethodPost
		}
		if id, ok := strings.CutPrefix(rest, "/"); ok {
			id, _, _ = strings.Cut(id, "/")
			return id, false
		}
	}
	return "", false
}

// hostTarget parses {port}-{id}.{domain}.
func (h *Handler) hostTarget(host string) (id string, port int, ok bool) {
	if h.cfg.Domain == "" {
		return "", 0, false
	}
	if hh, _, err := net.SplitHostPort(host); err == nil {
		host = hh
	}
	label, found := strings.CutSuffix(strings.ToLower(host), "."+strings.ToLower(h.cfg.Domain))
	if !found || strings.Contains(label, ".") {
		return "", 0, false
	}
	p, id, found := strings.Cut(label, "-")
	if !found {
		return "", 0, false
	}
	n, err := strconv.Atoi(p)
	if err != nil || n < 1 || n > 65535 || id == "" {
		return "", 0, false
	}
	return id, n, true
}

// isControlPath says whether path is one of E2B's control-plane paths.
// None of them clash with the Runtime API's (/v1/…) or the server's own.
func isControlPath(path string) bool {
	for _, p := range []string{"/sandboxes", "/v2/sandboxes", "/templates", "/v2/templates", "/v3/templates", "/snapshots", "/volumes", "/secrets", "/teams", "/default-templates"} {
		if path == p || strings.HasPrefix(path, p+"/") {
			return true
		}
	}
	return false
}

// authBlocked refuses an address that has failed authentication too
// often, before its credentials cost a look-up.
func (h *Handler) authBlocked(r *http.Request) error {
	if h.cfg.Limiter == nil {
		return nil
	}
	if blocked, wait := h.cfg.Limiter.AuthBlocked(r); blocked {
		return errRateLimited(wait, "too many requests with invalid keys or tokens from this address; slow down")
	}
	return nil
}

// authFailed counts a failed authentication against r's address.
func (h *Handler) authFailed(r *http.Request) {
	if h.cfg.Limiter != nil {
		h.cfg.Limiter.AuthFailed(r)
	}
}

// allow counts an authenticated request against its key's bucket.
func (h *Handler) allow(r *http.Request, keyID string) error {
	if h.cfg.Limiter == nil {
		return nil
	}
	if ok, wait := h.cfg.Limiter.Allow(r, keyID); !ok {
		return errRateLimited(wait, "too many requests; slow down")
	}
	return nil
}

// errRateLimited is E2B's 429, with the wait in Retry-After.
func errRateLimited(wait time.Duration, msg string) *apiError {
	e := newError(http.StatusTooManyRequests, msg)
	e.ErrorCode = "rate_limited"
	e.retryAfter = max(1, int(math.Ceil(wait.Seconds())))
	return e
}
