package mcpgateway

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"os/user"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// The test binary doubles as a stdio MCP server when this is set.
const fakeServerEnv = "MCPGATEWAY_FAKE_SERVER"

func TestMain(m *testing.M) {
	if mode := os.Getenv(fakeServerEnv); mode != "" {
		fakeServer(mode)
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// fakeServer speaks MCP over stdio: initialize, tools/list, and a tool
// "echo". Before each answer it asks its client for roots and sends a
// log notification, which the gateway must absorb. Mode "exit" ends it
// at its first tool call.
func fakeServer(mode string) {
	out := json.NewEncoder(os.Stdout)
	var mu sync.Mutex
	send := func(v any) { mu.Lock(); _ = out.Encode(v); mu.Unlock() }
	fmt.Println("not JSON: a server that prints to stdout")
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		var m message
		if json.Unmarshal(sc.Bytes(), &m) != nil {
			continue
		}
		if !m.isRequest() {
			continue
		}
		send(map[string]any{"jsonrpc": "2.0", "id": "srv-1", "method": "roots/list"})
		send(map[string]any{"jsonrpc": "2.0", "method": "notifications/message", "params": map[string]any{"level": "info", "data": "x"}})
		var result any
		switch m.Method {
		case "initialize":
			if mode == "crash" {
				// Up, then gone: a server that cannot stay up.
				time.AfterFunc(50*time.Millisecond, func() { fmt.Fprintln(os.Stderr, "fake server: crashing"); os.Exit(4) })
			}
			result = map[string]any{"protocolVersion": ProtocolVersion, "capabilities": map[string]any{"tools": map[string]any{}},
				"serverInfo": map[string]any{"name": "fake", "version": "1.2"}}
		case "tools/list":
			result = map[string]any{"tools": []any{map[string]any{"name": "echo", "inputSchema": map[string]any{"type": "object"}}}}
		case "tools/call":
			if mode == "exit" {
				fmt.Fprintln(os.Stderr, "fake server: exiting at a call")
				os.Exit(3)
			}
			var p struct {
				Arguments struct{ Text string } `json:"arguments"`
			}
			_ = json.Unmarshal(m.Params, &p)
			// Answers out of order: a short delay for "slow".
			go func(id json.RawMessage, text string) {
				if text == "slow" {
					time.Sleep(200 * time.Millisecond)
				}
				send(map[string]any{"jsonrpc": "2.0", "id": id, "result": map[string]any{
					"content": []any{map[string]any{"type": "text", "text": "echo:" + text}}}})
			}(m.ID, p.Arguments.Text)
			continue
		default:
			send(map[string]any{"jsonrpc": "2.0", "id": m.ID, "error": map[string]any{"code": -32601, "message": "no " + m.Method}})
			continue
		}
		send(map[string]any{"jsonrpc": "2.0", "id": m.ID, "result": result})
	}
}

// testGateway runs servers (the fake, in the given modes) behind an
// httptest server.
func testGateway(t *testing.T, key string, servers ...Server) (*Gateway, *httptest.Server, string) {
	t.Helper()
	u, err := user.Current()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	for i := range servers {
		servers[i].User, servers[i].Cwd = u.Username, dir
	}
	status := filepath.Join(dir, "status.json")
	g, err := New(Config{Port: 1, Key: key, Servers: servers}, status, filepath.Join(dir, "logs"), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	g.restartBase = 10 * time.Millisecond
	ctx, cancel := context.WithCancel(context.Background())
	wg := g.start(ctx)
	t.Cleanup(func() { cancel(); wg.Wait() })
	ts := httptest.NewServer(g)
	t.Cleanup(ts.Close)
	return g, ts, status
}

func fake(id, mode string) Server {
	return Server{ID: id, Run: []string{os.Args[0]}, Env: map[string]string{fakeServerEnv: mode}}
}

// waitState waits for server id to reach state, as the status file says.
func waitState(t *testing.T, status, id, state string) ServerStatus {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		var st Status
		if data, err := os.ReadFile(status); err == nil && json.Unmarshal(data, &st) == nil {
			for _, s := range st.Servers {
				if s.ID == id && s.State == state {
					return s
				}
			}
		}
		if time.Now().After(deadline) {
			data, _ := os.ReadFile(status)
			t.Fatalf("server %s never %s: %s", id, state, data)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// waitRestarts waits for server id to have been restarted n times and to
// run again.
func waitRestarts(t *testing.T, status, id string, n int) ServerStatus {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		st := waitState(t, status, id, StateRunning)
		if st.Restarts >= n {
			return st
		}
		if time.Now().After(deadline) {
			t.Fatalf("server %s restarted %d times, want %d", id, st.Restarts, n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func post(t *testing.T, url, key, body string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest("POST", url, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set(KeyHeader, key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func TestGatewayServesOverStreamableHTTP(t *testing.T) {
	_, ts, status := testGateway(t, "", fake("one", "ok"))
	st := waitState(t, status, "one", StateRunning)
	if st.Name != "fake" || st.Version != "1.2" || st.StartedAt == nil {
		t.Errorf("a running server's status: %+v", st)
	}
	url := ts.URL + "/mcp/one"

	// Every client's initialize gets the server's one answer, under its id.
	code, body := post(t, url, "", `{"jsonrpc":"2.0","id":"c-1","method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{"roots":{}},"clientInfo":{"name":"t","version":"0"}}}`)
	if code != 200 || !strings.Contains(body, `"id":"c-1"`) || !strings.Contains(body, `"serverInfo":{"name":"fake"`) {
		t.Errorf("initialize: %d %s", code, body)
	}
	if code, body := post(t, url, "", `{"jsonrpc":"2.0","method":"notifications/initialized"}`); code != 202 || body != "" {
		t.Errorf("initialized: %d %q", code, body)
	}
	if code, body := post(t, url, "", `{"jsonrpc":"2.0","id":7,"method":"tools/list"}`); code != 200 || !strings.Contains(body, `"id":7`) || !strings.Contains(body, `"name":"echo"`) {
		t.Errorf("tools/list: %d %s", code, body)
	}
	if code, body := post(t, url, "", `{"jsonrpc":"2.0","id":8,"method":"resources/list"}`); code != 200 || !strings.Contains(body, `"code":-32601`) {
		t.Errorf("an error of the server: %d %s", code, body)
	}

	// Two clients with the same ids, answered out of order, each get theirs.
	var wg sync.WaitGroup
	for _, text := range []string{"slow", "fast", "slow", "fast"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			code, body := post(t, url, "", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo","arguments":{"text":"`+text+`"}}}`)
			if code != 200 || !strings.Contains(body, `"id":1`) || !strings.Contains(body, "echo:"+text) {
				t.Errorf("call %s: %d %s", text, code, body)
			}
		}()
	}
	wg.Wait()

	// A batch; responses from the client are absorbed.
	code, body = post(t, url, "", `[{"jsonrpc":"2.0","id":"a","method":"ping"},{"jsonrpc":"2.0","id":"srv-1","result":{}},{"jsonrpc":"2.0","id":"b","method":"tools/list"}]`)
	var replies []message
	if code != 200 || json.Unmarshal([]byte(body), &replies) != nil || len(replies) != 2 || string(replies[1].ID) != `"b"` {
		t.Errorf("batch: %d %s", code, body)
	}

	for _, c := range []struct {
		method, path, body string
		want               int
	}{
		{"GET", "/mcp/one", "", 405},
		{"DELETE", "/mcp/one", "", 405},
		{"POST", "/mcp/two", "{}", 404},
		{"POST", "/elsewhere", "{}", 404},
		{"POST", "/mcp/one", "{not json", 400},
		{"POST", "/mcp/one", "[]", 400},
		{"POST", "/mcp/one", `{"jsonrpc":"2.0","id":1,"method":"x","params":"` + strings.Repeat("a", maxRequest) + `"}`, 413},
	} {
		req, _ := http.NewRequest(c.method, ts.URL+c.path, strings.NewReader(c.body))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != c.want {
			t.Errorf("%s %s: %d, want %d", c.method, c.path, resp.StatusCode, c.want)
		}
	}
}

func TestGatewayKey(t *testing.T) {
	_, ts, status := testGateway(t, "k3y", fake("one", "ok"))
	waitState(t, status, "one", StateRunning)
	for _, key := range []string{"", "wrong", "k3"} {
		if code, _ := post(t, ts.URL+"/mcp/one", key, `{"jsonrpc":"2.0","id":1,"method":"tools/list"}`); code != 401 {
			t.Errorf("key %q: %d, want 401", key, code)
		}
	}
	if code, body := post(t, ts.URL+"/mcp/one", "k3y", `{"jsonrpc":"2.0","id":1,"method":"tools/list"}`); code != 200 {
		t.Errorf("with the key: %d %s", code, body)
	}
}

func TestGatewayInstallAndFailures(t *testing.T) {
	dir := t.TempDir()
	marker := filepath.Join(dir, "installed")
	good := fake("good", "ok")
	good.Install, good.Installed = []string{"/bin/sh", "-c", "echo installing; sleep 0.3; touch " + marker}, marker
	bad := fake("bad", "ok")
	bad.Install, bad.Installed = []string{"/bin/sh", "-c", "echo no such package >&2; exit 1"}, filepath.Join(dir, "never")
	dies := fake("dies", "exit")
	crashes := fake("crashes", "crash")
	missing := Server{ID: "missing", Run: []string{filepath.Join(dir, "no-such-program")}}
	_, ts, status := testGateway(t, "", good, bad, dies, crashes, missing)

	waitState(t, status, "good", StateRunning)
	if st := waitState(t, status, "bad", StateFailed); !strings.Contains(st.Error, "install failed") || !strings.Contains(st.LogTail, "no such package") {
		t.Errorf("a failed install: %+v", st)
	}
	if st := waitState(t, status, "missing", StateFailed); !strings.Contains(st.Error, "no-such-program") {
		t.Errorf("a missing program: %+v", st)
	}
	if code, body := post(t, ts.URL+"/mcp/bad", "", `{"jsonrpc":"2.0","id":1,"method":"tools/list"}`); code != 503 || !strings.Contains(body, "failed") {
		t.Errorf("a call to a failed server: %d %s", code, body)
	}
	// A server that dies in a call: the call answers 502, and the server
	// is started again and answers.
	waitState(t, status, "dies", StateRunning)
	if code, body := post(t, ts.URL+"/mcp/dies", "", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo"}}`); code != 502 || !strings.Contains(body, "ended") {
		t.Errorf("a call the server died in: %d %s", code, body)
	}
	if st := waitRestarts(t, status, "dies", 1); st.State != StateRunning {
		t.Errorf("a server that died once: %+v, want running again", st)
	}
	if code, body := post(t, ts.URL+"/mcp/dies", "", `{"jsonrpc":"2.0","id":2,"method":"tools/list"}`); code != 200 || !strings.Contains(body, "echo") {
		t.Errorf("a call to the restarted server: %d %s", code, body)
	}
	// A server that cannot stay up is failed after maxQuickRestarts
	// restarts, and says why.
	if st := waitState(t, status, "crashes", StateFailed); st.Restarts != maxQuickRestarts ||
		!strings.Contains(st.Error, "exit status 4") || !strings.Contains(st.Error, "in a row") || !strings.Contains(st.LogTail, "crashing") {
		t.Errorf("a server that kept crashing: %+v", st)
	}
	// The key of a public gateway is in the status, which only root reads.
	if fi, err := os.Stat(status); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("the status file: %v %v", fi.Mode(), err)
	}
}

func TestConfigCheck(t *testing.T) {
	ok := Server{ID: "a", Run: []string{"x"}, User: "u", Cwd: "/"}
	for name, c := range map[string]Config{
		"no servers":    {Port: 1},
		"port":          {Port: 0, Servers: []Server{ok}},
		"bad id":        {Port: 1, Servers: []Server{{ID: "A/..", Run: []string{"x"}, User: "u", Cwd: "/"}}},
		"repeated":      {Port: 1, Servers: []Server{ok, ok}},
		"no run":        {Port: 1, Servers: []Server{{ID: "a", User: "u", Cwd: "/"}}},
		"install alone": {Port: 1, Servers: []Server{{ID: "a", Run: []string{"x"}, User: "u", Cwd: "/", Install: []string{"y"}}}},
		"too many":      {Port: 1, Servers: make([]Server, MaxServers+1)},
	} {
		if err := c.Check(); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if _, err := ReadConfig(strings.NewReader(strings.Repeat(" ", maxConfig+1))); err == nil {
		t.Error("an oversized config was read")
	}
}
