package emberbox

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"
)

func newTestClient(t *testing.T, h http.Handler) *Client {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	c, err := NewClient(srv.URL, "k1")
	if err != nil {
		t.Fatal(err)
	}
	c.Backoff = time.Millisecond
	return c
}

func answerError(w http.ResponseWriter, status int, code string, extra string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	fmt.Fprintf(w, `{"error":{"code":%q,"status":%d,"message":"m","hint":"h","requestId":"req_1"%s}}`, code, status, extra)
}

func TestNewClientRefusesBadConfig(t *testing.T) {
	for _, tc := range []struct{ url, key string }{
		{"ftp://x", "k"}, {"http://x/v1", "k"}, {"http://x", ""}, {"http://x", "a b"},
	} {
		if _, err := NewClient(tc.url, tc.key); err == nil {
			t.Errorf("NewClient(%q, %q) was accepted", tc.url, tc.key)
		}
	}
	c, err := NewClient("", "k")
	if err != nil || c.BaseURL() != DefaultURL {
		t.Errorf("default URL: %v %v", c, err)
	}
}

// TestCreateRetriesWithOneKey: a create answered 503 no_capacity with
// retryAfterMs, then 429 with Retry-After, is sent again with the same
// Idempotency-Key, waiting as told.
func TestCreateRetriesWithOneKey(t *testing.T) {
	var mu sync.Mutex
	var keys []string
	var times []time.Time
	c := newTestClient(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		keys = append(keys, r.Header.Get("Idempotency-Key"))
		times = append(times, time.Now())
		n := len(keys)
		mu.Unlock()
		if r.Header.Get("Authorization") != "Bearer k1" || r.Header.Get("Prefer") != "wait=60" {
			answerError(w, 401, "unauthorized", "")
			return
		}
		var body map[string]any
		if err := json.NewDecoder(r.Body).Decode(&body); err != nil || body["name"] != "n" || body["vcpu"] != 1.0 {
			answerError(w, 400, "invalid", "")
			return
		}
		switch n {
		case 1:
			answerError(w, 503, "no_capacity", `,"retryAfterMs":150`)
		case 2:
			w.Header().Set("Retry-After", "0")
			answerError(w, 429, "rate_limited", "")
		default:
			fmt.Fprint(w, `{"id":"sb_1","state":"running","vcpu":1,"createdAt":"2026-01-02T03:04:05.000Z","name":"n"}`)
		}
	}))
	sb, err := c.Create(context.Background(), CreateRequest{Name: "n", VCPU: 1})
	if err != nil {
		t.Fatal(err)
	}
	if sb.ID != "sb_1" || sb.State != "running" || sb.CreatedAt == nil || sb.CreatedAt.Second() != 5 {
		t.Errorf("sandbox %+v", sb)
	}
	if len(keys) != 3 || keys[0] == "" || keys[0] != keys[1] || keys[1] != keys[2] {
		t.Errorf("idempotency keys %q", keys)
	}
	if d := times[1].Sub(times[0]); d < 150*time.Millisecond {
		t.Errorf("retried after %s; the server asked for 150ms", d)
	}
}

func TestErrorsAreTypedAndNotRetriedWhenDeliberate(t *testing.T) {
	calls := 0
	c := newTestClient(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls++
		switch r.URL.Path {
		case "/v1/sandboxes/missing":
			answerError(w, 404, "sandbox_not_found", "")
		case "/v1/sandboxes/x:pause":
			answerError(w, 503, "unavailable", "")
		default:
			w.WriteHeader(502)
			fmt.Fprint(w, "bad gateway")
		}
	}))
	ctx := context.Background()
	_, err := c.Get(ctx, "missing")
	var ae *APIError
	if !errors.As(err, &ae) || ae.Code != "sandbox_not_found" || ae.Status != 404 || ae.Hint != "h" || ae.RequestID != "req_1" {
		t.Fatalf("Get: %#v", err)
	}
	if !IsNotFound(err) || calls != 1 {
		t.Errorf("IsNotFound %v, calls %d", IsNotFound(err), calls)
	}
	calls = 0
	if _, err := c.Pause(ctx, "x", true); !errors.As(err, &ae) || ae.Code != "unavailable" || calls != 1 {
		t.Errorf("a deliberate 503 was retried (%d calls) or mistyped: %v", calls, err)
	}
	calls = 0
	if _, err := c.Stop(ctx, "y", false); !errors.As(err, &ae) || ae.Status != 502 || calls != 1+c.MaxRetries {
		t.Errorf("a 502 without the error shape: %d calls, %v", calls, err)
	}
}

