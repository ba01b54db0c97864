package api

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/emberbox/emberbox/internal/guest"
	"github.com/emberbox/emberbox/internal/sandbox"
)

// Exec limits.
const (
	defaultExecTimeoutMs = 60_000
	maxExecTimeoutMs     = 24 * 3600 * 1000
	shortOutputCap       = 64 << 10 // per stream, for timeoutMs <= 60 s
	longOutputCap        = 1 << 20  // per stream, for longer commands
	maxOutputWaitMs      = 60_000
)

// execRequest is the body of POST …:exec.
type execRequest struct {
	Command     *string           `json:"command"`
	Argv        []string          `json:"argv"`
	Cwd         string            `json:"cwd"`
	Env         map[string]string `json:"env"`
	Stdin       *string           `json:"stdin"`
	StdinBase64 *string           `json:"stdinBase64"`
	TimeoutMs   *int64            `json:"timeoutMs"`
	Stream      bool              `json:"stream"`
	User        string            `json:"user"`
	TraceFiles  bool              `json:"traceFiles"` // accepted; no file trace is reported
}

// spawnRequest is the body of POST …/processes.
type spawnRequest struct {
	Command        *string           `json:"command"`
	Argv           []string          `json:"argv"`
	Cwd            string            `json:"cwd"`
	Env            map[string]string `json:"env"`
	Stdin          *string           `json:"stdin"`
	StdinBase64    *string           `json:"stdinBase64"`
	TimeoutMs      *int64            `json:"timeoutMs"`
	User           string            `json:"user"`
	OutputEncoding string            `json:"outputEncoding"`
	StdinMode      string            `json:"stdinMode"`
	Pty            *ptyJSON          `json:"pty"`
	TraceFiles     bool              `json:"traceFiles"` // accepted; no file trace is reported
}

// commandFields validates what exec and spawn share and fills req.
func commandFields(command *string, argv []string, cwd string, env map[string]string,
	stdin, stdinB64 *string, timeoutMs *int64, user string, req *guest.ExecRequest) []issue {
	var issues []issue
	switch {
	case command != nil && argv != nil:
		issues = append(issues, issue{Path: "command", Message: "give command or argv, not both"})
	case command == nil && argv == nil:
		issues = append(issues, issue{Path: "command", Message: "command or argv is required"})
	case command != nil && strings.TrimSpace(*command) == "":
		issues = append(issues, issue{Path: "command", Message: "must not be empty"})
	case argv != nil && (len(argv) == 0 || argv[0] == ""):
		issues = append(issues, issue{Path: "argv", Message: "must name a program"})
	}
	if command != nil {
		req.Command = *command
	}
	req.Argv, req.Cwd, req.Env = argv, cwd, env
	issues = append(issues, envIssues("env", env)...)
	issues = append(issues, stdinFields(stdin, stdinB64, req)...)
	if timeoutMs != nil && (*timeoutMs < 1 || *timeoutMs > maxExecTimeoutMs) {
		issues = append(issues, issue{Path: "timeoutMs", Message: fmt.Sprintf("must be from 1 to %d", maxExecTimeoutMs)})
	}
	switch user {
	case "", "root":
		req.User = user
	case "sandbox", "user": // withruntime says "sandbox"; the agent says "user"
		req.User = "user"
	default:
		issues = append(issues, issue{Path: "user", Message: `must be "sandbox" or "root"`})
	}
	return issues
}

// stdinFields checks a command's input, as text or base64, and fills
// req.Stdin.
func stdinFields(stdin, stdinB64 *string, req *guest.ExecRequest) []issue {
	var issues []issue
	switch {
	case stdin != nil && stdinB64 != nil:
		issues = append(issues, issue{Path: "stdin", Message: "give stdin or stdinBase64, not both"})
	case stdin != nil:
		req.Stdin = []byte(*stdin)
	case stdinB64 != nil:
		b, err := base64.StdEncoding.DecodeString(*stdinB64)
		if err != nil {
			issues = append(issues, issue{Path: "stdinBase64", Message: "must be standard base64"})
		}
		req.Stdin = b
	}
	if len(req.Stdin) > maxBody {
		issues = append(issues, issue{Path: "stdin", Message: "must be at most 1 MiB"})
	}
	return issues
}

