package api

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"runtime/debug"
	"strings"
	"time"

	"github.com/emberbox/emberbox/internal/catalog"
	"github.com/emberbox/emberbox/internal/computer"
	"github.com/emberbox/emberbox/internal/errdefs"
	"github.com/emberbox/emberbox/internal/interpreter"
	"github.com/emberbox/emberbox/internal/links"
	"github.com/emberbox/emberbox/internal/secrets"
	"github.com/emberbox/emberbox/internal/volumes"
	"github.com/emberbox/emberbox/internal/webhook"
)

// Keys authenticates API keys.
type Keys interface {
	// Authenticate returns the key whose secret this is, or an error of
	// class errdefs.ErrNotFound for an unknown, revoked or expired key.
	Authenticate(ctx context.Context, secret string) (Key, error)
}

// Key is an authenticated API key.
type Key struct {
	ID   string
	Role string // RoleTenant or RoleAdmin
	// Generation names the secret that authenticated (a rotation makes a
	// new one); what is issued to the caller can be bound to it. "" if
	// the Keys does not tell.
	Generation string
}

// Roles of keys. A tenant key sees only its own sandboxes; an admin key
// may also list every key and every key's sandboxes.
const (
	RoleTenant = "tenant"
	RoleAdmin  = "admin"
)

// KeyInfo describes a key to GET /v1/keys.
type KeyInfo struct {
	ID        string
	Name      string
	Role      string
	CreatedAt time.Time
	ExpiresAt *time.Time
	RevokedAt *time.Time
}

// KeyLister is the optional capability of Keys to list every key, found by
// type assertion; without it GET /v1/keys answers 503.
type KeyLister interface {
	ListKeys(ctx context.Context) ([]KeyInfo, error)
}

// Idempotency remembers the answers to requests sent with an
// Idempotency-Key, per API key.
type Idempotency interface {
	// Reserve claims key for a request with this fingerprint. It returns
	// reserved=true if the key was free (the caller must later Complete or
	// Release it); otherwise rec is the existing record, whose Status is 0
	// while the first request is still running.
	Reserve(ctx context.Context, keyID, key, fingerprint string) (rec *IdempotentResult, reserved bool, err error)
	// Complete stores the answer of a reserved key.
	Complete(ctx context.Context, keyID, key string, status int, contentType string, body []byte) error
	// Release forgets a reserved key, so that a retry runs again.
	Release(ctx context.Context, keyID, key string) error
}

// IdempotentResult is a stored answer (or, with Status 0, a request still
// running).
type IdempotentResult struct {
	Fingerprint string
	Status      int
	ContentType string
	Body        []byte
	// SandboxID, with a Status and no Body, is a create cut short by a
	// crash after it recorded its sandbox: its answer is that sandbox, as
	// it is now.
	SandboxID string
	// Omitted, with a Status, is the size of an answer too large to keep:
	// the request ran and its answer cannot be replayed.
	Omitted int64
}

