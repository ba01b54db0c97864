package api

import (
	"encoding/json"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/emberbox/emberbox/internal/guest"
	"github.com/emberbox/emberbox/internal/interpreter"
	"github.com/emberbox/emberbox/internal/sandbox"
)

// The code interpreter (withruntime's sbx.interpreter): stateful Python
// kernels per context, served by interpreter.Service.

const (
	defaultInterpreterTimeoutMs = 60_000
	maxRunBody                  = 2*interpreter.MaxCode + 64<<10
)

// runRequest is the body of POST …/interpreter:run.
type runRequest struct {
	Code                  *string `json:"code"`
	Language              string  `json:"language"`
	Context               string  `json:"context"`
	TimeoutMs             *int64  `json:"timeoutMs"` // 0: none; default 60000
	Stream                bool    `json:"stream"`
	InterruptOnDisconnect *bool   `json:"interruptOnDisconnect"` // default true
}

// contextRequest is the body of POST …/interpreter/contexts.
type contextRequest struct {
	ID       string            `json:"id"`
	Language string            `json:"language"`
	Cwd      string            `json:"cwd"`
	Env      map[string]string `json:"env"`
}

// resultJSON is one MIME bundle; refs is always empty: every result is
// sent inline.
type resultJSON struct {
	Main bool                       `json:"main"`
	Data map[string]json.RawMessage `json:"data"`
	Refs map[string]any             `json:"refs"`
}

type execErrorJSON struct {
	Name      string `json:"name"`
	Value     string `json:"value"`
	Traceback string `json:"traceback"`
}

// executionJSON is a finished execution.
type executionJSON struct {
	Status         string         `json:"status"` // ok, error, timeout, interrupted, lost
	Context        string         `json:"context"`
	Stdout         string         `json:"stdout"`
	Stderr         string         `json:"stderr"`
	Results        []resultJSON   `json:"results"`
	Error          *execErrorJSON `json:"error"`
	ExecutionCount int            `json:"executionCount"`
	DurationMs     int64          `json:"durationMs"`
	Truncated      bool           `json:"truncated"`
}

type contextJSON struct {
	ID        string   `json:"id"`
	Language  string   `json:"language"`
	Cwd       string   `json:"cwd"`
	EnvNames  []string `json:"envNames"`
	CreatedAt string   `json:"createdAt"`
	Running   bool     `json:"running"`
}

func toContextJSON(c interpreter.ContextInfo) contextJSON {
	names := c.EnvNames
	if names == nil {
		names = []string{}
	}
	return contextJSON{ID: c.ID, Language: c.Language, Cwd: c.Cwd, EnvNames: names,
		CreatedAt: c.Created.UTC().Format(time.RFC3339Nano), Running: c.Running}
}

func toResultJSON(r interpreter.Result) resultJSON {
	return resultJSON{Main: r.Main, Data: r.Data, Refs: map[string]any{}}
}

func toExecutionJSON(ex *interpreter.Execution) executionJSON {
	out := executionJSON{Status: ex.Status, Context: ex.Context, Stdout: ex.Stdout, Stderr: ex.Stderr,
		Results: []resultJSON{}, ExecutionCount: ex.ExecutionCount, DurationMs: ex.Duration.Milliseconds(),
		Truncated: ex.Truncated}
	for _, r := range ex.Results {
		out.Results = append(out.Results, toResultJSON(r))
	}
	if ex.Error != nil {
		out.Error = &execErrorJSON{Name: ex.Error.Name, Value: ex.Error.Value, Traceback: ex.Error.Traceback}
	}
	return out
}

// interpGuest is guest for the interpreter's routes, which a server built
// without an interpreter refuses (once the sandbox's state would not).
func (s interpreterAPI) interpGuest(r *http.Request, c *call) (*sandbox.Sandbox, guest.Handle, error) {
	sb, g, err := s.guest(r, c)
	if err != nil {
		return nil, guest.Handle{}, err
	}
	if s.interp == nil {
		return nil, guest.Handle{}, newError(http.StatusNotImplemented, "interpreter_unavailable", "This server has no code interpreter.")
	}
	return sb, g, nil
}