// guest returns the sandbox named by the path and its guest, or the
// refusal of its state.
func (s *server) guest(r *http.Request, c *call) (*sandbox.Sandbox, guest.Handle, error) {
	return s.mgr.Guest(r.Context(), c.owner, r.PathValue("id"))
}

// execTimeout decides the timeout of a command, in ms, against the lease.
//
// Without an explicit timeout it is min(60 s, lease left). An explicit one
// longer than the lease is refused with time_limit_too_short, except on a
// stream: withruntime sends 86,400,000 (24 h) on every streamed exec that
// names no timeout (STREAMED_EXEC_TIMEOUT_MS; the Go SDK does the same), so a
// refusal would break every streamed exec. There the timeout is clamped to
// the lease instead, which ends the command no later than the sandbox would.
func (s processes) execTimeout(sb *sandbox.Sandbox, asked *int64, stream bool) (int64, error) {
	left := int64(-1) // no lease
	if sb.ExpiresAt != nil {
		left = sb.ExpiresAt.Sub(s.now()).Milliseconds()
	}
	if asked == nil {
		if left < 0 {
			return defaultExecTimeoutMs, nil
		}
		if left < 1000 {
			return 0, timeLimitTooShort(left)
		}
		return min(defaultExecTimeoutMs, left), nil
	}
	t := *asked
	if left >= 0 && t > left {
		if stream && left >= 1000 {
			return left, nil
		}
		return 0, timeLimitTooShort(left)
	}
	return t, nil
}

func timeLimitTooShort(leftMs int64) *apiError {
	secs := max(leftMs/1000, 0)
	return &apiError{Status: http.StatusConflict, Code: "time_limit_too_short",
		Message: fmt.Sprintf("The sandbox's lease ends in %d s, before this command's timeout.", secs),
		Hint:    "Extend the lease with POST /v1/sandboxes/{id}:extend, or ask for a shorter timeoutMs.",
		Details: map[string]any{"secondsLeft": secs}}
}

// execResultJSON is the JSON answer of a command.
type execResultJSON struct {
	ExitCode        *int   `json:"exitCode"`
	Stdout          string `json:"stdout"`
	Stderr          string `json:"stderr"`
	TimedOut        bool   `json:"timedOut"`
	StdoutTruncated bool   `json:"stdoutTruncated"`
	StderrTruncated bool   `json:"stderrTruncated"`
	DurationMs      int64  `json:"durationMs"`
	ProcessID       string `json:"processId"`
}

func (s processes) exec(w http.ResponseWriter, r *http.Request, c *call) error {
	var body execRequest
	if err := decode(c, &body); err != nil {
		return err
	}
	var req guest.ExecRequest
	if issues := commandFields(body.Command, body.Argv, body.Cwd, body.Env, body.Stdin, body.StdinBase64,
		body.TimeoutMs, body.User, &req); len(issues) > 0 {
		return invalid(sortIssues(issues))
	}
	sb, g, err := s.guest(r, c)
	if err != nil {
		return err
	}
	if req.TimeoutMs, err = s.execTimeout(sb, body.TimeoutMs, body.Stream); err != nil {
		return err
	}
	req.MaxOutput = shortOutputCap
	if req.TimeoutMs > defaultExecTimeoutMs {
		req.MaxOutput = longOutputCap
	}
	req.Stream = body.Stream
	if body.Stream {
		s.streamEvents(w, r, false, func(send func(guest.Event) error) error {
			_, err := g.Exec(r.Context(), req, send)
			return err
		})
		return nil
	}
	res, err := g.Exec(r.Context(), req, nil)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, execResultJSON{
		ExitCode: res.ExitCode, Stdout: text(res.Stdout), Stderr: text(res.Stderr),
		TimedOut: res.TimedOut, StdoutTruncated: res.StdoutTruncated, StderrTruncated: res.StderrTruncated,
		DurationMs: res.DurationMs, ProcessID: res.ProcessID,
	})
	return nil
}

