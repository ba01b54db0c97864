package interpreter

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/emberbox/emberbox/internal/errdefs"
	"github.com/emberbox/emberbox/internal/sandbox"
)

// E2B's code-interpreter API (the server e2b_code_interpreter talks to on
// a sandbox's port 49999), over the same contexts as Runtime's routes.
// The sandbox is the one the router put in the request's context; the
// router has authenticated the request.

// maxE2BBody bounds a request body: code of at most MaxCode in JSON.
const maxE2BBody = 2*MaxCode + 64<<10

// e2bMIME names the MIME types e2b_code_interpreter's Result has fields
// for; the rest go to "extra".
var e2bMIME = map[string]string{
	"text/plain": "text", "text/html": "html", "text/markdown": "markdown", "image/svg+xml": "svg",
	"image/png": "png", "image/jpeg": "jpeg", "application/pdf": "pdf", "text/latex": "latex",
	"application/json": "json", "application/javascript": "javascript", "e2b/data": "data", "e2b/chart": "chart",
}

// E2BHandler serves E2B's code-interpreter API for the sandbox a request
// was routed to (sandbox.RoutedFrom).
func (s *Service) E2BHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `"OK"`)
	})
	mux.HandleFunc("POST /execute", s.e2bRouted(s.e2bExecute))
	mux.HandleFunc("POST /contexts", s.e2bRouted(s.e2bCreate))
	mux.HandleFunc("GET /contexts", s.e2bRouted(s.e2bList))
	mux.HandleFunc("DELETE /contexts/{id}", s.e2bRouted(s.e2bDelete))
	mux.HandleFunc("POST /contexts/{id}/restart", s.e2bRouted(s.e2bRestart))
	return mux
}

// e2bRouted hands h the routed sandbox, or refuses a request that has none.
func (s *Service) e2bRouted(h func(http.ResponseWriter, *http.Request, sandbox.Routed)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		rt, ok := sandbox.RoutedFrom(r.Context())
		if !ok {
			http.Error(w, "no sandbox was routed to this request", http.StatusBadGateway)
			return
		}
		h(w, r, rt)
	}
}

// e2bError answers err as E2B's server does: a status and a plain text body.
func e2bError(w http.ResponseWriter, err error) {
	status := http.StatusInternalServerError
	switch {
	case errors.Is(err, errdefs.ErrNotFound):
		status = http.StatusNotFound
	case errors.Is(err, errdefs.ErrInvalidArgument):
		status = http.StatusBadRequest
	case errors.Is(err, errdefs.ErrConflict):
		status = http.StatusConflict
	case errors.Is(err, errdefs.ErrUnavailable):
		status = http.StatusServiceUnavailable
	}
	http.Error(w, err.Error(), status)
}

// e2bDecode reads a JSON body (absent or empty: zero v).
func e2bDecode(w http.ResponseWriter, r *http.Request, v any) bool {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxE2BBody))
	if err != nil {
		http.Error(w, "the body is too large or was cut", http.StatusRequestEntityTooLarge)
		return false
	}
	if len(strings.TrimSpace(string(body))) == 0 {
		return true
	}
	if err := json.Unmarshal(body, v); err != nil {
		http.Error(w, "the body is not the JSON expected: "+err.Error(), http.StatusBadRequest)
		return false
	}
	return true
}

type e2bContext struct {
	ID       string `json:"id"`
	Language string `json:"language"`
	Cwd      string `json:"cwd"`
}