// Config configures the handler New returns.
type Config struct {
	Manager Manager // required
	Keys    Keys    // required
	// Idempotency stores answers for Idempotency-Key; nil accepts and
	// checks the header but remembers nothing.
	Idempotency Idempotency
	Logger      *slog.Logger // nil discards
	Version     string       // reported by /healthz and the OpenAPI info
	// Accel optionally reports the host's acceleration ("kvm" or "tcg"),
	// shown by /healthz and used for sandboxes that do not record theirs.
	Accel func() string
	// Confinement optionally reports how VMs are confined (the driver's
	// report, as JSON), shown by /healthz.
	Confinement func() any
	// Uploads stages chunked uploads (see NewUploads); whoever makes it
	// runs its Run, the periodic sweep. Nil refuses chunked uploads.
	Uploads *Uploads
	// Links signs and opens signed file links; nil refuses them.
	Links *links.Signer
	// Events serves GET /v1/sandboxes/{id}/events; nil lists none.
	Events Events
	// Metrics serves GET /metrics (Prometheus) to admin keys; nil: 404.
	Metrics http.Handler
	// RateLimits bound each caller's request rate; the zero value sets
	// no limit.
	RateLimits RateLimits
	// Limiter, if set, holds the buckets instead of new ones made from
	// RateLimits, so that another front on the listener (E2B's) counts
	// against the same ones.
	Limiter *RateLimiter
	// ObserveRequest, if set, is told of every answered request: route is
	// the route table's "METHOD /path" (a HEAD served by a GET route is
	// the GET route), or "unmatched" for a request no route served; status
	// is the HTTP status sent. It runs on the request's goroutine after
	// the answer, so it must be quick.
	ObserveRequest func(route string, status int, d time.Duration)
	// PreviewDomain is where previews are served, each on its own host
	// <port>-<sandbox id>.<domain>: a domain (https), or a URL with a
	// scheme and port (http://preview.test:8080); "" is localhost over
	// http on the port of the request (PreviewDomainName checks it).
	PreviewDomain string
	// Interpreter runs the code interpreter's routes; nil answers them
	// 501 interpreter_unavailable.
	Interpreter *interpreter.Service
	// Computer runs sandboxes' browsers; nil answers their routes 501
	// browser_unavailable.
	Computer *computer.Service
	// Volumes serves /v1/volumes; nil answers them 501
	// volumes_unavailable.
	Volumes *volumes.Service
	// Images is the image catalog (/v1/images, a create's image and the
	// start report of a sandbox); nil answers its routes 501.
	Images *catalog.Service
	// Nodes serves /v1/nodes on a node of a cluster; nil (a server of
	// its own) answers them 409 not_clustered.
	Nodes Nodes
	// Webhooks serves /v1/webhooks, their deliveries and /v1/events; nil
	// answers them 501.
	Webhooks *webhook.Service
	// Secrets serves /v1/egress-secrets; nil answers them 501.
	Secrets *secrets.Service
	// EgressCAs serves /v1/egress-ca; nil answers it 501.
	EgressCAs EgressCAs
}

// Limits of the waits a request may ask for.
const (
	maxPreferWait       = 120 * time.Second
	defaultWaitForState = 60 * time.Second
	idemPollInterval    = 100 * time.Millisecond
	idemPollMax         = 60 * time.Second
)

type server struct {
	events    Events
	mgr       Manager
	keys      Keys
	idem      Idempotency
	log       *slog.Logger
	version   string
	accel     func() string
	confine   func() any
	uploads   *Uploads // nil: chunked uploads refused
	links     *links.Signer
	interp    *interpreter.Service // nil: the interpreter routes answer 501
	computer  *computer.Service    // nil: the browser routes answer 501
	vols      *volumes.Service     // nil: the volume routes answer 501
	webhooks  *webhook.Service     // nil: webhooks and the feed answer 501
	secrets   *secrets.Service     // nil: egress secrets answer 501
	egressCAs EgressCAs            // nil: the egress CA routes answer 501
	images    *catalog.Service     // nil: the image routes answer 501
	nodes     Nodes                // nil: not a node of a cluster
	metrics   http.Handler
	limits    *rateLimiter
	observe   func(route string, status int, d time.Duration) // nil: none
	// terminals counts open terminal sockets per sandbox.
	terminals terminalSlots

	previewDomain    previewDomain
	previewTransport *http.Transport
	previewConns     connSet

	routes  []route
	mux     *http.ServeMux
	openapi []byte

	// Tests shorten these.
	idemPoll    time.Duration
	idemPollMax time.Duration
	now         func() time.Time
}

// New returns the API handler. It panics if a role of Manager or Keys is
// nil.
func New(cfg Config) http.Handler {
	return newServer(cfg)
}

// Previews serves the hosts of previews; it shares their connections
// with the API handler NewWithPreviews made with it.
type Previews struct{ s *server }

// NewWithPreviews returns the API handler and the previews' handler. The
// API's host refuses previews; what serves the listener sends every
// request whose host Previews.Target names to Previews, and no other.
func NewWithPreviews(cfg Config) (http.Handler, Previews) {
	s := newServer(cfg)
	return s, Previews{s: s}
}

// Target says whether r is for a preview's host: below the preview
// domain at all (ok), and the sandbox it names if it is one's exactly
// (a cluster routes it to that sandbox's node).
func (p Previews) Target(r *http.Request) (sandboxID string, ok bool) {
	id, _, under, _ := p.s.previewDomain.parseHost(r.Host)
	return id, under
}

// ServeHTTP serves a request for a preview's host.
func (p Previews) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	p.s.serve(w, r, http.HandlerFunc(previewHost{p.s}.servePreviewHost))
}

