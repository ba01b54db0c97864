package api

import (
	"bufio"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/emberbox/emberbox/internal/guest"
	"github.com/emberbox/emberbox/internal/sandbox"
	"github.com/google/go-cmp/cmp"
)

func intPtr(n int) *int { return &n }

func TestExecJSON(t *testing.T) {
	e := newEnv(t)
	e.m.add("key_a", "sbx_r", sandbox.StateRunning, time.Hour)
	e.m.execResult = guest.ExecResult{ProcessID: "p1", ExitCode: intPtr(3), Stdout: []byte("hi\n"), Stderr: []byte{0xff, 'x'},
		StderrTruncated: true, DurationMs: 12, State: "exited"}
	w := e.do("POST", "/v1/sandboxes/sbx_r:exec", `{"argv":["ls","-l"],"cwd":"/tmp","env":{"A":"1"},"stdinBase64":"aGk=","user":"sandbox"}`)
	if w.Code != 200 {
		t.Fatalf("status %d: %s", w.Code, w.Body)
	}
	want := map[string]any{"exitCode": 3.0, "stdout": "hi\n", "stderr": "\uFFFDx", "timedOut": false, "stdoutTruncated": false,
		"stderrTruncated": true, "durationMs": 12.0, "processId": "p1"}
	if diff := cmp.Diff(want, decodeBody[map[string]any](t, w)); diff != "" {
		t.Errorf("result (-want +got):\n%s", diff)
	}
	wantReq := guest.ExecRequest{Argv: []string{"ls", "-l"}, Cwd: "/tmp", Env: map[string]string{"A": "1"}, Stdin: []byte("hi"),
		TimeoutMs: 60000, User: "user", MaxOutput: 64 << 10}
	if diff := cmp.Diff(wantReq, e.m.lastExec); diff != "" {
		t.Errorf("exec request (-want +got):\n%s", diff)
	}
}

func TestExecTimeouts(t *testing.T) {
	tests := []struct {
		name      string
		lease     time.Duration
		body      string
		status    int
		code      string
		timeoutMs int64 // approximate, in whole seconds
		maxOutput int64
	}{
		{name: "default", lease: time.Hour, body: `{"command":"x"}`, status: 200, timeoutMs: 60000, maxOutput: 64 << 10},
		{name: "default shortened by lease", lease: 30 * time.Second, body: `{"command":"x"}`, status: 200, timeoutMs: 30000, maxOutput: 64 << 10},
		{name: "explicit long", lease: time.Hour, body: `{"command":"x","timeoutMs":120000}`, status: 200, timeoutMs: 120000, maxOutput: 1 << 20},
		{name: "explicit past lease", lease: 100 * time.Second, body: `{"command":"x","timeoutMs":200000}`, status: 409, code: "time_limit_too_short"},
		{name: "stream clamped to lease", lease: 900 * time.Second, body: `{"command":"x","timeoutMs":86400000,"stream":true}`, status: 200,
			timeoutMs: 900000, maxOutput: 1 << 20},
		{name: "too long", lease: time.Hour, body: `{"command":"x","timeoutMs":86400001}`, status: 400, code: "invalid_request"},
		{name: "both forms", lease: time.Hour, body: `{"command":"x","argv":["y"]}`, status: 400, code: "invalid_request"},
		{name: "neither form", lease: time.Hour, body: `{"cwd":"/"}`, status: 400, code: "invalid_request"},
		{name: "bad user", lease: time.Hour, body: `{"command":"x","user":"admin"}`, status: 400, code: "invalid_request"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t)
			e.m.add("key_a", "sbx_r", sandbox.StateRunning, tt.lease)
			e.m.execEvents = []guest.Event{{Type: "start", ProcessID: "p"}}
			w := e.do("POST", "/v1/sandboxes/sbx_r:exec", tt.body)
			if w.Code != tt.status {
				t.Fatalf("status %d, want %d: %s", w.Code, tt.status, w.Body)
			}
			if tt.code != "" {
				got := errorOf(t, w)
				if got.Code != tt.code {
					t.Errorf("code %q, want %q", got.Code, tt.code)
				}
				if tt.code == "time_limit_too_short" && got.Details["secondsLeft"] == nil {
					t.Errorf("no details.secondsLeft: %s", w.Body)
				}
				return
			}
			got := e.m.lastExec
			if d := got.TimeoutMs - tt.timeoutMs; d > 0 || d < -2000 {
				t.Errorf("timeoutMs %d, want about %d", got.TimeoutMs, tt.timeoutMs)
			}
			if got.MaxOutput != tt.maxOutput {
				t.Errorf("maxOutput %d, want %d", got.MaxOutput, tt.maxOutput)
			}
		})
	}
}

