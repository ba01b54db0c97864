package api

import (
	"encoding/base64"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/emberbox/emberbox/internal/guest"
	"github.com/emberbox/emberbox/internal/sandbox"
)

func TestSpawnInputAndTerminal(t *testing.T) {
	e := newEnv(t)
	e.m.add("key_a", "sbx_r", sandbox.StateRunning, time.Hour)
	w := e.do("POST", "/v1/sandboxes/sbx_r/processes", `{"command":"cat","stdinMode":"pipe","outputEncoding":"base64"}`)
	if w.Code != 200 {
		t.Fatalf("spawn with a pipe: %d %s", w.Code, w.Body)
	}
	if !e.m.lastExec.StdinPipe || e.m.lastExec.Pty != nil || e.m.lastExec.OutputEncoding != "base64" {
		t.Errorf("spawn request: %+v", e.m.lastExec)
	}
	if got := decodeBody[map[string]any](t, w); got["stdinOpen"] != true || got["stdinOffset"] != 0.0 {
		t.Errorf("answer: %v", got)
	}

	w = e.do("POST", "/v1/sandboxes/sbx_r/processes", `{"command":"bash","pty":{"cols":120,"rows":40},"user":"root"}`)
	if w.Code != 200 {
		t.Fatalf("spawn on a pty: %d %s", w.Code, w.Body)
	}
	if p := e.m.lastExec.Pty; p == nil || *p != (guest.PtySize{Cols: 120, Rows: 40}) || e.m.lastExec.User != "root" {
		t.Errorf("spawn request: %+v", e.m.lastExec)
	}
	got := decodeBody[map[string]any](t, w)
	if pty, _ := got["pty"].(map[string]any); pty["cols"] != 120.0 || pty["rows"] != 40.0 || got["user"] != "sandbox" || got["stdinOpen"] != true {
		t.Errorf("answer: %v", got)
	}

	for _, body := range []string{
		`{"command":"x","pty":{"cols":0,"rows":24}}`,
		`{"command":"x","pty":{"cols":80,"rows":100000}}`,
		`{"command":"x","pty":{"cols":80}}`,
		`{"command":"x","stdinMode":"pipe","stdin":"hi"}`,
		`{"command":"x","stdinMode":"tty"}`,
		`{"command":"x","outputEncoding":"latin1"}`,
	} {
		if w := e.do("POST", "/v1/sandboxes/sbx_r/processes", body); w.Code != 400 || errorOf(t, w).Code != "invalid_request" {
			t.Errorf("%s: %d %s, want 400", body, w.Code, w.Body)
		}
	}
}

func TestProcessOutputBase64(t *testing.T) {
	e := newEnv(t)
	e.m.add("key_a", "sbx_r", sandbox.StateRunning, time.Hour)
	e.m.execEvents = []guest.Event{{Type: "stdout", Data: []byte("hi\n"), Offset: 0}}
	for _, enc := range []string{"utf8", "base64"} {
		if w := e.do("POST", "/v1/sandboxes/sbx_r/processes", `{"command":"x","outputEncoding":"`+enc+`"}`); w.Code != 200 {
			t.Fatalf("spawn: %d %s", w.Code, w.Body)
		}
		w := e.do("GET", "/v1/sandboxes/sbx_r/processes/p1/output", "")
		has := strings.Contains(w.Body.String(), `"base64":"aGkK"`)
		if w.Code != 200 || has != (enc == "base64") {
			t.Errorf("%s: %d %s", enc, w.Code, w.Body)
		}
	}
}

func TestWriteProcess(t *testing.T) {
	e := newEnv(t)
	e.m.add("key_a", "sbx_r", sandbox.StateRunning, time.Hour)
	write := func(body string, status int, code string, offset int64) {
		t.Helper()
		w := e.do("POST", "/v1/sandboxes/sbx_r/processes/p1:write", body)
		if w.Code != status {
			t.Fatalf("%.80s: %d %s, want %d", body, w.Code, w.Body, status)
		}
		if status != 200 {
			if got := errorOf(t, w).Code; got != code {
				t.Fatalf("%.80s: code %s, want %s", body, got, code)
			}
			return
		}
		if got := decodeBody[map[string]any](t, w); got["offset"] != float64(offset) || got["id"] != "p1" {
			t.Fatalf("%.80s: %v, want offset %d", body, got, offset)
		}
	}
	b64 := func(s string) string { return base64.StdEncoding.EncodeToString([]byte(s)) }
	write(`{"base64":"`+b64("hello ")+`","offset":0}`, 200, "", 6)
	write(`{"base64":"`+b64("hello ")+`","offset":0}`, 200, "", 6) // a retry
	write(`{"data":"world","offset":100}`, 409, "stdin_offset_gap", 0)
	write(`{"data":"world","base64":"eA==","offset":6}`, 400, "invalid_request", 0)
	write(`{"base64":"not base64!","offset":6}`, 400, "invalid_request", 0)
	write(`{"data":"x","offset":-1}`, 400, "invalid_request", 0)
	// withruntime sends 1 MiB chunks: base64 in JSON is over the usual body limit.
	big := strings.Repeat("y", guest.MaxStdinBuffer)
	write(`{"base64":"`+b64(big)+`","offset":6}`, 200, "", int64(6+len(big)))
	write(`{"base64":"`+b64(big+"z")+`","offset":0}`, 400, "invalid_request", 0)
	write(fmt.Sprintf(`{"data":"!","offset":%d,"eof":true}`, 6+len(big)), 200, "", int64(7+len(big)))
	write(`{"data":"more"}`, 409, "stdin_closed", 0)
	if got := string(e.m.stdin.input); got != "hello "+big+"!" {
		t.Errorf("input %d bytes, want %d", len(got), len(big)+7)
	}
	if w := e.do("POST", "/v1/sandboxes/sbx_r/processes/nope:write", `{"data":"x"}`); w.Code != 404 {
		t.Errorf("unknown process: %d %s", w.Code, w.Body)
	}
}

func TestResizeProcess(t *testing.T) {
	e := newEnv(t)
	e.m.add("key_a", "sbx_r", sandbox.StateRunning, time.Hour)
	if w := e.do("POST", "/v1/sandboxes/sbx_r/processes", `{"command":"bash","pty":{"cols":80,"rows":24}}`); w.Code != 200 {
		t.Fatalf("spawn: %d %s", w.Code, w.Body)
	}
	w := e.do("POST", "/v1/sandboxes/sbx_r/processes/t1:resize", `{"cols":132,"rows":50}`)
	if pty, _ := decodeBody[map[string]any](t, w)["pty"].(map[string]any); w.Code != 200 || pty["cols"] != 132.0 || pty["rows"] != 50.0 {
		t.Errorf("resize: %d %s", w.Code, w.Body)
	}
	if w := e.do("POST", "/v1/sandboxes/sbx_r/processes/p1:resize", `{"cols":132,"rows":50}`); w.Code != 409 || errorOf(t, w).Code != "not_a_terminal" {
		t.Errorf("resize of a process without a terminal: %d %s", w.Code, w.Body)
	}
	for _, body := range []string{`{"cols":0,"rows":50}`, `{"cols":80,"rows":1001}`, `{}`} {
		if w := e.do("POST", "/v1/sandboxes/sbx_r/processes/t1:resize", body); w.Code != 400 {
			t.Errorf("%s: %d %s, want 400", body, w.Code, w.Body)
		}
	}
}
