package emberbox

import (
	"bufio"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"time"
)

// ExecRequest is a command to run in a sandbox.
type ExecRequest struct {
	// Command runs under bash -c; or give Argv, a program and its arguments.
	Command string
	Argv    []string
	Cwd     string // default /workspace
	Env     map[string]string
	Stdin   []byte // at most 1 MiB, given whole
	// Timeout kills the command's process group; 0: until the sandbox's
	// lease ends.
	Timeout time.Duration
	User    string // "sandbox" (default) or "root"

	// Stdout and Stderr receive the command's output as it comes.
	Stdout, Stderr io.Writer
}

// ExecResult is how a command ended.
type ExecResult struct {
	ExitCode  *int // nil: killed by a signal, or never started
	TimedOut  bool
	State     string
	Duration  time.Duration
	ProcessID string
	// DroppedBytes is output the server did not keep (a command writing
	// faster than it was read); it never reached Stdout or Stderr.
	DroppedBytes int64
}

// streamedExecTimeout is what a streamed exec with no timeout asks for;
// the server holds it to the lease.
const streamedExecTimeout = 24 * time.Hour

// maxLine bounds one NDJSON line of an output stream.
const maxLine = 8 << 20

// Exec runs a command and streams its output to req.Stdout and
// req.Stderr. A stream cut before the command ends is resumed from the
// last byte received, so no output is lost or repeated.
func (c *Client) Exec(ctx context.Context, id string, req ExecRequest) (*ExecResult, error) {
	if id == "" {
		return nil, errors.New("emberbox: no sandbox id")
	}
	if (req.Command == "") == (len(req.Argv) == 0) {
		return nil, errors.New("emberbox: give Command or Argv")
	}
	r, err := jsonRequest(http.MethodPost, sandboxPath(id, ":exec"), execBody(req))
	if err != nil {
		return nil, err
	}
	r.accept = "application/x-ndjson"
	s := &outputStream{stdout: req.Stdout, stderr: req.Stderr}
	resp, err := c.send(ctx, r)
	if err != nil {
		return nil, err
	}
	err = s.read(resp.Body)
	resp.Body.Close()
	if s.exit != nil {
		return s.result(), nil
	}
	if s.processID == "" {
		return nil, fmt.Errorf("emberbox: exec stream ended before the command started: %w", cmpErr(err))
	}
	if fatal(err) {
		return nil, err
	}
	// Cut: read on from the process's output.
	if err := c.followOutput(ctx, id, s); err != nil {
		return nil, err
	}
	return s.result(), nil
}

// execBody is the body of a streamed exec of req.
func execBody(req ExecRequest) map[string]any {
	body := map[string]any{"stream": true}
	if req.Command != "" {
		body["command"] = req.Command
	} else {
		body["argv"] = req.Argv
	}
	if req.Cwd != "" {
		body["cwd"] = req.Cwd
	}
	if len(req.Env) > 0 {
		body["env"] = req.Env
	}
	if req.Stdin != nil {
		body["stdinBase64"] = base64.StdEncoding.EncodeToString(req.Stdin)
	}
	if req.User != "" {
		body["user"] = req.User
	}
	timeout := req.Timeout
	if timeout <= 0 {
		timeout = streamedExecTimeout
	}
	body["timeoutMs"] = max(1, timeout.Milliseconds())
	return body
}

// followOutput reads the output of s's process from where s stopped
// until its exit; it gives up after 4 reads in a row that bring nothing.
func (c *Client) followOutput(ctx context.Context, id string, s *outputStream) error {
	for idle := 0; s.exit == nil; {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		before := s.offset
		q := url.Values{"cursor": {strconv.FormatInt(s.resumeAt(), 10)}, "follow": {"true"}}
		resp, err := c.send(ctx, &request{method: http.MethodGet, accept: "application/x-ndjson",
			path: sandboxPath(id, "/processes/"+url.PathEscape(s.processID)+"/output"), query: q})
		if err != nil {
			return err
		}
		err = s.read(resp.Body)
		resp.Body.Close()
		if fatal(err) {
			return err
		}
		if s.offset == before && s.exit == nil {
			if idle++; idle >= 4 {
				return fmt.Errorf("emberbox: lost the output of %s: 4 reads in a row brought nothing new: %w", s.processID, cmpErr(err))
			}
			if err := c.wait(ctx, idle, 0); err != nil {
				return err
			}
		} else {
			idle = 0
		}
	}
	return nil
}

// writeError is a failure to deliver output to the caller's writer.
type writeError struct{ err error }

func (e *writeError) Error() string { return e.err.Error() }
func (e *writeError) Unwrap() error { return e.err }

