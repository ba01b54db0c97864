package envd

import (
	"context"
	"encoding/base64"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"connectrpc.com/connect"

	"github.com/emberbox/emberbox/internal/envd/proto/filesystem/filesystemconnect"
	"github.com/emberbox/emberbox/internal/envd/proto/process/processconnect"
	"github.com/emberbox/emberbox/internal/sandbox"
)

// maxRPCMessage bounds one Connect message a client sends (process input
// is the only large one; the SDKs send it in small pieces).
const maxRPCMessage = 8 << 20

// maxUserLen bounds a user's name (Linux's own bound is 32).
const maxUserLen = 64

// Server is E2B's envd API for the sandbox each request was routed to.
type Server struct {
	log      *slog.Logger
	mux      *http.ServeMux
	tags     *table[string]  // sandbox/tag → guest process id
	watchers *table[watcher] // sandbox/watcher id → its root and cursor
}

// New returns the envd API. It serves the Connect paths of the process
// and filesystem services, GET /health and GET or POST /files.
func New(logger *slog.Logger) *Server {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	s := &Server{
		log:      logger,
		mux:      http.NewServeMux(),
		tags:     newTable[string](maxTags),
		watchers: newTable[watcher](maxWatchers),
	}
	opts := []connect.HandlerOption{connect.WithReadMaxBytes(maxRPCMessage)}
	s.mux.Handle(processconnect.NewProcessHandler(&processService{s}, opts...))
	s.mux.Handle(filesystemconnect.NewFilesystemHandler(&filesystemService{s}, opts...))
	s.mux.HandleFunc("GET /health", func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusNoContent)
	})
	s.mux.HandleFunc("GET /files", s.download)
	s.mux.HandleFunc("POST /files", s.upload)
	// Everything else envd has (/metrics, /envs, /files/compose, and the
	// internal /init, /freeze, /upgrade… that E2B's own proxy refuses) is
	// not served: a clear answer in envd's error shape, never a bare 404.
	s.mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		httpError(w, http.StatusNotFound, r.Method+" "+r.URL.Path+" is not served by Emberbox's envd (see docs/e2b.md)")
	})
	return s
}

// ServeHTTP serves one request. Its streams (process output, watches,
// uploads) last as long as the client wants: the listener's deadlines,
// meant for the Runtime API's short calls, are lifted.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	rc := http.NewResponseController(w)
	_ = rc.SetReadDeadline(time.Time{})
	_ = rc.SetWriteDeadline(time.Time{})
	s.mux.ServeHTTP(w, r)
}

// target returns the sandbox the request was routed to.
func target(ctx context.Context) (sandbox.Routed, error) {
	rt, ok := sandbox.RoutedFrom(ctx)
	if !ok {
		return rt, connect.NewError(connect.CodeInternal, errNotRouted)
	}
	return rt, nil
}

// userFrom returns the user E2B's SDKs name in "Authorization: Basic
// base64(user:)", or "" (the sandbox's user) without one. The agent
// refuses names it has no account for.
func userFrom(h http.Header) (string, error) {
	v := h.Get("Authorization")
	if v == "" {
		return "", nil
	}
	scheme, cred, ok := strings.Cut(v, " ")
	if !ok || !strings.EqualFold(scheme, "Basic") {
		return "", connect.NewError(connect.CodeInvalidArgument, errBadUser)
	}
	b, err := base64.StdEncoding.DecodeString(strings.TrimSpace(cred))
	if err != nil || len(b) > maxUserLen+1 {
		return "", connect.NewError(connect.CodeInvalidArgument, errBadUser)
	}
	name, _, _ := strings.Cut(string(b), ":")
	return name, nil
}