func TestListPages(t *testing.T) {
	c := newTestClient(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		if q.Get("label") != "a:b" || q.Get("includeStopped") != "true" {
			answerError(w, 400, "invalid", "")
			return
		}
		switch q.Get("cursor") {
		case "":
			fmt.Fprint(w, `{"data":[{"id":"s1"},{"id":"s2"}],"nextCursor":"c2"}`)
		case "c2":
			fmt.Fprint(w, `{"data":[{"id":"s3"}],"nextCursor":null}`)
		}
	}))
	list, err := c.List(context.Background(), ListOptions{Labels: map[string]string{"a": "b"}, IncludeStopped: true})
	if err != nil || len(list) != 3 || list[2].ID != "s3" {
		t.Fatalf("List: %v %+v", err, list)
	}
}

// TestExecStreamResumes: output goes to the writers as it comes; a stream
// cut before the exit is read on from the process's output at the byte it
// stopped, without repeats, and the exit code comes back.
func TestExecStreamResumes(t *testing.T) {
	c := newTestClient(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/x-ndjson")
		switch {
		case r.URL.Path == "/v1/sandboxes/s1:exec":
			var body map[string]any
			_ = json.NewDecoder(r.Body).Decode(&body)
			if body["stream"] != true || fmt.Sprint(body["argv"]) != "[sh -c x]" || body["timeoutMs"] != float64(86_400_000) {
				answerError(w, 400, "invalid", "")
				return
			}
			fmt.Fprintln(w, `{"type":"start","processId":"p1"}`)
			fmt.Fprintln(w, `{"type":"stdout","data":"hel","offset":0}`)
			fmt.Fprintln(w, `{"type":"stderr","base64":"b29wcw==","data":"oops","offset":3}`)
			fmt.Fprint(w, `{"type":"stdout","da`) // cut mid-line
		case r.URL.Path == "/v1/sandboxes/s1/processes/p1/output":
			if r.URL.Query().Get("cursor") != "7" || r.URL.Query().Get("follow") != "true" {
				answerError(w, 400, "invalid", "")
				return
			}
			fmt.Fprintln(w, `{"type":"stderr","data":"ps","offset":5}`) // seen already
			fmt.Fprintln(w, `{"type":"stdout","data":"lo\n","offset":7}`)
			fmt.Fprintln(w, `{"type":"exit","exitCode":3,"timedOut":false,"durationMs":12}`)
		}
	}))
	var out, errOut bytes.Buffer
	res, err := c.Exec(context.Background(), "s1", ExecRequest{Argv: []string{"sh", "-c", "x"}, Stdout: &out, Stderr: &errOut})
	if err != nil {
		t.Fatal(err)
	}
	if out.String() != "hello\n" || errOut.String() != "oops" {
		t.Errorf("stdout %q stderr %q", out.String(), errOut.String())
	}
	if res.ExitCode == nil || *res.ExitCode != 3 || res.ProcessID != "p1" || res.Duration != 12*time.Millisecond {
		t.Errorf("result %+v", res)
	}
}

func TestExecErrorLine(t *testing.T) {
	c := newTestClient(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, `{"type":"start","processId":"p1"}`)
		fmt.Fprintln(w, `{"type":"error","error":{"code":"guest_unreachable","status":502,"message":"gone"}}`)
	}))
	_, err := c.Exec(context.Background(), "s1", ExecRequest{Command: "true"})
	var ae *APIError
	if !errors.As(err, &ae) || ae.Code != "guest_unreachable" {
		t.Errorf("error line: %v", err)
	}
}

