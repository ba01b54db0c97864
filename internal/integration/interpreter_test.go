package integration

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/emberbox/emberbox/internal/guest"
	"github.com/emberbox/emberbox/internal/interpreter"
	"github.com/emberbox/emberbox/internal/sandbox"
)

// executionJSON is an interpreter run's answer.
type executionJSON struct {
	Status  string `json:"status"`
	Context string `json:"context"`
	Stdout  string `json:"stdout"`
	Stderr  string `json:"stderr"`
	Results []struct {
		Main bool                       `json:"main"`
		Data map[string]json.RawMessage `json:"data"`
		Refs map[string]any             `json:"refs"`
	} `json:"results"`
	Error *struct {
		Name      string `json:"name"`
		Value     string `json:"value"`
		Traceback string `json:"traceback"`
	} `json:"error"`
	ExecutionCount int   `json:"executionCount"`
	DurationMs     int64 `json:"durationMs"`
}

// text returns a result's MIME value as a string ("" if absent).
func mimeText(data map[string]json.RawMessage, mime string) string {
	var s string
	_ = json.Unmarshal(data[mime], &s)
	return s
}

// interpreterTimeout bounds one run; the first starts the kernel, slow
// under TCG.
const interpreterTimeout = 10 * time.Minute

func runCode(t *testing.T, c *client, id string, body map[string]any) executionJSON {
	t.Helper()
	r := c.raw(t, "POST", "/v1/sandboxes/"+id+"/interpreter:run", body, nil, interpreterTimeout)
	if r.err != nil || r.Status != http.StatusOK {
		t.Fatalf("run %q: %v", body["code"], r)
	}
	var ex executionJSON
	if err := json.Unmarshal(r.Body, &ex); err != nil {
		t.Fatalf("run: decoding %s: %v", r.Body, err)
	}
	return ex
}