func (s interpreterAPI) run(w http.ResponseWriter, r *http.Request, c *call) error {
	var body runRequest
	if err := decode(c, &body); err != nil {
		return err
	}
	var issues []issue
	if body.Code == nil {
		issues = append(issues, issue{Path: "code", Message: "is required"})
	}
	if body.TimeoutMs != nil && (*body.TimeoutMs < 0 || *body.TimeoutMs > maxExecTimeoutMs) {
		issues = append(issues, issue{Path: "timeoutMs", Message: fmt.Sprintf("must be from 0 (none) to %d", maxExecTimeoutMs)})
	}
	if len(issues) > 0 {
		return invalid(issues)
	}
	timeoutMs := int64(defaultInterpreterTimeoutMs)
	if body.TimeoutMs != nil {
		timeoutMs = *body.TimeoutMs
	}
	req := interpreter.RunRequest{Code: *body.Code, Language: body.Language, Context: body.Context,
		Timeout:          time.Duration(timeoutMs) * time.Millisecond,
		KeepOnDisconnect: body.InterruptOnDisconnect != nil && !*body.InterruptOnDisconnect}
	sb, g, err := s.interpGuest(r, c)
	if err != nil {
		return err
	}
	if !body.Stream {
		ex, err := s.interp.Run(r.Context(), sb, g, req, nil)
		return reply(w, ex, err, toExecutionJSON)
	}
	st := newLineStream(w)
	ex, err := s.interp.Run(r.Context(), sb, g, req, func(ev interpreter.Event) error {
		switch ev.Kind {
		case interpreter.KindStdout, interpreter.KindStderr:
			return st.line(map[string]any{"k": ev.Kind, "text": ev.Text})
		case interpreter.KindResult:
			res := toResultJSON(*ev.Result)
			return st.line(map[string]any{"k": "result", "main": res.Main, "data": res.Data, "refs": res.Refs})
		case interpreter.KindError:
			return st.line(map[string]any{"k": "error", "name": ev.Error.Name, "value": ev.Error.Value,
				"traceback": ev.Error.Traceback})
		}
		return nil
	})
	if err != nil {
		if !st.begun() {
			return err
		}
		ae := toAPIError(err)
		_ = st.line(map[string]any{"k": "failure", "code": ae.Code, "status": ae.Status, "message": ae.Message,
			"hint": ae.Hint, "requestId": requestID(r.Context())})
		return nil
	}
	_ = st.line(map[string]any{"k": "execution", "execution": toExecutionJSON(ex)})
	return nil
}

func (s interpreterAPI) listContexts(w http.ResponseWriter, r *http.Request, c *call) error {
	sb, g, err := s.interpGuest(r, c)
	if err != nil {
		return err
	}
	out := []contextJSON{}
	for _, ci := range s.interp.List(r.Context(), sb, g) {
		out = append(out, toContextJSON(ci))
	}
	writeJSON(w, http.StatusOK, map[string]any{"data": out})
	return nil
}

func (s interpreterAPI) createContext(w http.ResponseWriter, r *http.Request, c *call) error {
	body, err := decodeChecked(c, func(body *contextRequest) []issue { return envIssues("env", body.Env) })
	if err != nil {
		return err
	}
	sb, g, err := s.interpGuest(r, c)
	if err != nil {
		return err
	}
	ci, err := s.interp.Create(r.Context(), sb, g, interpreter.CreateRequest{ID: body.ID, Language: body.Language,
		Cwd: body.Cwd, Env: body.Env})
	return reply(w, ci, err, toContextJSON)
}

func (s interpreterAPI) restartContext(w http.ResponseWriter, r *http.Request, c *call) error {
	sb, g, err := s.interpGuest(r, c)
	if err != nil {
		return err
	}
	ci, err := s.interp.Restart(r.Context(), sb, g, r.PathValue("ctx"))
	return reply(w, ci, err, toContextJSON)
}

func (s interpreterAPI) interruptContext(w http.ResponseWriter, r *http.Request, c *call) error {
	sb, _, err := s.interpGuest(r, c)
	if err != nil {
		return err
	}
	ok, err := s.interp.Interrupt(sb.ID, r.PathValue("ctx"))
	return reply(w, ok, err, func(ok bool) map[string]bool { return map[string]bool{"interrupted": ok} })
}

func (s interpreterAPI) deleteContext(w http.ResponseWriter, r *http.Request, c *call) error {
	sb, g, err := s.interpGuest(r, c)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, map[string]bool{"deleted": s.interp.Delete(r.Context(), sb, g, r.PathValue("ctx"))})
	return nil
}

// result answers a result too large to go inline; this server
// sends every result inline, so there are none.
func (s interpreterAPI) result(w http.ResponseWriter, r *http.Request, c *call) error {
	if _, _, err := s.interpGuest(r, c); err != nil {
		return err
	}
	return newError(http.StatusNotFound, "result_not_found", "No interpreter result "+r.PathValue("name")+".").
		withHint("This server sends every result inline, in the execution's results.")
}

// lineStream writes NDJSON lines, sending the headers with the first.
type lineStream struct {
	w       http.ResponseWriter
	rc      *http.ResponseController
	mu      sync.Mutex
	started bool
}

func newLineStream(w http.ResponseWriter) *lineStream {
	return &lineStream{w: w, rc: http.NewResponseController(w)}
}

func (l *lineStream) begun() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.started
}

func (l *lineStream) line(v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.started {
		l.started = true
		_ = l.rc.SetWriteDeadline(time.Time{}) // a cell may run for hours
		l.w.Header().Set("Content-Type", "application/x-ndjson")
		l.w.Header().Set("Cache-Control", "no-store")
		l.w.Header().Set("X-Accel-Buffering", "no")
		l.w.WriteHeader(http.StatusOK)
	}
	if _, err := l.w.Write(append(b, '\n')); err != nil {
		return err
	}
	return l.rc.Flush()
}