// lines parses an NDJSON body.
func lines(t *testing.T, body string) []map[string]any {
	t.Helper()
	var out []map[string]any
	sc := bufio.NewScanner(strings.NewReader(body))
	for sc.Scan() {
		var m map[string]any
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatalf("line %q: %v", sc.Text(), err)
		}
		out = append(out, m)
	}
	if !strings.HasSuffix(body, "\n") {
		t.Errorf("body does not end with a newline: %q", body)
	}
	return out
}

func TestExecStream(t *testing.T) {
	e := newEnv(t)
	e.m.add("key_a", "sbx_r", sandbox.StateRunning, time.Hour)
	e.m.execEvents = []guest.Event{
		{Type: "start", ProcessID: "p1"},
		{Type: "stdout", Data: []byte("héllo\n"), Offset: 0},
		{Type: "stderr", Data: []byte{0xff, 0xfe}, Offset: 7},
		{Type: "truncated", Dropped: 10, Offset: 19},
		{Type: "stdout", Data: []byte("x"), Offset: 19},
		{Type: "exit", Exit: &guest.ExecResult{State: "timed_out", TimedOut: true, DurationMs: 5}},
	}
	w := e.do("POST", "/v1/sandboxes/sbx_r:exec", `{"command":"x","stream":true}`)
	if w.Code != 200 || w.Header().Get("Content-Type") != "application/x-ndjson" {
		t.Fatalf("status %d, type %q", w.Code, w.Header().Get("Content-Type"))
	}
	want := []map[string]any{
		{"type": "start", "processId": "p1"},
		{"type": "stdout", "data": "héllo\n", "offset": 0.0},
		{"type": "stderr", "data": "\uFFFD", "base64": "//4=", "offset": 7.0},
		{"type": "truncated", "droppedBytes": 10.0, "resumeAt": 19.0},
		{"type": "stdout", "data": "x", "offset": 19.0},
		{"type": "exit", "exitCode": nil, "state": "timed_out", "timedOut": true, "durationMs": 5.0},
	}
	if diff := cmp.Diff(want, lines(t, w.Body.String())); diff != "" {
		t.Errorf("events (-want +got):\n%s", diff)
	}
	if !e.m.lastExec.Stream {
		t.Error("manager not asked to stream")
	}
}

func TestExecStreamErrors(t *testing.T) {
	t.Run("not running is a JSON error", func(t *testing.T) {
		e := newEnv(t)
		e.m.add("key_a", "sbx_s", sandbox.StateStopped, time.Hour)
		w := e.do("POST", "/v1/sandboxes/sbx_s:exec", `{"command":"x","stream":true}`)
		if w.Code != 409 || errorOf(t, w).Code != "not_running" {
			t.Errorf("got %d %s", w.Code, w.Body)
		}
	})
	t.Run("failure before start is a JSON error", func(t *testing.T) {
		e := newEnv(t)
		e.m.add("key_a", "sbx_r", sandbox.StateRunning, time.Hour)
		e.m.execErr = errdefsConflict("command_not_found")
		w := e.do("POST", "/v1/sandboxes/sbx_r:exec", `{"command":"x","stream":true}`)
		if w.Code != 409 || errorOf(t, w).Code != "command_not_found" {
			t.Errorf("got %d %s", w.Code, w.Body)
		}
	})
	t.Run("failure midway is an error line", func(t *testing.T) {
		e := newEnv(t)
		e.m.add("key_a", "sbx_r", sandbox.StateRunning, time.Hour)
		e.m.execEvents = []guest.Event{{Type: "start", ProcessID: "p1"}}
		e.m.execErr = errInternalSecret
		w := e.do("POST", "/v1/sandboxes/sbx_r:exec", `{"command":"x","stream":true}`)
		got := lines(t, w.Body.String())
		if len(got) != 2 {
			t.Fatalf("events %v", got)
		}
		errObj, _ := got[1]["error"].(map[string]any)
		if got[1]["type"] != "error" || errObj["code"] != "internal" || errObj["requestId"] != w.Header().Get("x-request-id") ||
			strings.Contains(w.Body.String(), "secret") {
			t.Errorf("error line %v", got[1])
		}
	})
}