func newServer(cfg Config) *server {
	if !cfg.Manager.complete() || cfg.Keys == nil {
		panic("api.New: Manager and Keys are required")
	}
	s := &server{
		mgr: cfg.Manager, keys: cfg.Keys, idem: cfg.Idempotency, log: cfg.Logger,
		version: cfg.Version, accel: cfg.Accel, confine: cfg.Confinement, events: cfg.Events,
		idemPoll: idemPollInterval, idemPollMax: idemPollMax, now: time.Now,
		limits: newRateLimiter(cfg.RateLimits), observe: cfg.ObserveRequest,
	}
	if cfg.Limiter != nil {
		s.limits = cfg.Limiter.l
	}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	s.uploads, s.metrics, s.links, s.interp = cfg.Uploads, cfg.Metrics, cfg.Links, cfg.Interpreter
	s.computer = cfg.Computer
	s.vols = cfg.Volumes
	s.webhooks = cfg.Webhooks
	s.secrets = cfg.Secrets
	s.egressCAs = cfg.EgressCAs
	s.nodes = cfg.Nodes
	s.images = cfg.Images
	pd, err := parsePreviewDomain(cfg.PreviewDomain)
	if err != nil {
		panic("api.New: " + err.Error())
	}
	s.previewDomain = pd
	s.previewTransport = previewHost{s}.newPreviewTransport()
	s.routes = s.routeTable()
	s.mux = s.buildMux()
	doc, err := json.Marshal(s.openAPI())
	if err != nil {
		panic("api.New: openapi document: " + err.Error())
	}
	s.openapi = doc
	return s
}

type ctxKey int

const reqInfoKey ctxKey = 0

// reqInfo is what ServeHTTP keeps about a request in its context.
type reqInfo struct {
	id string
	// route is the table route that served the request, set by its group:
	// ServeHTTP sees only the outer request, and the mux pattern alone
	// would not tell the colon verbs of one path apart.
	route string
}

func requestID(ctx context.Context) string {
	if ri, ok := ctx.Value(reqInfoKey).(*reqInfo); ok {
		return ri.id
	}
	return ""
}

// setRoute records rt as the route serving r, for ObserveRequest.
func setRoute(r *http.Request, rt *route) {
	if ri, ok := r.Context().Value(reqInfoKey).(*reqInfo); ok {
		ri.route = rt.Method + " " + rt.Path
	}
}

// unmatchedRoute is the route label of a request no route served.
const unmatchedRoute = "unmatched"

func newRequestID() string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return "req_" + hex.EncodeToString(b[:])
}

// ServeHTTP implements http.Handler for the API's routes.
func (s *server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.serve(w, r, s.mux)
}

// serve names the request, recovers panics into 500 answers, logs every
// request and reports it to ObserveRequest, around h.
func (s *server) serve(w http.ResponseWriter, r *http.Request, h http.Handler) {
	start := time.Now()
	rid := newRequestID() // never the caller's: ours are unique and safe to log
	w.Header().Set("x-request-id", rid)
	ri := &reqInfo{id: rid}
	r = r.WithContext(context.WithValue(r.Context(), reqInfoKey, ri))
	sw := &statusWriter{ResponseWriter: w}
	defer func() {
		if p := recover(); p != nil {
			if p == http.ErrAbortHandler {
				panic(p)
			}
			s.log.LogAttrs(r.Context(), slog.LevelError, "panic serving request",
				slog.String("request_id", rid), slog.String("method", r.Method),
				slog.String("path", r.URL.Path), slog.Any("panic", p),
				slog.String("stack", string(debug.Stack())))
			if !sw.wrote {
				s.writeError(sw, r, newError(http.StatusInternalServerError, "internal", "Internal error."))
			}
		}
		d := time.Since(start)
		s.log.LogAttrs(r.Context(), slog.LevelDebug, "request",
			slog.String("request_id", rid), slog.String("method", r.Method),
			slog.String("path", r.URL.Path), slog.Int("status", sw.status),
			slog.Duration("duration", d))
		if s.observe != nil {
			route, status := ri.route, sw.status
			if route == "" {
				route = unmatchedRoute
			}
			if !sw.wrote {
				status = http.StatusOK // what net/http sends for a handler that wrote nothing
			}
			s.observe(route, status, d)
		}
	}()
	h.ServeHTTP(sw, r)
}