func toE2BContext(c ContextInfo) e2bContext {
	return e2bContext{ID: c.ID, Language: c.Language, Cwd: c.Cwd}
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func (s *Service) e2bCreate(w http.ResponseWriter, r *http.Request, rt sandbox.Routed) {
	var body struct {
		Language *string `json:"language"`
		Cwd      *string `json:"cwd"`
	}
	if !e2bDecode(w, r, &body) {
		return
	}
	req := CreateRequest{}
	if body.Language != nil {
		req.Language = *body.Language
	}
	if body.Cwd != nil {
		req.Cwd = *body.Cwd
	}
	info, err := s.Create(r.Context(), rt.Sandbox, rt.Guest, req)
	if err != nil {
		e2bError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, toE2BContext(info))
}

func (s *Service) e2bList(w http.ResponseWriter, r *http.Request, rt sandbox.Routed) {
	out := []e2bContext{}
	for _, c := range s.List(r.Context(), rt.Sandbox, rt.Guest) {
		out = append(out, toE2BContext(c))
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Service) e2bDelete(w http.ResponseWriter, r *http.Request, rt sandbox.Routed) {
	id := r.PathValue("id")
	if !s.Delete(r.Context(), rt.Sandbox, rt.Guest, id) {
		e2bError(w, notFound(id))
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Service) e2bRestart(w http.ResponseWriter, r *http.Request, rt sandbox.Routed) {
	if _, err := s.Restart(r.Context(), rt.Sandbox, rt.Guest, r.PathValue("id")); err != nil {
		e2bError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// e2bExecuteRequest is the body e2b_code_interpreter sends.
type e2bExecuteRequest struct {
	Code      *string           `json:"code"`
	ContextID *string           `json:"context_id"`
	Language  *string           `json:"language"`
	EnvVars   map[string]string `json:"env_vars"`
}

// e2bExecute runs a cell and streams its output as E2B's NDJSON lines:
// {"type":"stdout"|"stderr","text","timestamp"} (Unix ns),
// {"type":"result",...Result fields,"is_main_result","extra"},
// {"type":"error","name","value","traceback"},
// {"type":"number_of_executions","execution_count"}, and last
// {"type":"end_of_execution"}, which the client ignores.
func (s *Service) e2bExecute(w http.ResponseWriter, r *http.Request, rt sandbox.Routed) {
	var body e2bExecuteRequest
	if !e2bDecode(w, r, &body) {
		return
	}
	if body.Code == nil {
		http.Error(w, "code is required", http.StatusBadRequest)
		return
	}
	req := RunRequest{Code: *body.Code, Env: body.EnvVars}
	switch {
	case body.ContextID != nil && *body.ContextID != "":
		req.Context = *body.ContextID
	case body.Language != nil:
		req.Language = *body.Language
	}
	rc := http.NewResponseController(w)
	var mu sync.Mutex
	started := false
	begin := func() {
		if !started {
			started = true
			_ = rc.SetWriteDeadline(time.Time{}) // a cell may run for hours
			w.Header().Set("Content-Type", "application/x-ndjson")
			w.Header().Set("Cache-Control", "no-store")
			w.WriteHeader(http.StatusOK)
		}
	}
	line := func(v any) error {
		b, err := json.Marshal(v)
		if err != nil {
			return err
		}
		mu.Lock()
		defer mu.Unlock()
		begin()
		if _, err := w.Write(append(b, '\n')); err != nil {
			return err
		}
		return rc.Flush()
	}
	ex, err := s.Run(r.Context(), rt.Sandbox, rt.Guest, req, func(ev Event) error {
		return line(e2bLine(ev))
	})
	if err != nil {
		mu.Lock()
		defer mu.Unlock()
		if !started {
			e2bError(w, err)
		}
		return
	}
	if ex.Error == nil && ex.Status == StatusLost {
		_ = line(map[string]any{"type": "error", "name": "InterpreterLost",
			"value": "the interpreter ended during the execution (the sandbox stopped, or the kernel died)", "traceback": ""})
	}
	if ex.Truncated {
		_ = line(map[string]any{"type": "stderr", "text": fmt.Sprintf("[output past %d bytes was left out]\n", MaxOutput),
			"timestamp": time.Now().UnixNano()})
	}
	_ = line(map[string]string{"type": "end_of_execution"})
}

// e2bLine is one event as E2B's NDJSON line.
func e2bLine(ev Event) map[string]any {
	switch ev.Kind {
	case KindStdout, KindStderr:
		return map[string]any{"type": ev.Kind, "text": ev.Text, "timestamp": time.Now().UnixNano()}
	case KindError:
		return map[string]any{"type": "error", "name": ev.Error.Name, "value": ev.Error.Value, "traceback": ev.Error.Traceback}
	case KindCount:
		return map[string]any{"type": "number_of_executions", "execution_count": ev.Count}
	}
	return e2bResult(*ev.Result)
}

// e2bResult is a MIME bundle as E2B's result line.
func e2bResult(res Result) map[string]any {
	out := map[string]any{"type": "result", "is_main_result": res.Main}
	extra := map[string]json.RawMessage{}
	for mime, v := range res.Data {
		field, ok := e2bMIME[mime]
		if !ok {
			extra[mime] = v
			continue
		}
		if field == "text" {
			// E2B's server drops the quotes of a string's repr.
			var text string
			if json.Unmarshal(v, &text) == nil {
				if len(text) >= 2 && strings.HasPrefix(text, "'") && strings.HasSuffix(text, "'") {
					text = text[1 : len(text)-1]
				}
				out[field] = text
				continue
			}
		}
		out[field] = v
	}
	out["extra"] = extra
	return out
}
