package integration

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
)

// inputProcessJSON is a process with the input and terminal fields.
type inputProcessJSON struct {
	ID          string `json:"id"`
	State       string `json:"state"`
	ExitCode    *int   `json:"exitCode"`
	User        string `json:"user"`
	StdinOpen   bool   `json:"stdinOpen"`
	StdinOffset int64  `json:"stdinOffset"`
	Offset      int64  `json:"offset"` // answers of :write
	Pty         *struct {
		Cols int `json:"cols"`
		Rows int `json:"rows"`
	} `json:"pty"`
}

// outputMatching reads a process's output from the start (polling
// …/output) until it matches re, and returns it.
func outputMatching(t *testing.T, c *client, id, pid string, re *regexp.Regexp) string {
	t.Helper()
	var out bytes.Buffer
	cursor := int64(0)
	deadline := time.Now().Add(90 * time.Second)
	for !re.Match(out.Bytes()) {
		if time.Now().After(deadline) {
			t.Fatalf("output of %s never matched %s; it is %q", pid, re, out.String())
		}
		r := c.raw(t, "GET", fmt.Sprintf("/v1/sandboxes/%s/processes/%s/output?cursor=%d&waitMs=2000", id, pid, cursor), nil, nil, requestTimeout)
		if r.err != nil || r.Status != http.StatusOK {
			t.Fatalf("output of %s: %v", pid, r)
		}
		sc := bufio.NewScanner(bytes.NewReader(r.Body))
		sc.Buffer(nil, 4<<20)
		for sc.Scan() {
			var ev struct {
				Type   string `json:"type"`
				Data   string `json:"data"`
				Base64 string `json:"base64"`
				Offset int64  `json:"offset"`
			}
			if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
				t.Fatalf("output line %q: %v", sc.Bytes(), err)
			}
			if ev.Type != "stdout" && ev.Type != "stderr" {
				continue
			}
			data := []byte(ev.Data)
			if ev.Base64 != "" {
				data, _ = base64.StdEncoding.DecodeString(ev.Base64)
			}
			out.Write(data)
			cursor = ev.Offset + int64(len(data))
		}
	}
	return out.String()
}

// write sends input to a process at offset and returns the answer.
func (c *client) write(t *testing.T, id, pid, data string, offset int64, eof bool) inputProcessJSON {
	t.Helper()
	p, _ := call[inputProcessJSON](t, c, "POST", "/v1/sandboxes/"+id+"/processes/"+pid+":write",
		map[string]any{"base64": base64.StdEncoding.EncodeToString([]byte(data)), "offset": offset, "eof": eof}, nil)
	return p
}

// TestProcessInputAndTerminal drives interactive programs in a real VM:
// python3 -i on a pty spawned through the API and answered through :write;
// a shell's read prompt answered through a stdin pipe with eof (and the
// retry of that write, which types nothing twice); a resize seen by the
// program; python3 -i through the terminal WebSocket, closed, then
// reattached by processId with its earlier output replayed.
func TestProcessInputAndTerminal(t *testing.T) {
	dataDir := t.TempDir()
	s := startServer(t, dataDir)
	c := s.client(s.AdminKey)
	sb := c.createRunning(t, map[string]any{"timeoutSeconds": 1800})
	base := "/v1/sandboxes/" + sb.ID

	// python3 -i on a pty.
	py, _ := call[inputProcessJSON](t, c, "POST", base+"/processes",
		map[string]any{"command": "python3 -i", "pty": map[string]int{"cols": 80, "rows": 24}}, nil)
	if py.Pty == nil || py.Pty.Cols != 80 || !py.StdinOpen || py.User != "sandbox" {
		t.Fatalf("spawned on a pty: %+v", py)
	}
	outputMatching(t, c, sb.ID, py.ID, regexp.MustCompile(`>>> $`))
	if w := c.write(t, sb.ID, py.ID, "1+1\n", 0, false); w.Offset != 4 || w.StdinOffset != 4 {
		t.Fatalf("write: %+v", w)
	}
	outputMatching(t, c, sb.ID, py.ID, regexp.MustCompile(`1\+1\r\n2\r\n>>> $`))
	c.write(t, sb.ID, py.ID, "exit()\n", 4, false)
	if !waitUntil(60*time.Second, 200*time.Millisecond, func() bool {
		p, _ := call[inputProcessJSON](t, c, "GET", base+"/processes/"+py.ID, nil, nil)
		return p.State == "exited" && p.ExitCode != nil && *p.ExitCode == 0 && !p.StdinOpen
	}) {
		t.Fatal("python3 did not exit after exit()")
	}

	// A read prompt answered through a pipe.
	rd, _ := call[inputProcessJSON](t, c, "POST", base+"/processes",
		map[string]any{"command": "read x; echo got:$x", "stdinMode": "pipe"}, nil)
	if !rd.StdinOpen || rd.Pty != nil {
		t.Fatalf("spawned with a pipe: %+v", rd)
	}
	if w := c.write(t, sb.ID, rd.ID, "hello\n", 0, true); w.Offset != 6 {
		t.Fatalf("write: %+v", w)
	}
	if w := c.write(t, sb.ID, rd.ID, "hello\n", 0, true); w.Offset != 6 { // the retry
		t.Fatalf("retried write: %+v", w)
	}
	if out := outputMatching(t, c, sb.ID, rd.ID, regexp.MustCompile(`got:`)); !regexp.MustCompile(`^got:hello\n?$`).MatchString(out) {
		t.Fatalf("read printed %q", out)
	}
	r := c.raw(t, "POST", base+"/processes/"+rd.ID+":write", map[string]any{"data": "more", "offset": 6}, nil, requestTimeout)
	if r.Status != http.StatusConflict || r.Err == nil || r.Err.Code != "stdin_closed" {
		t.Errorf("write after eof: %v", r)
	}

	// A resize reaches the program on the terminal.
	sz, _ := call[inputProcessJSON](t, c, "POST", base+"/processes",
		map[string]any{"command": "read; stty size", "pty": map[string]int{"cols": 80, "rows": 24}}, nil)
	rs, _ := call[inputProcessJSON](t, c, "POST", base+"/processes/"+sz.ID+":resize", map[string]int{"cols": 100, "rows": 30}, nil)
	if rs.Pty == nil || rs.Pty.Cols != 100 || rs.Pty.Rows != 30 {
		t.Fatalf("resize: %+v", rs)
	}
	c.write(t, sb.ID, sz.ID, "\n", 0, false)
	outputMatching(t, c, sb.ID, sz.ID, regexp.MustCompile(`30 100\r\n`))

	// python3 -i through the terminal WebSocket.
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	term := dialTerminal(t, ctx, c, sb.ID, url.Values{"command": {"python3 -i"}, "cols": {"80"}, "rows": {"24"}})
	pid := terminalReady(t, ctx, term)
	terminalUntil(t, ctx, term, ">>> ")
	if err := term.Write(ctx, websocket.MessageBinary, []byte("1+1\n")); err != nil {
		t.Fatal(err)
	}
	terminalUntil(t, ctx, term, "2\r\n>>> ")
	term.Close(websocket.StatusNormalClosure, "")
	// The program outlives the socket; a new one attaches to it.
	if p, _ := call[inputProcessJSON](t, c, "GET", base+"/processes/"+pid, nil, nil); p.State != "running" || p.Pty == nil {
		t.Fatalf("after the socket closed: %+v", p)
	}
	term = dialTerminal(t, ctx, c, sb.ID, url.Values{"processId": {pid}})
	if again := terminalReady(t, ctx, term); again != pid {
		t.Fatalf("reattached to %s, want %s", again, pid)
	}
	terminalUntil(t, ctx, term, "1+1\r\n2\r\n>>> ") // replayed
	if err := term.Write(ctx, websocket.MessageBinary, []byte("exit(7)\n")); err != nil {
		t.Fatal(err)
	}
	for {
		typ, b, err := term.Read(ctx)
		if err != nil {
			t.Fatalf("no exit frame: %v", err)
		}
		if typ != websocket.MessageText {
			continue
		}
		var ev map[string]any
		if err := json.Unmarshal(b, &ev); err != nil || ev["type"] != "exit" || ev["exitCode"] != 7.0 {
			t.Fatalf("text frame %s, want exit 7", b)
		}
		break
	}
	if _, _, err := term.Read(ctx); websocket.CloseStatus(err) != websocket.StatusNormalClosure {
		t.Fatalf("after the exit: %v, want a normal closure", err)
	}
}