func TestProcesses(t *testing.T) {
	e := newEnv(t)
	e.m.add("key_a", "sbx_r", sandbox.StateRunning, time.Hour)
	w := e.do("POST", "/v1/sandboxes/sbx_r/processes", `{"command":"sleep 100"}`)
	if w.Code != 200 || decodeBody[map[string]any](t, w)["id"] != "p1" {
		t.Fatalf("spawn: %d %s", w.Code, w.Body)
	}
	if !e.m.lastExec.Detach || e.m.lastExec.TimeoutMs != 0 {
		t.Errorf("spawn request %+v: want detached, no timeout", e.m.lastExec)
	}
	if w := e.do("POST", "/v1/sandboxes/sbx_r/processes", `{"command":"x","pty":{"cols":80}}`); w.Code != 400 {
		t.Errorf("pty: %d", w.Code)
	}
	if w := e.do("GET", "/v1/sandboxes/sbx_r/processes", ""); len(decodeBody[dataJSON[map[string]any]](t, w).Data) != 1 {
		t.Errorf("list: %s", w.Body)
	}
	if w := e.do("GET", "/v1/sandboxes/sbx_r/processes/nope", ""); w.Code != 404 || errorOf(t, w).Code != "process_not_found" {
		t.Errorf("missing process: %d %s", w.Code, w.Body)
	}
	if w := e.do("POST", "/v1/sandboxes/sbx_r/processes/p1:signal", `{}`); w.Code != 200 || e.m.signal != "SIGTERM" {
		t.Errorf("signal: %d %s, sent %q", w.Code, w.Body, e.m.signal)
	}
	if w := e.do("POST", "/v1/sandboxes/sbx_r/processes/p1:signal", `{"signal":"kill -9; rm"}`); w.Code != 400 {
		t.Errorf("bad signal: %d", w.Code)
	}
	e.m.execEvents = []guest.Event{{Type: "stdout", Data: []byte("a"), Offset: 5}, {Type: "exit", Exit: &guest.ExecResult{ExitCode: intPtr(0), State: "exited"}}}
	w = e.do("GET", "/v1/sandboxes/sbx_r/processes/p1/output?cursor=5&follow=true&waitMs=100", "")
	if diff := cmp.Diff(guest.ProcessRequest{ID: "p1", Cursor: 5, Follow: true, WaitMs: 100}, e.m.outputReq); diff != "" {
		t.Errorf("output request (-want +got):\n%s", diff)
	}
	want := []map[string]any{{"type": "stdout", "data": "a", "offset": 5.0},
		{"type": "exit", "exitCode": 0.0, "state": "exited", "timedOut": false, "durationMs": 0.0}}
	if diff := cmp.Diff(want, lines(t, w.Body.String())); diff != "" {
		t.Errorf("output (-want +got):\n%s", diff)
	}
	if w := e.do("GET", "/v1/sandboxes/sbx_r/processes/p1/output?cursor=-1", ""); w.Code != 400 {
		t.Errorf("negative cursor: %d", w.Code)
	}
}