// text is output as a string, invalid UTF-8 replaced by U+FFFD (the JSON
// answer has no byte form; streams and base64 processes carry exact bytes).
func text(b []byte) string { return strings.ToValidUTF8(string(b), "\uFFFD") }

// eventJSON is one NDJSON line of a stream.
type eventJSON struct {
	Type         string     `json:"type"`
	ProcessID    string     `json:"processId,omitempty"`
	Data         *string    `json:"data,omitempty"`
	Base64       string     `json:"base64,omitempty"`
	Offset       *int64     `json:"offset,omitempty"`
	DroppedBytes int64      `json:"droppedBytes,omitempty"`
	ResumeAt     *int64     `json:"resumeAt,omitempty"`
	ExitCode     *int       `json:"exitCode,omitempty"`
	State        string     `json:"state,omitempty"`
	TimedOut     *bool      `json:"timedOut,omitempty"`
	DurationMs   *int64     `json:"durationMs,omitempty"`
	Error        *errorJSON `json:"error,omitempty"`
}

// wireEvent converts an agent event. A chunk of output carries "data" as
// text; a chunk that is not valid UTF-8, or any chunk with binary (a
// process spawned with outputEncoding base64), also carries its exact
// bytes as "base64", which withruntime's cursor uses to count bytes
// ("base64" holds the data, not a flag).
func wireEvent(ev guest.Event, binary bool) (eventJSON, bool) {
	off := ev.Offset
	switch ev.Type {
	case "start":
		return eventJSON{Type: "start", ProcessID: ev.ProcessID}, true
	case guest.EventStdout, guest.EventStderr:
		data := text(ev.Data)
		out := eventJSON{Type: ev.Type, Data: &data, Offset: &off}
		if binary || !utf8.Valid(ev.Data) {
			out.Base64 = base64.StdEncoding.EncodeToString(ev.Data)
		}
		return out, true
	case "truncated":
		return eventJSON{Type: "truncated", DroppedBytes: ev.Dropped, ResumeAt: &off}, true
	case "exit":
		out := eventJSON{Type: "exit"}
		if ev.Exit != nil {
			timedOut, dur := ev.Exit.TimedOut, ev.Exit.DurationMs
			out.ExitCode, out.State, out.TimedOut, out.DurationMs = ev.Exit.ExitCode, ev.Exit.State, &timedOut, &dur
		}
		return out, true
	}
	return eventJSON{}, false
}

// marshalEvent keeps "exitCode": null on the wire, which omitempty would drop.
func marshalEvent(e eventJSON) ([]byte, error) {
	b, err := json.Marshal(e)
	if err != nil || e.Type != "exit" || e.ExitCode != nil {
		return b, err
	}
	return append(b[:len(b)-1], []byte(`,"exitCode":null}`)...), nil
}

// streamHeadersAfter is how long a stream may go without an event before
// its status line and headers are sent anyway: withruntime gives up on an
// answer whose headers have not arrived within 125 s, and a refusal that
// comes quickly should still be a plain JSON error.
const streamHeadersAfter = time.Second