func dialTerminal(t *testing.T, ctx context.Context, c *client, id string, q url.Values) *websocket.Conn {
	t.Helper()
	u := strings.Replace(c.s.URL, "http", "ws", 1) + "/v1/sandboxes/" + id + "/terminal?" + q.Encode()
	conn, resp, err := websocket.Dial(ctx, u, &websocket.DialOptions{HTTPHeader: http.Header{"Authorization": {"Bearer " + c.key}}})
	if err != nil {
		t.Fatalf("terminal: %v (%v)", err, resp)
	}
	conn.SetReadLimit(4 << 20)
	t.Cleanup(func() { conn.CloseNow() })
	return conn
}

// terminalReady reads the ready frame and returns its process id.
func terminalReady(t *testing.T, ctx context.Context, conn *websocket.Conn) string {
	t.Helper()
	typ, b, err := conn.Read(ctx)
	var ev struct {
		Type      string `json:"type"`
		ProcessID string `json:"processId"`
	}
	if err != nil || typ != websocket.MessageText || json.Unmarshal(b, &ev) != nil || ev.Type != "ready" || ev.ProcessID == "" {
		t.Fatalf("first frame %v %q %v, want ready", typ, b, err)
	}
	return ev.ProcessID
}

// terminalUntil reads the terminal's bytes until they contain want.
func terminalUntil(t *testing.T, ctx context.Context, conn *websocket.Conn, want string) {
	t.Helper()
	var got bytes.Buffer
	for !strings.Contains(got.String(), want) {
		typ, b, err := conn.Read(ctx)
		if err != nil {
			t.Fatalf("waiting for %q: %v; got %q", want, err, got.String())
		}
		if typ == websocket.MessageBinary {
			got.Write(b)
		}
	}
}

// terminalToExit reads the terminal's bytes until its exit frame and
// returns them with the exit code.
func terminalToExit(t *testing.T, ctx context.Context, conn *websocket.Conn) (string, int) {
	t.Helper()
	var got bytes.Buffer
	for {
		typ, b, err := conn.Read(ctx)
		if err != nil {
			t.Fatalf("waiting for the exit frame: %v; got %q", err, got.String())
		}
		if typ == websocket.MessageBinary {
			got.Write(b)
			continue
		}
		var ev struct {
			Type     string `json:"type"`
			ExitCode *int   `json:"exitCode"`
		}
		if err := json.Unmarshal(b, &ev); err != nil {
			t.Fatalf("text frame %q: %v", b, err)
		}
		if ev.Type == "exit" {
			if ev.ExitCode == nil {
				return got.String(), -1
			}
			return got.String(), *ev.ExitCode
		}
	}
}