// statusWriter remembers the status sent.
type statusWriter struct {
	http.ResponseWriter
	status int
	wrote  bool
}

func (w *statusWriter) WriteHeader(code int) {
	if !w.wrote {
		w.wrote, w.status = true, code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(p []byte) (int, error) {
	if !w.wrote {
		w.WriteHeader(http.StatusOK)
	}
	return w.ResponseWriter.Write(p)
}

// Unwrap lets http.ResponseController reach the connection's writer.
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// Written reports whether the status line has gone out.
func (w *statusWriter) Written() bool { return w.wrote }

// written reports whether w has sent its status line.
func written(w http.ResponseWriter) bool {
	if ww, ok := w.(interface{ Written() bool }); ok {
		return ww.Written()
	}
	return false
}

// call is what a handler knows about its request beyond *http.Request.
type call struct {
	owner string // the authenticated key id
	role  string // the key's role
	body  []byte // the whole request body (at most maxBody bytes)
}

type handlerFunc func(w http.ResponseWriter, r *http.Request, c *call) error

// serveRoute runs rt for r: authentication and rate limits, body,
// idempotency, handler.
func (s *server) serveRoute(w http.ResponseWriter, r *http.Request, rt *route) {
	c := &call{}
	if err := s.gate(r, rt, c); err != nil {
		s.writeError(w, r, err)
		return
	}
	if r.Method != http.MethodGet && r.Method != http.MethodHead && r.Body != nil && !rt.StreamBody {
		limit := int64(maxBody)
		if rt.MaxBody > 0 {
			limit = rt.MaxBody
		}
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, limit))
		if err != nil {
			var mbe *http.MaxBytesError
			if errors.As(err, &mbe) {
				what := "The request body"
				if rt.RawBody {
					what = "The file"
				}
				s.writeError(w, r, errTooLarge(what))
				return
			}
			s.writeError(w, r, newError(http.StatusBadRequest, "invalid_request", "The request body could not be read."))
			return
		}
		c.body = body
	}
	run := func(w http.ResponseWriter) {
		if err := rt.handle(w, r, c); err != nil {
			if written(w) {
				s.log.LogAttrs(r.Context(), slog.LevelWarn, "error after the answer started",
					slog.String("request_id", requestID(r.Context())), slog.Any("err", err))
				return
			}
			s.writeError(w, r, err)
		}
	}
	if key := r.Header.Get("Idempotency-Key"); key != "" && r.Method != http.MethodGet && r.Method != http.MethodHead && !rt.StreamBody {
		s.idempotent(w, r, c, key, run)
		return
	}
	run(w)
}

func (s *server) authenticate(r *http.Request) (Key, error) {
	unauthorized := newError(http.StatusUnauthorized, "unauthorized", "A valid API key is required.").
		withHint("Send the header Authorization: Bearer <key> with a key this server issued.")
	scheme, secret, ok := strings.Cut(r.Header.Get("Authorization"), " ")
	secret = strings.TrimSpace(secret)
	if !ok || !strings.EqualFold(scheme, "Bearer") || secret == "" {
		// A browser's WebSocket cannot send Authorization; it offers
		// the key as a subprotocol instead (websocket_auth.go).
		if secret, ok = webSocketKey(r); !ok {
			return Key{}, unauthorized
		}
	}
	key, err := s.keys.Authenticate(r.Context(), secret)
	if err != nil {
		if errdefs.IsNotFound(err) {
			// Whoever holds the secret may learn that it expired or was
			// revoked; nobody else learns anything.
			switch errdefs.Code(err) {
			case "key_expired":
				unauthorized.Message = "This API key has expired."
			case "key_revoked":
				unauthorized.Message = "This API key was revoked."
			}
			return Key{}, unauthorized
		}
		return Key{}, err
	}
	return key, nil
}

// writeJSON sends v as JSON with status.
func writeJSON(w http.ResponseWriter, status int, v any) {
	body, err := json.Marshal(v)
	if err != nil {
		// Only a programming error gets here; the types are ours.
		body = []byte(`{"error":{"code":"internal","status":500,"message":"Internal error.","hint":""}}`)
		status = http.StatusInternalServerError
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(append(body, '\n'))
}