// streamEvents answers NDJSON with the events run sends, one line each,
// flushed at once; with binary every chunk of output carries "base64". Headers go out with the first event, or after
// streamHeadersAfter; an error before that is a normal JSON error, an error
// after it an "error" line.
func (s processes) streamEvents(w http.ResponseWriter, r *http.Request, binary bool, run func(send func(guest.Event) error) error) {
	rc := http.NewResponseController(w)
	var mu sync.Mutex // guards w, started and finished, shared with the header timer
	started, finished := false, false
	beginLocked := func() {
		if started {
			return
		}
		started = true
		_ = rc.SetWriteDeadline(time.Time{}) // streams may run for hours
		w.Header().Set("Content-Type", "application/x-ndjson")
		w.Header().Set("Cache-Control", "no-store")
		w.Header().Set("X-Accel-Buffering", "no")
		w.WriteHeader(http.StatusOK)
	}
	timer := time.AfterFunc(streamHeadersAfter, func() {
		mu.Lock()
		defer mu.Unlock()
		if finished { // fired as the handler returned: w is no longer ours
			return
		}
		beginLocked()
		_ = rc.Flush()
	})
	writeLine := func(e eventJSON) error {
		b, err := marshalEvent(e)
		if err != nil {
			return err
		}
		mu.Lock()
		defer mu.Unlock()
		beginLocked()
		if _, err := w.Write(append(b, '\n')); err != nil {
			return err
		}
		return rc.Flush()
	}
	send := func(ev guest.Event) error {
		if ev.Type == "error" && ev.Error != nil {
			return writeLine(eventJSON{Type: "error", Error: &errorJSON{
				Code: ev.Error.Code, Status: http.StatusBadGateway, Message: ev.Error.Message,
				RequestID: requestID(r.Context())}})
		}
		e, ok := wireEvent(ev, binary)
		if !ok {
			return nil
		}
		return writeLine(e)
	}
	err := run(send)
	timer.Stop()
	mu.Lock()
	defer mu.Unlock()
	finished = true // a timer that fired but waits for mu now leaves w alone
	if err == nil {
		beginLocked() // no events at all is still a valid, empty stream
		return
	}
	if !started {
		s.writeError(w, r, err)
		return
	}
	if r.Context().Err() != nil {
		return // the client went away; nobody to tell
	}
	ae := toAPIError(err)
	if ae.Status >= 500 {
		s.log.LogAttrs(r.Context(), slog.LevelError, "stream failed",
			slog.String("request_id", requestID(r.Context())), slog.Any("err", err))
	}
	line, _ := marshalEvent(eventJSON{Type: "error", Error: &errorJSON{Code: ae.Code, Status: ae.Status,
		Message: ae.Message, Hint: ae.Hint, RequestID: requestID(r.Context())}})
	_, _ = w.Write(append(line, '\n'))
	_ = rc.Flush()
}

// processJSON is the wire form of a process.
type processJSON struct {
	ID          string    `json:"id"`
	State       string    `json:"state"`
	ExitCode    *int      `json:"exitCode"`
	Command     string    `json:"command"`
	Argv        []string  `json:"argv,omitempty"`
	Cwd         string    `json:"cwd"`
	PID         int       `json:"pid"`
	StartedAt   *jsonTime `json:"startedAt"`
	EndedAt     *jsonTime `json:"endedAt"`
	TimeoutMs   *int64    `json:"timeoutMs"`
	OutputBytes int64     `json:"outputBytes"`
	FirstOffset int64     `json:"firstOffset"`
	User        string    `json:"user,omitempty"` // "sandbox" or "root", as withruntime says
	Pty         *ptyJSON  `json:"pty"`
	StdinOpen   bool      `json:"stdinOpen"`
	StdinOffset int64     `json:"stdinOffset"`
	// OutputEncoding is "base64" for a process whose output events always
	// carry their bytes as base64; withruntime's output_bytes checks it.
	OutputEncoding string `json:"outputEncoding"`
}

func toProcessJSON(p *guest.ProcessInfo) processJSON {
	out := processJSON{ID: p.ID, State: p.State, ExitCode: p.ExitCode, Command: p.Command, Argv: p.Argv,
		Cwd: p.Cwd, PID: p.PID, StartedAt: optTime(&p.StartedAt), EndedAt: optTime(p.EndedAt),
		OutputBytes: p.OutputBytes, FirstOffset: p.FirstOffset,
		StdinOpen: p.StdinOpen, StdinOffset: p.StdinOffset, OutputEncoding: p.OutputEncoding}
	switch p.User {
	case "":
	case "root":
		out.User = "root"
	default:
		out.User = "sandbox"
	}
	if out.OutputEncoding == "" {
		out.OutputEncoding = "utf8"
	}
	if p.Pty != nil {
		out.Pty = &ptyJSON{Cols: p.Pty.Cols, Rows: p.Pty.Rows}
	}
	if p.TimeoutMs > 0 {
		t := p.TimeoutMs
		out.TimeoutMs = &t
	}
	return out
}