// fatal tells an error that ends an exec from a cut stream, which is
// resumed: the server's error, or the caller's writer failing.
func fatal(err error) bool {
	var ae *APIError
	var we *writeError
	return errors.As(err, &ae) || errors.As(err, &we)
}

func cmpErr(err error) error {
	if err == nil {
		return io.ErrUnexpectedEOF
	}
	return err
}

// outputEvent is one NDJSON line of an output stream.
type outputEvent struct {
	Type         string        `json:"type"`
	ProcessID    string        `json:"processId"`
	Data         *string       `json:"data"`
	Base64       string        `json:"base64"`
	Offset       *int64        `json:"offset"`
	DroppedBytes int64         `json:"droppedBytes"`
	ResumeAt     *int64        `json:"resumeAt"`
	Cursor       *int64        `json:"cursor"`
	ExitCode     *int          `json:"exitCode"`
	State        string        `json:"state"`
	TimedOut     bool          `json:"timedOut"`
	DurationMs   int64         `json:"durationMs"`
	Error        *errorPayload `json:"error"`
}

// outputStream follows the byte offset across stdout and stderr, so that
// a resumed stream delivers every byte once.
type outputStream struct {
	stdout, stderr io.Writer
	processID      string
	offset         int64  // bytes delivered (or dropped) so far
	serverCursor   *int64 // a "continue" event's cursor
	dropped        int64
	exit           *outputEvent
}

func (s *outputStream) resumeAt() int64 {
	if s.serverCursor != nil && *s.serverCursor > s.offset {
		return *s.serverCursor
	}
	return s.offset
}

// read consumes a stream until it ends, an exit, or a "continue".
func (s *outputStream) read(body io.Reader) error {
	sc := bufio.NewScanner(body)
	sc.Buffer(make([]byte, 64<<10), maxLine)
	for sc.Scan() {
		line := sc.Bytes()
		if len(line) == 0 {
			continue
		}
		var ev outputEvent
		if err := json.Unmarshal(line, &ev); err != nil || ev.Type == "" {
			return fmt.Errorf("emberbox: a bad line in an output stream: %.200q", line)
		}
		done, err := s.handle(&ev)
		if err != nil || done {
			return err
		}
	}
	return sc.Err()
}

func (s *outputStream) handle(ev *outputEvent) (bool, error) {
	switch ev.Type {
	case "start":
		if ev.ProcessID != "" {
			s.processID = ev.ProcessID
		}
	case "error":
		p := ev.Error
		if p == nil {
			p = &errorPayload{Code: "stream_error"}
		}
		return true, p.toError(http.StatusBadGateway, "")
	case "continue":
		if ev.ProcessID != "" {
			s.processID = ev.ProcessID
		}
		s.serverCursor = ev.Cursor
		return true, nil
	case "exit":
		s.exit = ev
		return true, nil
	case "truncated":
		s.dropped += ev.DroppedBytes
		if ev.ResumeAt != nil && *ev.ResumeAt > s.offset {
			s.offset = *ev.ResumeAt
		}
	case "stdout", "stderr":
		return false, s.output(ev)
	}
	return false, nil
}

// output delivers a chunk's bytes not delivered yet.
func (s *outputStream) output(ev *outputEvent) error {
	var raw []byte
	switch {
	case ev.Base64 != "":
		b, err := base64.StdEncoding.DecodeString(ev.Base64)
		if err != nil {
			return fmt.Errorf("emberbox: bad base64 in an output stream: %w", err)
		}
		raw = b
	case ev.Data != nil:
		raw = []byte(*ev.Data)
	}
	off := s.offset
	if ev.Offset != nil {
		off = *ev.Offset
	}
	if off > s.offset { // a gap: the server dropped output
		s.dropped += off - s.offset
		s.offset = off
	}
	end := off + int64(len(raw))
	if end <= s.offset {
		return nil // seen already
	}
	raw = raw[s.offset-off:]
	s.offset = end
	w := s.stdout
	if ev.Type == "stderr" {
		w = s.stderr
	}
	if w == nil {
		return nil
	}
	if _, err := w.Write(raw); err != nil {
		return &writeError{fmt.Errorf("emberbox: writing the command's %s: %w", ev.Type, err)}
	}
	return nil
}

func (s *outputStream) result() *ExecResult {
	e := s.exit
	return &ExecResult{ExitCode: e.ExitCode, TimedOut: e.TimedOut, State: e.State,
		Duration: time.Duration(e.DurationMs) * time.Millisecond, ProcessID: s.processID, DroppedBytes: s.dropped}
}
