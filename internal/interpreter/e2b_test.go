package interpreter

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"strings"
	"testing"

	"github.com/emberbox/emberbox/internal/sandbox"
)

// e2bServer serves E2BHandler as the router would: with the sandbox in
// the request's context.
func e2bServer(t *testing.T, s *Service, sb *sandbox.Sandbox, g *fakeGuest) *httptest.Server {
	t.Helper()
	h := s.E2BHandler()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.ServeHTTP(w, r.WithContext(sandbox.WithRouted(r.Context(), sandbox.Routed{Sandbox: sb, Guest: g.handle()})))
	}))
	t.Cleanup(srv.Close)
	return srv
}

// execute posts body to /execute and returns the status and NDJSON lines.
func execute(t *testing.T, url, body string) (int, []map[string]any) {
	t.Helper()
	resp, err := http.Post(url+"/execute", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return resp.StatusCode, nil
	}
	if ct := resp.Header.Get("Content-Type"); ct != "application/x-ndjson" {
		t.Errorf("Content-Type %q", ct)
	}
	var lines []map[string]any
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var m map[string]any
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatalf("line %q: %v", sc.Text(), err)
		}
		lines = append(lines, m)
	}
	return resp.StatusCode, lines
}

func types(lines []map[string]any) string {
	var out []string
	for _, l := range lines {
		out = append(out, l["type"].(string))
	}
	return strings.Join(out, ",")
}

func TestE2BExecuteLines(t *testing.T) {
	s, sb, g := newTestService(t)
	srv := e2bServer(t, s, sb, g)

	status, lines := execute(t, srv.URL, `{"code":"print hi","context_id":null,"language":null,"env_vars":null}`)
	if status != 200 || types(lines) != "number_of_executions,stdout,stderr,end_of_execution" {
		t.Fatalf("print: %d %v", status, lines)
	}
	if lines[0]["execution_count"] != 1.0 || lines[1]["text"] != "hi\n" {
		t.Errorf("print lines %v", lines)
	}
	if ts, ok := lines[1]["timestamp"].(float64); !ok || ts < 1e18 {
		t.Errorf("timestamp %v, want Unix nanoseconds", lines[1]["timestamp"])
	}

	_, lines = execute(t, srv.URL, `{"code":"plot"}`)
	if types(lines) != "number_of_executions,result,result,end_of_execution" {
		t.Fatalf("plot: %v", lines)
	}
	fig, main := lines[1], lines[2]
	if fig["is_main_result"] != false || fig["png"] != "iVBORw0KGgo=" || fig["text"] != "<Figure>" {
		t.Errorf("figure line %v", fig)
	}
	if extra, _ := fig["extra"].(map[string]any); extra["application/vnd.custom"] == nil {
		t.Errorf("unknown MIME types belong in extra: %v", fig)
	}
	if main["is_main_result"] != true || main["html"] != "<table></table>" {
		t.Errorf("main line %v", main)
	}
	if j, _ := main["json"].(map[string]any); j["x"] != 1.0 {
		t.Errorf("application/json is an object in json: %v", main["json"])
	}

	execute(t, srv.URL, `{"code":"set s hello"}`)
	_, lines = execute(t, srv.URL, `{"code":"get s"}`)
	if lines[1]["text"] != "hello" {
		t.Errorf("a string's repr loses its quotes as E2B's does: %v", lines[1])
	}

	_, lines = execute(t, srv.URL, `{"code":"raise"}`)
	if types(lines) != "number_of_executions,error,end_of_execution" || lines[1]["name"] != "ValueError" ||
		lines[1]["value"] != "bad" || !strings.Contains(lines[1]["traceback"].(string), "ValueError: bad") {
		t.Errorf("raise: %v", lines)
	}
}