func (s processes) spawn(w http.ResponseWriter, r *http.Request, c *call) error {
	var body spawnRequest
	if err := decode(c, &body); err != nil {
		return err
	}
	req := guest.ExecRequest{Detach: true}
	issues := commandFields(body.Command, body.Argv, body.Cwd, body.Env, body.Stdin, body.StdinBase64,
		body.TimeoutMs, body.User, &req)
	issues = append(issues, spawnIO(&body, &req)...)
	if len(issues) > 0 {
		return invalid(sortIssues(issues))
	}
	if body.TimeoutMs != nil {
		req.TimeoutMs = *body.TimeoutMs
	}
	return guestJSON(s.server, w, r, c, func(ctx context.Context, g guest.Handle) (*guest.ProcessInfo, error) {
		return g.Spawn(ctx, req)
	}, toProcessJSON)
}

func (s processes) list(w http.ResponseWriter, r *http.Request, c *call) error {
	return guestJSON(s.server, w, r, c, func(ctx context.Context, g guest.Handle) ([]guest.ProcessInfo, error) {
		return g.Processes(ctx)
	}, func(ps []guest.ProcessInfo) dataJSON[processJSON] { return dataOf(ps, toProcessJSON) })
}

func (s processes) get(w http.ResponseWriter, r *http.Request, c *call) error {
	return guestJSON(s.server, w, r, c, func(ctx context.Context, g guest.Handle) (*guest.ProcessInfo, error) {
		return g.Process(ctx, r.PathValue("pid"))
	}, toProcessJSON)
}

func (s processes) output(w http.ResponseWriter, r *http.Request, c *call) error {
	q := r.URL.Query()
	req := guest.ProcessRequest{ID: r.PathValue("pid")}
	var issues []issue
	if v := q.Get("cursor"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 {
			issues = append(issues, issue{Path: "cursor", Message: "must be a byte offset (0 or more)"})
		}
		req.Cursor = n
	}
	if v := q.Get("waitMs"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 || n > maxOutputWaitMs {
			issues = append(issues, issue{Path: "waitMs", Message: fmt.Sprintf("must be from 0 to %d", maxOutputWaitMs)})
		}
		req.WaitMs = n
	}
	var err error
	if req.Follow, err = boolParam(q.Get("follow")); err != nil {
		issues = append(issues, issue{Path: "follow", Message: "must be true or false"})
	}
	if len(issues) > 0 {
		return invalid(issues)
	}
	_, g, err := s.guest(r, c)
	if err != nil {
		return err
	}
	// A process spawned with outputEncoding base64 has its bytes in every
	// chunk; the agent keeps bytes alike, so the answer is shaped here.
	p, err := g.Process(r.Context(), req.ID)
	if err != nil {
		return err
	}
	s.streamEvents(w, r, p.OutputEncoding == "base64", func(send func(guest.Event) error) error {
		return g.ProcessOutput(r.Context(), req, send)
	})
	return nil
}

type signalRequest struct {
	Signal string `json:"signal"`
}

var signalRE = regexp.MustCompile(`^(SIG)?[A-Z][A-Z0-9+-]*$|^[0-9]{1,2}$`)

func (s processes) signal(w http.ResponseWriter, r *http.Request, c *call) error {
	var req signalRequest
	if err := decode(c, &req); err != nil {
		return err
	}
	if req.Signal == "" {
		req.Signal = "SIGTERM"
	}
	if !signalRE.MatchString(req.Signal) {
		return invalid([]issue{{Path: "signal", Message: `must be a signal name such as "SIGTERM" or a number`}})
	}
	return guestJSON(s.server, w, r, c, func(ctx context.Context, g guest.Handle) (*guest.ProcessInfo, error) {
		return g.Signal(ctx, r.PathValue("pid"), req.Signal)
	}, toProcessJSON)
}