// TestInterpreter drives the code interpreter of one real VM through the
// Runtime routes: state across runs, !pip install from PyPI, a matplotlib
// figure as image/png, a DataFrame as text/html, display(), exceptions,
// interrupts (timeout, call, client gone), streaming, isolated contexts,
// and contexts forgotten when the sandbox stops.
func TestInterpreter(t *testing.T) {
	needVMs(t)
	s := startServerWith(t, t.TempDir())
	c := s.client(s.AdminKey)
	sb := c.createRunning(t, map[string]any{"network": map[string]any{"internet": true,
		"allow": []string{"pypi.org", "*.pythonhosted.org"}}})
	base := "/v1/sandboxes/" + sb.ID + "/interpreter"

	t.Run("state", func(t *testing.T) {
		start := time.Now()
		ex := runCode(t, c, sb.ID, map[string]any{"code": "x = 41\nprint('hello')"})
		t.Logf("first run (kernel start) took %s", time.Since(start))
		if ex.Status != "ok" || ex.Stdout != "hello\n" || ex.Context != "python" || len(ex.Results) != 0 {
			t.Fatalf("first run: %+v", ex)
		}
		ex = runCode(t, c, sb.ID, map[string]any{"code": "x + 1"})
		if ex.Status != "ok" || len(ex.Results) != 1 || !ex.Results[0].Main || mimeText(ex.Results[0].Data, "text/plain") != "42" {
			t.Fatalf("x + 1: %+v", ex)
		}
		if ex.ExecutionCount != 2 {
			t.Errorf("executionCount %d, want 2", ex.ExecutionCount)
		}
		ex = runCode(t, c, sb.ID, map[string]any{"code": "import os; print(os.getcwd(), os.getuid())\n!echo from-shell $HOME"})
		// A ! line runs on a pty (IPython's pexpect), hence \r\n.
		if strings.ReplaceAll(ex.Stdout, "\r\n", "\n") != "/workspace 1000\nfrom-shell /workspace\n" {
			t.Errorf("cwd, user and a ! line: %q %+v", ex.Stdout, ex.Error)
		}
	})

	t.Run("pip", func(t *testing.T) {
		hc := &http.Client{Timeout: 15 * time.Second}
		resp, err := hc.Get("https://pypi.org/simple/tabulate/")
		if err != nil {
			t.Skipf("PyPI is not reachable from this host: %v", err)
		}
		resp.Body.Close()
		ex := runCode(t, c, sb.ID, map[string]any{"code": "!pip install --disable-pip-version-check tabulate", "timeoutMs": 480_000})
		if ex.Status != "ok" || !strings.Contains(ex.Stdout, "Successfully installed tabulate") {
			t.Fatalf("!pip install: %+v", ex)
		}
		ex = runCode(t, c, sb.ID, map[string]any{"code": "import tabulate\nprint(tabulate.tabulate([[1, 2]]))"})
		if ex.Status != "ok" || !strings.Contains(ex.Stdout, "1  2") {
			t.Errorf("import after install in the same kernel: %+v %+v", ex, ex.Error)
		}
	})

	t.Run("rich", func(t *testing.T) {
		ex := runCode(t, c, sb.ID, map[string]any{"code": "import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.title('t')\nplt.show()",
			"timeoutMs": 300_000})
		if ex.Status != "ok" || len(ex.Results) != 1 || ex.Results[0].Main {
			t.Fatalf("matplotlib: %+v %+v", ex, ex.Error)
		}
		png, err := base64.StdEncoding.DecodeString(strings.TrimSpace(mimeText(ex.Results[0].Data, "image/png")))
		if err != nil || !bytes.HasPrefix(png, []byte("\x89PNG\r\n\x1a\n")) {
			t.Errorf("image/png is not a base64 PNG (%v): %.40q", err, png)
		}
		ex = runCode(t, c, sb.ID, map[string]any{"code": "fig, ax = plt.subplots()\nax.bar([1, 2], [3, 4])\nplt.close(fig)\nfig"})
		if len(ex.Results) != 1 || !ex.Results[0].Main || ex.Results[0].Data["image/png"] == nil {
			t.Errorf("a figure as the cell's value: %+v", ex)
		}
		ex = runCode(t, c, sb.ID, map[string]any{"code": "import pandas as pd\npd.DataFrame({'a': [1, 2], 'b': ['x', 'y']})",
			"timeoutMs": 300_000})
		if len(ex.Results) != 1 || !ex.Results[0].Main || !strings.Contains(mimeText(ex.Results[0].Data, "text/html"), "<table") ||
			!strings.Contains(mimeText(ex.Results[0].Data, "text/plain"), "a  b") {
			t.Errorf("DataFrame: %+v %+v", ex, ex.Error)
		}
		ex = runCode(t, c, sb.ID, map[string]any{"code": "from IPython.display import display, HTML, JSON\n" +
			"display(HTML('<b>bold</b>'))\ndisplay(JSON({'k': [1, 2]}))\n'done'"})
		if len(ex.Results) != 3 || ex.Results[0].Main || ex.Results[1].Main || !ex.Results[2].Main {
			t.Fatalf("display: %+v", ex)
		}
		if mimeText(ex.Results[0].Data, "text/html") != "<b>bold</b>" {
			t.Errorf("display(HTML): %s", ex.Results[0].Data)
		}
		var j map[string][]int
		if json.Unmarshal(ex.Results[1].Data["application/json"], &j) != nil || len(j["k"]) != 2 {
			t.Errorf("display(JSON): %s", ex.Results[1].Data)
		}
	})

	t.Run("errors", func(t *testing.T) {
		ex := runCode(t, c, sb.ID, map[string]any{"code": "def f():\n    return 1 / 0\nf()"})
		if ex.Status != "error" || ex.Error == nil || ex.Error.Name != "ZeroDivisionError" || ex.Error.Value != "division by zero" ||
			!strings.Contains(ex.Error.Traceback, "return 1 / 0") || strings.Contains(ex.Error.Traceback, "\x1b[") {
			t.Fatalf("exception: %+v %+v", ex, ex.Error)
		}
		ex = runCode(t, c, sb.ID, map[string]any{"code": "x"})
		if ex.Status != "ok" || mimeText(ex.Results[0].Data, "text/plain") != "41" {
			t.Errorf("state after an exception: %+v", ex)
		}
		r := c.raw(t, "POST", base+":run", map[string]any{"code": "1", "language": "r"}, nil, requestTimeout)
		if r.Status != http.StatusBadRequest || r.Err == nil || r.Err.Code != "language_unsupported" {
			t.Errorf("language r: %v", r)
		}
	})

	t.Run("interrupts", func(t *testing.T) {
		start := time.Now()
		ex := runCode(t, c, sb.ID, map[string]any{"code": "import time\nx = 7\ntime.sleep(120)", "timeoutMs": 3000})
		if ex.Status != "timeout" || ex.Error == nil || ex.Error.Name != "KeyboardInterrupt" || time.Since(start) > 90*time.Second {
			t.Fatalf("timeout: %+v after %s", ex, time.Since(start))
		}
		ex = runCode(t, c, sb.ID, map[string]any{"code": "x"})
		if mimeText(ex.Results[0].Data, "text/plain") != "7" {
			t.Errorf("state after a timeout: %+v", ex)
		}

		// :interrupt stops the running cell.
		done := make(chan executionJSON, 1)
		go func() {
			done <- runCode(t, c, sb.ID, map[string]any{"code": "import time\ntime.sleep(120)", "timeoutMs": 0})
		}()
		if !waitUntil(60*time.Second, 200*time.Millisecond, func() bool {
			v, _ := call[map[string]bool](t, c, "POST", base+"/contexts/python:interrupt", map[string]any{}, nil)
			return v["interrupted"]
		}) {
			t.Fatal(":interrupt never found the cell running")
		}
		select {
		case ex := <-done:
			if ex.Status != "interrupted" {
				t.Errorf("interrupted cell: %+v", ex)
			}
		case <-time.After(90 * time.Second):
			t.Fatal("the interrupted cell did not end")
		}

		// A client that goes away interrupts its cell: the context is
		// free for the next run at once.
		r := c.raw(t, "POST", base+":run", map[string]any{"code": "import time\ntime.sleep(300)", "timeoutMs": 0}, nil, 5*time.Second)
		if r.err == nil {
			t.Fatalf("a 300 s cell answered within 5 s: %v", r)
		}
		start = time.Now()
		ex = runCode(t, c, sb.ID, map[string]any{"code": "'free'", "timeoutMs": 60_000})
		if ex.Status != "ok" || time.Since(start) > 60*time.Second {
			t.Errorf("after a gone client: %+v in %s", ex, time.Since(start))
		}
	})

	t.Run("stream", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), interpreterTimeout)
		defer cancel()
		body, _ := json.Marshal(map[string]any{"code": "print('a')\nimport sys; print('b', file=sys.stderr)\n1 + 1\n1/0", "stream": true})
		req, _ := http.NewRequestWithContext(ctx, "POST", s.URL+base+":run", bytes.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+s.AdminKey)
		req.Header.Set("Content-Type", "application/json")
		resp, err := c.hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "application/x-ndjson" {
			t.Fatalf("stream: %d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
		}
		var kinds []string
		var last map[string]json.RawMessage
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			var line map[string]json.RawMessage
			if err := json.Unmarshal(sc.Bytes(), &line); err != nil {
				t.Fatalf("line %q: %v", sc.Text(), err)
			}
			var k string
			_ = json.Unmarshal(line["k"], &k)
			kinds = append(kinds, k)
			last = line
		}
		// 1/0 stops the cell, so "1 + 1" (not the last line) shows nothing.
		if got := strings.Join(kinds, ","); got != "stdout,stderr,error,execution" {
			t.Errorf("stream kinds %s", got)
		}
		var ex executionJSON
		if err := json.Unmarshal(last["execution"], &ex); err != nil || ex.Status != "error" || ex.Stdout != "a\n" || ex.Stderr != "b\n" {
			t.Errorf("stream's execution: %s %v", last["execution"], err)
		}
	})

	t.Run("contexts", func(t *testing.T) {
		made, r := call[map[string]any](t, c, "POST", base+"/contexts",
			map[string]any{"id": "iso", "cwd": "/tmp", "env": map[string]string{"GREETING": "hej"}}, nil)
		_ = r
		if made["id"] != "iso" || made["cwd"] != "/tmp" || made["language"] != "python" {
			t.Fatalf("create: %v", made)
		}
		ex := runCode(t, c, sb.ID, map[string]any{"code": "import os\nprint(os.getcwd(), os.environ['GREETING'])\nx", "context": "iso"})
		if ex.Stdout != "/tmp hej\n" || ex.Error == nil || ex.Error.Name != "NameError" {
			t.Errorf("a new context shares nothing: %+v %+v", ex, ex.Error)
		}
		runCode(t, c, sb.ID, map[string]any{"code": "y = 5", "context": "iso"})
		list, _ := call[struct {
			Data []map[string]any `json:"data"`
		}](t, c, "GET", base+"/contexts", nil, nil)
		if len(list.Data) != 2 || list.Data[0]["id"] != "python" || list.Data[1]["id"] != "iso" {
			t.Errorf("list: %v", list.Data)
		}
		if _, r := call[map[string]any](t, c, "POST", base+"/contexts/iso:restart", map[string]any{}, nil); r.Status != 200 {
			t.Errorf("restart: %v", r)
		}
		ex = runCode(t, c, sb.ID, map[string]any{"code": "y", "context": "iso"})
		if ex.Error == nil || ex.Error.Name != "NameError" {
			t.Errorf("state after restart: %+v", ex)
		}
		del, _ := call[map[string]bool](t, c, "DELETE", base+"/contexts/iso", nil, nil)
		if !del["deleted"] {
			t.Errorf("delete: %v", del)
		}
		r = c.raw(t, "POST", base+":run", map[string]any{"code": "1", "context": "iso"}, nil, requestTimeout)
		if r.Status != http.StatusNotFound || r.Err.Code != "context_not_found" {
			t.Errorf("run in a deleted context: %v", r)
		}
	})

	t.Run("paused sandbox keeps contexts", func(t *testing.T) {
		runCode(t, c, sb.ID, map[string]any{"code": "kept = 'across a pause'"})
		if _, r := call[map[string]any](t, c, "POST", base+"/contexts", map[string]any{"id": "side"}, nil); r.Status != 200 {
			t.Fatalf("create: %v", r)
		}
		runCode(t, c, sb.ID, map[string]any{"code": "side = 3", "context": "side"})
		r := c.raw(t, "POST", "/v1/sandboxes/"+sb.ID+":pause", map[string]any{}, http.Header{"Prefer": {"wait=120"}}, requestTimeout)
		if r.Status != http.StatusOK {
			t.Fatalf("pause: %v", r)
		}
		c.waitState(t, sb.ID, "paused")
		// The run wakes the sandbox (autoWake) and connects to the kernel
		// that was paused with it.
		ex := runCode(t, c, sb.ID, map[string]any{"code": "kept"})
		if ex.Status != "ok" || mimeText(ex.Results[0].Data, "text/plain") != "'across a pause'" {
			t.Fatalf("after a wake: %+v %+v", ex, ex.Error)
		}
		list, _ := call[struct {
			Data []map[string]any `json:"data"`
		}](t, c, "GET", base+"/contexts", nil, nil)
		if len(list.Data) != 2 {
			t.Errorf("contexts after a wake: %v", list.Data)
		}
		ex = runCode(t, c, sb.ID, map[string]any{"code": "side", "context": "side"})
		if mimeText(ex.Results[0].Data, "text/plain") != "3" {
			t.Errorf("a created context after a wake: %+v", ex)
		}
	})

	t.Run("stopped sandbox forgets contexts", func(t *testing.T) {
		r := c.raw(t, "POST", "/v1/sandboxes/"+sb.ID+":stop", map[string]any{}, http.Header{"Prefer": {"wait=60"}}, requestTimeout)
		if r.Status != http.StatusOK {
			t.Fatalf("stop: %v", r)
		}
		c.waitState(t, sb.ID, "stopped")
		if r := c.raw(t, "POST", "/v1/sandboxes/"+sb.ID+":restart", map[string]any{}, http.Header{"Prefer": {"wait=60"}}, requestTimeout); r.Status != http.StatusOK {
			t.Fatalf("restart: %v", r)
		}
		c.waitState(t, sb.ID, "running")
		list, _ := call[struct {
			Data []map[string]any `json:"data"`
		}](t, c, "GET", base+"/contexts", nil, nil)
		if len(list.Data) != 0 {
			t.Errorf("contexts of the stopped VM are still listed: %v", list.Data)
		}
		ex := runCode(t, c, sb.ID, map[string]any{"code": "'x' in dir()"})
		if ex.Status != "ok" || mimeText(ex.Results[0].Data, "text/plain") != "False" {
			t.Errorf("a fresh default context: %+v", ex)
		}
	})

	t.Run("e2b handler", func(t *testing.T) {
		// E2B's code-interpreter API, served in this process by its own
		// Service, reaching the VM's guest through the Runtime API.
		g := &httpGuest{base: s.URL, key: s.AdminKey, id: sb.ID, hc: c.hc}
		h := interpreter.New(nil).E2BHandler()
		routed := sandbox.Routed{Sandbox: &sandbox.Sandbox{ID: sb.ID}, Guest: guest.Handle{ProcessRunner: g, FileSystem: g, Watcher: g, PortDialer: g}}
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			h.ServeHTTP(w, r.WithContext(sandbox.WithRouted(r.Context(), routed)))
		}))
		defer srv.Close()
		execute := func(body string) []map[string]any {
			t.Helper()
			ctx, cancel := context.WithTimeout(context.Background(), interpreterTimeout)
			defer cancel()
			req, _ := http.NewRequestWithContext(ctx, "POST", srv.URL+"/execute", strings.NewReader(body))
			req.Header.Set("Content-Type", "application/json")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			if resp.StatusCode != 200 {
				b, _ := io.ReadAll(resp.Body)
				t.Fatalf("/execute %s: %d %s", body, resp.StatusCode, b)
			}
			var lines []map[string]any
			sc := bufio.NewScanner(resp.Body)
			sc.Buffer(nil, 32<<20)
			for sc.Scan() {
				var m map[string]any
				if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
					t.Fatalf("line %q: %v", sc.Text(), err)
				}
				// The kernel's stream may come in more than one piece
				// ("None", then "\n"): consecutive stdout or stderr
				// lines are one output here.
				if n := len(lines); n > 0 && (m["type"] == "stdout" || m["type"] == "stderr") && lines[n-1]["type"] == m["type"] {
					prev, _ := lines[n-1]["text"].(string)
					next, _ := m["text"].(string)
					lines[n-1]["text"] = prev + next
					continue
				}
				lines = append(lines, m)
			}
			return lines
		}
		kinds := func(lines []map[string]any) string {
			var out []string
			for _, l := range lines {
				out = append(out, l["type"].(string))
			}
			return strings.Join(out, ",")
		}
		code, _ := json.Marshal("import matplotlib.pyplot as plt\nimport pandas as pd\nplt.plot([1, 2])\nplt.show()\n" +
			"print('out')\npd.DataFrame({'a': [1]})")
		lines := execute(`{"code":` + string(code) + `,"context_id":null,"language":null,"env_vars":{"E2B_VAR":"v"}}`)
		if got := kinds(lines); got != "number_of_executions,result,stdout,result,end_of_execution" {
			t.Fatalf("lines %s: %v", got, lines)
		}
		fig, table := lines[1], lines[3]
		if png, _ := fig["png"].(string); fig["is_main_result"] != false || !strings.HasPrefix(png, "iVBORw0KGgo") {
			t.Errorf("figure line: %.200v", fig)
		}
		if html, _ := table["html"].(string); table["is_main_result"] != true || !strings.Contains(html, "<table") {
			t.Errorf("table line: %.300v", table)
		}
		if lines[2]["text"] != "out\n" {
			t.Errorf("stdout line: %v", lines[2])
		}
		lines = execute(`{"code":"import os\nprint(os.environ.get('E2B_VAR'))\n1/0"}`)
		if got := kinds(lines); got != "number_of_executions,stdout,error,end_of_execution" || lines[1]["text"] != "None\n" ||
			lines[2]["name"] != "ZeroDivisionError" {
			t.Errorf("env_vars last one run; an error line: %v", lines)
		}
		resp, err := http.Post(srv.URL+"/contexts", "application/json", strings.NewReader(`{"language":"python","cwd":"/tmp"}`))
		if err != nil {
			t.Fatal(err)
		}
		var made map[string]string
		_ = json.NewDecoder(resp.Body).Decode(&made)
		resp.Body.Close()
		if made["cwd"] != "/tmp" || made["language"] != "python" {
			t.Fatalf("context: %v", made)
		}
		lines = execute(`{"code":"import os; os.getcwd()","context_id":"` + made["id"] + `"}`)
		if len(lines) < 2 || lines[1]["text"] != "/tmp" {
			t.Errorf("run in the context (E2B's text drops the quotes): %v", lines)
		}
	})
}