func TestE2BExecuteRefusals(t *testing.T) {
	s, sb, g := newTestService(t)
	srv := e2bServer(t, s, sb, g)
	if status, _ := execute(t, srv.URL, `{"code":"1","context_id":"nope"}`); status != 404 {
		t.Errorf("unknown context: %d, want 404 (e2b's NotFoundException)", status)
	}
	if status, _ := execute(t, srv.URL, `{"code":"1","language":"r"}`); status != 400 {
		t.Errorf("language r: %d, want 400", status)
	}
	if status, _ := execute(t, srv.URL, `{"context_id":null}`); status != 400 {
		t.Errorf("no code: %d, want 400", status)
	}
	if status, _ := execute(t, srv.URL, `[1`); status != 400 {
		t.Errorf("bad JSON: %d, want 400", status)
	}
	resp, err := http.Post(httptest.NewServer(s.E2BHandler()).URL+"/execute", "application/json", strings.NewReader(`{"code":"1"}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadGateway {
		t.Errorf("no routed sandbox: %d", resp.StatusCode)
	}
}

func TestE2BContexts(t *testing.T) {
	s, sb, g := newTestService(t)
	srv := e2bServer(t, s, sb, g)
	resp, err := http.Post(srv.URL+"/contexts", "application/json", strings.NewReader(`{"language":"python","cwd":"/tmp"}`))
	if err != nil {
		t.Fatal(err)
	}
	var made struct{ ID, Language, Cwd string }
	_ = json.NewDecoder(resp.Body).Decode(&made)
	resp.Body.Close()
	// The fake bridge always reports /workspace: the cwd is what the
	// kernel says it runs in.
	if resp.StatusCode != 200 || made.ID == "" || made.Language != "python" || made.Cwd != "/workspace" {
		t.Fatalf("create: %d %+v", resp.StatusCode, made)
	}
	if g.spawned[0].Cwd != "/tmp" {
		t.Errorf("bridge cwd %q, want /tmp", g.spawned[0].Cwd)
	}
	_, lines := execute(t, srv.URL, `{"code":"set k v","context_id":"`+made.ID+`"}`)
	if types(lines) != "number_of_executions,end_of_execution" {
		t.Errorf("run in context: %v", lines)
	}

	resp, _ = http.Get(srv.URL + "/contexts")
	var list []map[string]string
	_ = json.NewDecoder(resp.Body).Decode(&list)
	resp.Body.Close()
	if len(list) != 1 || list[0]["id"] != made.ID || list[0]["language"] != "python" || list[0]["cwd"] == "" {
		t.Errorf("list: %v", list)
	}

	req, _ := http.NewRequest("POST", srv.URL+"/contexts/"+made.ID+"/restart", nil)
	resp, _ = http.DefaultClient.Do(req)
	resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		t.Errorf("restart: %d", resp.StatusCode)
	}
	_, lines = execute(t, srv.URL, `{"code":"get k","context_id":"`+made.ID+`"}`)
	if types(lines) != "number_of_executions,error,end_of_execution" {
		t.Errorf("state after restart: %v", lines)
	}

	for _, want := range []int{204, 404} {
		req, _ = http.NewRequest("DELETE", srv.URL+"/contexts/"+made.ID, nil)
		resp, _ = http.DefaultClient.Do(req)
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Errorf("delete: %d, want %d", resp.StatusCode, want)
		}
	}
	req, _ = http.NewRequest("POST", srv.URL+"/contexts/nope/restart", nil)
	resp, _ = http.DefaultClient.Do(req)
	resp.Body.Close()
	if resp.StatusCode != 404 {
		t.Errorf("restart unknown: %d", resp.StatusCode)
	}
	resp, _ = http.Get(srv.URL + "/health")
	var b bytes.Buffer
	_, _ = b.ReadFrom(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Errorf("health: %d", resp.StatusCode)
	}
}

// parseWithE2B is a Python program that reads /execute bodies (one per
// line of JSON strings on stdin) with e2b_code_interpreter's own parser
// and prints what its Execution holds.
const parseWithE2B = `
import json, sys
from e2b_code_interpreter.models import Execution, parse_output
out = []
for body in sys.stdin:
    ex = Execution()
    for line in json.loads(body).splitlines():
        parse_output(ex, line)
    out.append({
        "stdout": ex.logs.stdout, "stderr": ex.logs.stderr, "count": ex.execution_count, "text": ex.text,
        "results": [{"formats": sorted(r.formats()), "main": r.is_main_result, "png": r.png, "json": r.json}
                    for r in ex.results],
        "error": ex.error and {"name": ex.error.name, "value": ex.error.value, "traceback": ex.error.traceback},
    })
print(json.dumps(out))
`

// TestE2BLinesParseWithTheRealClient feeds the lines to the parser of the
// installed e2b_code_interpreter package (skipped where it is missing).
func TestE2BLinesParseWithTheRealClient(t *testing.T) {
	if err := exec.Command("python3", "-c", "import e2b_code_interpreter").Run(); err != nil {
		t.Skip("python3 cannot import e2b_code_interpreter")
	}
	s, sb, g := newTestService(t)
	srv := e2bServer(t, s, sb, g)
	var stdin bytes.Buffer
	for _, code := range []string{"print hi", "plot", "raise"} {
		resp, err := http.Post(srv.URL+"/execute", "application/json", strings.NewReader(`{"code":"`+code+`"}`))
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		line, _ := json.Marshal(string(body))
		stdin.Write(append(line, '\n'))
	}
	cmd := exec.Command("python3", "-c", parseWithE2B)
	cmd.Stdin = &stdin
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("e2b_code_interpreter's parser: %v\n%s", err, out)
	}
	type parsed struct {
		Stdout, Stderr []string
		Count          int
		Text           *string
		Results        []struct {
			Formats []string
			Main    bool
			PNG     *string
			JSON    map[string]any
		}
		Error *struct{ Name, Value, Traceback string }
	}
	var got []parsed
	if err := json.Unmarshal(out, &got); err != nil || len(got) != 3 {
		t.Fatalf("parser output %s: %v", out, err)
	}
	if p := got[0]; strings.Join(p.Stdout, "") != "hi\n" || strings.Join(p.Stderr, "") != "warn\n" || p.Count != 1 || p.Error != nil {
		t.Errorf("print: %+v", p)
	}
	p := got[1]
	if len(p.Results) != 2 || p.Results[0].Main || p.Results[0].PNG == nil || *p.Results[0].PNG != "iVBORw0KGgo=" ||
		!p.Results[1].Main || p.Results[1].JSON["x"] != 1.0 || p.Text == nil || *p.Text != "df" {
		t.Errorf("plot: %s", out)
	}
	if f := strings.Join(p.Results[0].Formats, ","); f != "application/vnd.custom,png,text" {
		t.Errorf("figure formats %s", f)
	}
	if p := got[2]; p.Error == nil || p.Error.Name != "ValueError" || p.Error.Value != "bad" || p.Count != 3 {
		t.Errorf("raise: %+v", p)
	}
}
