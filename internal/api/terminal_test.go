package api

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/emberbox/emberbox/internal/guest"
	"github.com/emberbox/emberbox/internal/sandbox"
)

// dialTerminal opens GET …/terminal with query as key a.
func dialTerminal(t *testing.T, ctx context.Context, url, query string) (*websocket.Conn, *http.Response, error) {
	t.Helper()
	h := http.Header{}
	h.Set("Authorization", "Bearer secret-a")
	return websocket.Dial(ctx, strings.Replace(url, "http", "ws", 1)+"/v1/sandboxes/sbx_r/terminal"+query,
		&websocket.DialOptions{HTTPHeader: h})
}

// readJSONFrame reads one text frame.
func readJSONFrame(t *testing.T, ctx context.Context, c *websocket.Conn) map[string]any {
	t.Helper()
	typ, b, err := c.Read(ctx)
	if err != nil || typ != websocket.MessageText {
		t.Fatalf("read: %v %v %q", typ, err, b)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	return m
}

// readUntil reads binary frames until their bytes contain want.
func readUntil(t *testing.T, ctx context.Context, c *websocket.Conn, want string) string {
	t.Helper()
	var got strings.Builder
	for !strings.Contains(got.String(), want) {
		typ, b, err := c.Read(ctx)
		if err != nil || typ != websocket.MessageBinary {
			t.Fatalf("reading for %q: %v %v %q; so far %q", want, typ, err, b, got.String())
		}
		got.Write(b)
	}
	return got.String()
}

func TestTerminal(t *testing.T) {
	e := newEnv(t)
	e.m.add("key_a", "sbx_r", sandbox.StateRunning, time.Hour)
	srv := httptest.NewServer(e.s)
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	c, _, err := dialTerminal(t, ctx, srv.URL, "?cols=100&rows=30&command=bash&cwd=/tmp&user=root")
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseNow()
	if ready := readJSONFrame(t, ctx, c); ready["type"] != "ready" || ready["processId"] != fakeTTYID {
		t.Fatalf("first frame: %v", ready)
	}
	if req := e.m.lastExec; req.Pty == nil || *req.Pty != (guest.PtySize{Cols: 100, Rows: 30}) || req.Command != "bash" ||
		req.Cwd != "/tmp" || req.User != "root" || !req.Detach {
		t.Fatalf("spawned %+v", req)
	}
	readUntil(t, ctx, c, "$ ")
	// A full input buffer is waited out, not lost.
	e.m.stdin.mu.Lock()
	e.m.stdin.full = 2
	e.m.stdin.mu.Unlock()
	if err := c.Write(ctx, websocket.MessageBinary, []byte("ls\n")); err != nil {
		t.Fatal(err)
	}
	readUntil(t, ctx, c, "ls\n")
	if err := c.Write(ctx, websocket.MessageText, []byte(`{"type":"resize","cols":132,"rows":50}`)); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		e.m.stdin.mu.Lock()
		size := e.m.stdin.size
		e.m.stdin.mu.Unlock()
		if size == (guest.PtySize{Cols: 132, Rows: 50}) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("size %+v after the resize", size)
		}
		time.Sleep(10 * time.Millisecond)
	}

	// A second socket attaches to the same process and gets what it printed.
	c2, _, err := dialTerminal(t, ctx, srv.URL, "?processId="+fakeTTYID)
	if err != nil {
		t.Fatal(err)
	}
	defer c2.CloseNow()
	if ready := readJSONFrame(t, ctx, c2); ready["type"] != "ready" || ready["processId"] != fakeTTYID {
		t.Fatalf("reattached: %v", ready)
	}
	if got := readUntil(t, ctx, c2, "$ ls\n"); got != "$ ls\n" {
		t.Fatalf("replay %q", got)
	}
	if err := c2.Write(ctx, websocket.MessageBinary, []byte("exit\n")); err != nil {
		t.Fatal(err)
	}
	for _, conn := range []*websocket.Conn{c, c2} {
		readUntil(t, ctx, conn, "exit\n")
		if ev := readJSONFrame(t, ctx, conn); ev["type"] != "exit" || ev["exitCode"] != 3.0 {
			t.Fatalf("exit frame %v", ev)
		}
		if _, _, err := conn.Read(ctx); websocket.CloseStatus(err) != websocket.StatusNormalClosure {
			t.Fatalf("after exit: %v, want a normal closure", err)
		}
	}
	// Both sockets are gone: their slots are free.
	if !e.s.terminals.acquire("sbx_r") {
		t.Fatal("no terminal slot free")
	}
	e.s.terminals.release("sbx_r")
}

func TestTerminalRefusals(t *testing.T) {
	e := newEnv(t)
	e.m.add("key_a", "sbx_r", sandbox.StateRunning, time.Hour)
	srv := httptest.NewServer(e.s)
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for _, tc := range []struct {
		query  string
		status int
	}{
		{"?cols=0", 400}, {"?rows=abc", 400}, {"?user=admin", 400},
		{"?processId=p1", 409},   // not a terminal
		{"?processId=nope", 404}, // no such process
	} {
		_, resp, err := dialTerminal(t, ctx, srv.URL, tc.query)
		if err == nil || resp == nil || resp.StatusCode != tc.status {
			t.Errorf("%s: %v %v, want %d", tc.query, resp, err, tc.status)
		}
	}
	// Without a key, nothing is served.
	_, resp, err := websocket.Dial(ctx, strings.Replace(srv.URL, "http", "ws", 1)+"/v1/sandboxes/sbx_r/terminal", nil)
	if err == nil || resp == nil || resp.StatusCode != 401 {
		t.Errorf("without a key: %v %v, want 401", resp, err)
	}
	// A sandbox that is not running answers its state's refusal.
	e.m.add("key_a", "sbx_s", sandbox.StateStopped, time.Hour)
	_, resp, err = websocket.Dial(ctx, strings.Replace(srv.URL, "http", "ws", 1)+"/v1/sandboxes/sbx_s/terminal",
		&websocket.DialOptions{HTTPHeader: http.Header{"Authorization": {"Bearer secret-a"}}})
	if err == nil || resp == nil || resp.StatusCode != 409 {
		t.Errorf("stopped sandbox: %v %v, want 409", resp, err)
	}
	// Not a WebSocket.
	if w := e.do("GET", "/v1/sandboxes/sbx_r/terminal", ""); w.Code != http.StatusUpgradeRequired || errorOf(t, w).Code != "upgrade_required" {
		t.Errorf("plain GET: %d %s", w.Code, w.Body)
	}
	// At most terminalsPerSandbox sockets at once.
	for range terminalsPerSandbox {
		if !e.s.terminals.acquire("sbx_r") {
			t.Fatal("slot refused early")
		}
	}
	_, resp, err = dialTerminal(t, ctx, srv.URL, "")
	if err == nil || resp == nil || resp.StatusCode != 429 {
		t.Errorf("one terminal too many: %v %v, want 429", resp, err)
	}
}