func TestFilesAndArchives(t *testing.T) {
	files := map[string][]byte{}
	var uploaded bytes.Buffer
	committed := false
	c := newTestClient(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p := r.URL.Query().Get("path")
		switch r.Method + " " + r.URL.Path {
		case "PUT /v1/sandboxes/s1/files/content":
			b, _ := io.ReadAll(r.Body)
			if r.URL.Query().Get("mode") != "755" {
				answerError(w, 400, "invalid", "")
				return
			}
			files[p] = b
			fmt.Fprint(w, `{}`)
		case "GET /v1/sandboxes/s1/files/content":
			w.Header().Set("x-content-length", fmt.Sprint(len(files[p])))
			w.Write(files[p])
		case "POST /v1/sandboxes/s1/uploads":
			fmt.Fprint(w, `{"uploadId":"u1","chunkBytes":1048576}`)
		case "PUT /v1/sandboxes/s1/uploads/u1":
			if r.URL.Query().Get("offset") != fmt.Sprint(uploaded.Len()) {
				answerError(w, 400, "invalid", "")
				return
			}
			io.Copy(&uploaded, r.Body)
			fmt.Fprint(w, `{}`)
		case "POST /v1/sandboxes/s1/uploads/u1:commit":
			committed = true
			fmt.Fprint(w, `{}`)
		case "PUT /v1/sandboxes/s1/files/archive":
			fmt.Fprint(w, `{"path":"/workspace/d","entries":2,"bytes":10}`)
		case "GET /v1/sandboxes/s1/files/archive":
			if r.URL.Query()["exclude"][0] != "node_modules" {
				answerError(w, 400, "invalid", "")
				return
			}
			w.Write([]byte("tarball"))
		}
	}))
	ctx := context.Background()
	if err := c.WriteFile(ctx, "s1", "/workspace/a", []byte("hi"), 0o755); err != nil {
		t.Fatal(err)
	}
	var got bytes.Buffer
	if n, err := c.ReadFile(ctx, "s1", "/workspace/a", &got); err != nil || n != 2 || got.String() != "hi" {
		t.Errorf("ReadFile: %d %q %v", n, got.String(), err)
	}
	big := bytes.Repeat([]byte("z"), 2<<20+5)
	if err := c.WriteFile(ctx, "s1", "/workspace/big", big, 0o755); err != nil || !committed || !bytes.Equal(uploaded.Bytes(), big) {
		t.Errorf("a large WriteFile: %v, committed %v, %d bytes", err, committed, uploaded.Len())
	}
	if u, err := c.UploadArchive(ctx, "s1", "/workspace/d", []byte("x")); err != nil || u.Entries != 2 {
		t.Errorf("UploadArchive: %+v %v", u, err)
	}
	if _, err := c.UploadArchive(ctx, "s1", "/workspace/d", make([]byte, MaxPut+1)); err == nil {
		t.Error("an archive over MaxPut was sent")
	}
	rc, err := c.DownloadArchive(ctx, "s1", "/workspace/d", ArchiveOptions{Excludes: []string{"node_modules"}})
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(rc)
	rc.Close()
	if string(b) != "tarball" {
		t.Errorf("DownloadArchive: %q", b)
	}
}

// TestTerminal speaks the server's side of the terminal protocol.
func TestTerminal(t *testing.T) {
	resized := make(chan string, 1)
	c := newTestClient(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("cols") != "100" {
			answerError(w, 400, "invalid", "")
			return
		}
		conn, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		defer conn.CloseNow()
		ctx := r.Context()
		conn.Write(ctx, websocket.MessageText, []byte(`{"type":"ready","processId":"p9"}`))
		for {
			typ, data, err := conn.Read(ctx)
			if err != nil {
				return
			}
			if typ == websocket.MessageText {
				resized <- string(data)
				continue
			}
			conn.Write(ctx, websocket.MessageBinary, append([]byte("echo:"), data...))
			if strings.Contains(string(data), "exit") {
				conn.Write(ctx, websocket.MessageText, []byte(`{"type":"exit","exitCode":4}`))
				conn.Close(websocket.StatusNormalClosure, "exited")
				return
			}
		}
	}))
	ctx := context.Background()
	if _, err := c.Terminal(ctx, "s1", TerminalOptions{Cols: 0, Rows: 0}); err == nil {
		t.Fatal("a refused terminal opened")
	} else if ae := (*APIError)(nil); !errors.As(err, &ae) || ae.Code != "invalid" {
		t.Fatalf("refusal: %v", err)
	}
	term, err := c.Terminal(ctx, "s1", TerminalOptions{Cols: 100, Rows: 30})
	if err != nil {
		t.Fatal(err)
	}
	defer term.Close()
	if term.ProcessID() != "p9" {
		t.Errorf("process id %q", term.ProcessID())
	}
	if err := term.Resize(ctx, 120, 40); err != nil {
		t.Fatal(err)
	}
	if got := <-resized; got != `{"type":"resize","cols":120,"rows":40}` {
		t.Errorf("resize frame %s", got)
	}
	term.Write([]byte("ls\n"))
	term.Write([]byte("exit\n"))
	out, err := io.ReadAll(term)
	if err != nil || string(out) != "echo:ls\necho:exit\n" {
		t.Errorf("output %q, %v", out, err)
	}
	if code, exited := term.ExitCode(); !exited || code == nil || *code != 4 {
		t.Errorf("exit %v %v", code, exited)
	}
}
