package integration

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestAPI drives the API over plain HTTP against one sandbox shared by the
// subtests, which run in order; the last one stops it.
func TestAPI(t *testing.T) {
	needVMs(t)
	t.Parallel() // with TestLease, which mostly waits
	s := startServer(t, t.TempDir())
	c := s.client(s.AdminKey)

	start := time.Now()
	r := c.raw(t, "POST", "/v1/sandboxes", "{}", http.Header{"Prefer": {"wait=60"}}, requestTimeout)
	if r.err != nil || r.Status != http.StatusOK {
		t.Fatalf("default create: %v", r)
	}
	var sb sandboxJSON
	if err := json.Unmarshal(r.Body, &sb); err != nil || sb.ID == "" {
		t.Fatalf("default create: decoding %s: %v", r.Body, err)
	}
	t.Logf("created %s in %s (state %s, accel %v)", sb.ID, time.Since(start).Round(time.Millisecond), sb.State, deref(sb.Accel))
	id := sb.ID

	t.Run("DefaultCreate", func(t *testing.T) {
		if sb.VCPU != 2 || sb.MemoryMiB != 4096 {
			t.Errorf("default create: vcpu %d memoryMiB %d, want 2 and 4096", sb.VCPU, sb.MemoryMiB)
		}
		if sb.State != "running" || sb.Status != "active" {
			t.Errorf("default create with Prefer: wait=60 answered state %q status %q, want running/active", sb.State, sb.Status)
		}
		// Without timeoutSeconds: no lease, an idle pause instead.
		if sb.Kind != "sandbox" || sb.ReadyAt == nil || sb.ExpiresAt != nil || sb.IdlePauseSeconds != 300 || sb.StopReason != nil {
			t.Errorf("create answer: kind %q readyAt %v expiresAt %v idlePauseSeconds %d stopReason %v",
				sb.Kind, sb.ReadyAt, sb.ExpiresAt, sb.IdlePauseSeconds, sb.StopReason)
		}
		if !strings.HasPrefix(r.Header.Get("Content-Type"), "application/json") {
			t.Errorf("create Content-Type %q", r.Header.Get("Content-Type"))
		}
	})
	if sb.State != "running" {
		sb = c.waitState(t, id, "running")
	}

	t.Run("Resources", func(t *testing.T) {
		if got := strings.TrimSpace(c.sh(t, id, "nproc")); got != "2" {
			t.Errorf("nproc = %q, want 2", got)
		}
		out := c.sh(t, id, "free -m")
		total := -1
		for _, line := range strings.Split(out, "\n") {
			if f := strings.Fields(line); len(f) >= 2 && f[0] == "Mem:" {
				total, _ = strconv.Atoi(f[1])
			}
		}
		if total < 3700 || total > 4096 {
			t.Errorf("free -m total %d MiB, want 3700..4096; output:\n%s", total, out)
		}
	})

	t.Run("UserAndSudo", func(t *testing.T) {
		if got := strings.TrimSpace(c.sh(t, id, "id -un")); got != "user" {
			t.Errorf("id -un = %q, want user", got)
		}
		if got := strings.TrimSpace(c.sh(t, id, "sudo -n true && sudo -n id -un")); got != "root" {
			t.Errorf("sudo -n id -un = %q, want root", got)
		}
	})

	t.Run("Toolchains", func(t *testing.T) {
		checks := []struct{ name, cmd, want string }{
			{"python3", `python3 -c 'print(6*7)'`, "42"},
			{"node", `node -e 'console.log(6*7)'`, "42"},
			{"sqlite3", `rm -f /tmp/t.db && sqlite3 /tmp/t.db 'create table t(x); insert into t values (6*7); select x from t;'`, "42"},
		}
		for _, ck := range checks {
			if got := strings.TrimSpace(c.sh(t, id, ck.cmd)); got != ck.want {
				t.Errorf("%s: %q printed %q, want %q", ck.name, ck.cmd, got, ck.want)
			}
		}
		if got := c.sh(t, id, "pip --version"); !strings.HasPrefix(got, "pip ") || !strings.Contains(got, "python 3") {
			t.Errorf("pip --version printed %q", got)
		}

		c.writeFile(t, id, "/workspace/chello/hello.c", []byte("#include <stdio.h>\nint main(void) { printf(\"hello from c %d\\n\", 6*7); return 0; }\n"))
		if got := strings.TrimSpace(c.sh(t, id, "cd /workspace/chello && gcc -O1 -o hello hello.c && ./hello")); got != "hello from c 42" {
			t.Errorf("gcc program printed %q", got)
		}

		c.writeFile(t, id, "/workspace/gohello/go.mod", []byte("module gohello\n\ngo 1.19\n"))
		c.writeFile(t, id, "/workspace/gohello/main.go", []byte("package main\n\nimport \"fmt\"\n\nfunc main() { fmt.Println(\"hello from go\", 6*7) }\n"))
		began := time.Now()
		res, _ := c.exec(t, id, execReq{Command: "cd /workspace/gohello && go build -o hello . && ./hello", TimeoutMs: 5 * 60 * 1000})
		if res.ExitCode == nil || *res.ExitCode != 0 || strings.TrimSpace(res.Stdout) != "hello from go 42" {
			t.Errorf("go build: exit %s stdout %q stderr %q", res.exit(), res.Stdout, res.Stderr)
		}
		t.Logf("go build and run took %s", time.Since(began).Round(time.Millisecond))
	})

	t.Run("FileAcrossCalls", func(t *testing.T) {
		want := []byte("written in one call, read in another\n")
		c.writeFile(t, id, "/workspace/notes/a.txt", want)
		got, _ := c.readFile(t, id, "/workspace/notes/a.txt")
		if !bytes.Equal(got, want) {
			t.Errorf("read back %q, want %q", got, want)
		}
		if out := c.sh(t, id, "cat notes/a.txt"); out != string(want) {
			t.Errorf("cat in the guest printed %q, want %q", out, want)
		}
		// And the other way: written by a command, read through the API.
		c.sh(t, id, "printf 'from the shell\\n' > /workspace/notes/b.txt")
		if got, _ := c.readFile(t, id, "notes/b.txt"); string(got) != "from the shell\n" {
			t.Errorf("file written by a command read back %q", got)
		}
	})

	t.Run("BinaryRoundTrip", func(t *testing.T) {
		data := make([]byte, 512<<10)
		for i := range 256 {
			data[i] = byte(i)
		}
		rng := rand.NewChaCha8([32]byte{1, 2, 3})
		_, _ = rng.Read(data[256:])
		sum := sha256.Sum256(data)
		wantSum := hex.EncodeToString(sum[:])

		c.writeFile(t, id, "/workspace/bin/blob", data)
		got, r := c.readFile(t, id, "/workspace/bin/blob")
		if !bytes.Equal(got, data) {
			t.Errorf("read back %d bytes that differ from the %d written (first difference at %d)", len(got), len(data), firstDiff(got, data))
		}
		if h := r.Header.Get("x-content-sha256"); h != wantSum {
			t.Errorf("x-content-sha256 %q, want %q", h, wantSum)
		}
		if h := r.Header.Get("x-content-length"); h != strconv.Itoa(len(data)) {
			t.Errorf("x-content-length %q, want %d", h, len(data))
		}
		if out := strings.Fields(c.sh(t, id, "sha256sum /workspace/bin/blob")); len(out) == 0 || out[0] != wantSum {
			t.Errorf("sha256sum in the guest: %v, want %s", out, wantSum)
		}
	})

	t.Run("MissingFile", func(t *testing.T) {
		r := c.raw(t, "GET", filePath(id, "/workspace/no/such/file.txt"), nil, nil, requestTimeout)
		if r.Status != http.StatusNotFound || r.Err == nil || r.Err.Code != "file_not_found" {
			t.Errorf("missing file: %v, want 404 file_not_found", r)
		}
	})

	t.Run("BackgroundServer", func(t *testing.T) {
		p := c.spawn(t, id, "python3 -m http.server 8000")
		if p.State != "running" {
			t.Errorf("spawned process is %q", p.State)
		}
		var last execResult
		ok := waitUntil(90*time.Second, 250*time.Millisecond, func() bool {
			last, _ = c.exec(t, id, execReq{Command: "curl -sS --max-time 5 -o /dev/null -w '%{http_code}' http://127.0.0.1:8000/", TimeoutMs: 20000})
			return last.ExitCode != nil && *last.ExitCode == 0 && last.Stdout == "200"
		})
		if !ok {
			t.Fatalf("the background http.server never answered curl: last exit %s stdout %q stderr %q", last.exit(), last.Stdout, last.Stderr)
		}
		found := false
		for _, q := range c.processes(t, id) {
			if q.ID == p.ID {
				found = true
				if q.State != "running" {
					t.Errorf("process %s is %q after serving, want running", p.ID, q.State)
				}
			}
		}
		if !found {
			t.Errorf("process %s is not listed", p.ID)
		}
	})

	t.Run("Timeout", func(t *testing.T) {
		began := time.Now()
		res, r := c.exec(t, id, execReq{Command: "sleep 30", TimeoutMs: 2000})
		took := time.Since(began)
		if !res.TimedOut || res.ExitCode != nil {
			t.Errorf("sleep 30 with timeoutMs 2000: timedOut %v exitCode %s, want true and null", res.TimedOut, res.exit())
		}
		if !bytes.Contains(r.Body, []byte(`"exitCode":null`)) {
			t.Errorf("answer does not carry exitCode null: %s", r.Body)
		}
		if took >= 20*time.Second {
			t.Errorf("a 2 s timeout took %s to answer", took)
		}
		t.Logf("timed-out exec answered after %s (durationMs %d)", took.Round(time.Millisecond), res.DurationMs)
	})

	t.Run("Truncation", func(t *testing.T) {
		res, _ := c.exec(t, id, execReq{Command: `python3 -c "import sys; sys.stdout.write('x' * (10 << 20))"`})
		if !res.StdoutTruncated || len(res.Stdout) != 65536 {
			t.Errorf("10 MiB print: stdoutTruncated %v, %d bytes; want true and 65536", res.StdoutTruncated, len(res.Stdout))
		}
		if strings.Trim(res.Stdout, "x") != "" {
			t.Errorf("kept stdout is not all x")
		}
		t.Logf("10 MiB print: exit %s in %d ms", res.exit(), res.DurationMs)
	})

	t.Run("StreamNDJSON", func(t *testing.T) {
		cmd := "for i in $(seq 1 40); do echo out$i; echo err$i >&2; done; exit 3"
		r := c.raw(t, "POST", "/v1/sandboxes/"+id+":exec", execReq{Command: cmd, Stream: true}, nil, requestTimeout)
		if r.err != nil || r.Status != http.StatusOK {
			t.Fatalf("streamed exec: %v", r)
		}
		if ct := r.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/x-ndjson") {
			t.Errorf("Content-Type %q, want application/x-ndjson", ct)
		}
		var events []streamEvent
		sc := bufio.NewScanner(bytes.NewReader(r.Body))
		for sc.Scan() {
			if len(bytes.TrimSpace(sc.Bytes())) == 0 {
				continue
			}
			var ev streamEvent
			if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
				t.Fatalf("line %q is not JSON: %v", sc.Text(), err)
			}
			events = append(events, ev)
		}
		if len(events) < 3 {
			t.Fatalf("only %d events: %s", len(events), r.Body)
		}
		if events[0].Type != "start" || events[0].ProcessID == "" {
			t.Errorf("first event %+v, want start with a processId", events[0])
		}
		last := events[len(events)-1]
		if last.Type != "exit" || last.ExitCode == nil || *last.ExitCode != 3 {
			t.Errorf("last event %s, want exit with exitCode 3", mustJSON(last))
		}
		var next int64
		var stdout, stderr strings.Builder
		for i, ev := range events[1 : len(events)-1] {
			switch ev.Type {
			case "stdout", "stderr":
				if ev.Offset == nil || *ev.Offset != next {
					t.Errorf("event %d (%s) offset %v, want %d (contiguous)", i+1, ev.Type, ev.Offset, next)
				}
				b := ev.bytes(t)
				next += int64(len(b))
				if ev.Type == "stdout" {
					stdout.Write(b)
				} else {
					stderr.Write(b)
				}
			default:
				t.Errorf("unexpected event %d in the middle: %s", i+1, mustJSON(ev))
			}
		}
		var wantOut, wantErr strings.Builder
		for i := 1; i <= 40; i++ {
			fmt.Fprintf(&wantOut, "out%d\n", i)
			fmt.Fprintf(&wantErr, "err%d\n", i)
		}
		if stdout.String() != wantOut.String() || stderr.String() != wantErr.String() {
			t.Errorf("streamed stdout %q stderr %q differ from what was printed", stdout.String(), stderr.String())
		}
	})

	t.Run("UnknownFields", func(t *testing.T) {
		for _, tc := range []struct {
			path string
			body string
			want []string
		}{
			{"/v1/sandboxes", `{"bogusOne": 1, "bogusTwo": "x", "vcpu": 1}`, []string{"bogusOne", "bogusTwo"}},
			{"/v1/sandboxes/" + id + ":exec", `{"command": "true", "nope": true, "alsoNope": [1]}`, []string{"alsoNope", "nope"}},
		} {
			r := c.raw(t, "POST", tc.path, tc.body, nil, requestTimeout)
			if r.Status != http.StatusBadRequest || r.Err == nil || r.Err.Code != "invalid_request" {
				t.Errorf("POST %s %s: %v, want 400 invalid_request", tc.path, tc.body, r)
				continue
			}
			paths := r.Err.issuePaths()
			for _, w := range tc.want {
				if !slices.Contains(paths, w) {
					t.Errorf("POST %s: issues %v do not name %q", tc.path, paths, w)
				}
			}
			if len(paths) != len(tc.want) {
				t.Errorf("POST %s: issues %v, want exactly %v", tc.path, paths, tc.want)
			}
		}
	})

	t.Run("Idempotency", func(t *testing.T) {
		key := fmt.Sprintf("it-%d", time.Now().UnixNano())
		hdr := http.Header{"Idempotency-Key": {key}}
		body := map[string]any{"memoryMiB": 512, "vcpu": 1, "labels": map[string]string{"test": "idempotency"}}
		first := c.create(t, body, hdr)
		if first.Replayed {
			t.Errorf("first create says replayed")
		}
		r := c.raw(t, "POST", "/v1/sandboxes", body, hdr, requestTimeout)
		var again sandboxJSON
		if r.Status != http.StatusOK || json.Unmarshal(r.Body, &again) != nil {
			t.Fatalf("replayed create: %v", r)
		}
		if again.ID != first.ID || !again.Replayed {
			t.Errorf("replay: id %q replayed %v, want %q and true", again.ID, again.Replayed, first.ID)
		}
		body["labels"] = map[string]string{"test": "something else"}
		r = c.raw(t, "POST", "/v1/sandboxes", body, hdr, requestTimeout)
		if r.Status != http.StatusUnprocessableEntity || r.Err == nil || r.Err.Code == "" {
			t.Errorf("same key, different body: %v, want 422", r)
		} else {
			t.Logf("same key, different body: 422 %s", r.Err.Code)
		}
		if l := c.list(t, "?label=test:idempotency"); len(l) != 1 {
			t.Errorf("%d sandboxes labelled test:idempotency, want 1", len(l))
		}
		c.delete(t, first.ID)
	})

	t.Run("OtherKey", func(t *testing.T) {
		other := s.client(s.createKey(t, "other"))
		for _, q := range []struct{ method, path, body string }{
			{"GET", "/v1/sandboxes/" + id, ""},
			{"POST", "/v1/sandboxes/" + id + ":exec", `{"command":"true"}`},
			{"GET", filePath(id, "/workspace/notes/a.txt"), ""},
			{"GET", "/v1/sandboxes/" + id + "/processes", ""},
			{"POST", "/v1/sandboxes/" + id + ":stop", `{}`},
			{"DELETE", "/v1/sandboxes/" + id, ""},
		} {
			var body any
			if q.body != "" {
				body = q.body
			}
			r := other.raw(t, q.method, q.path, body, nil, requestTimeout)
			if r.Status != http.StatusNotFound || r.Err == nil || r.Err.Code != "not_found" {
				t.Errorf("%s %s with another key: %v, want 404 not_found", q.method, q.path, r)
			}
		}
		for _, sb := range other.list(t, "?includeStopped=true") {
			if sb.ID == id {
				t.Errorf("another key lists sandbox %s", id)
			}
		}
		if got := c.get(t, id); got.State != "running" {
			t.Errorf("after the other key's calls the sandbox is %s", got.State)
		}
		// Without any key at all.
		anon := s.client("")
		if r := anon.raw(t, "GET", "/v1/sandboxes/"+id, nil, nil, requestTimeout); r.Status != http.StatusUnauthorized {
			t.Errorf("no key: %v, want 401", r)
		}
	})

	t.Run("StopThenExec", func(t *testing.T) {
		stopped, _ := call[sandboxJSON](t, c, "POST", "/v1/sandboxes/"+id+":stop", "{}", http.Header{"Prefer": {"wait=60"}})
		if stopped.State != "stopped" || stopped.stopReason() != "requested" || stopped.EndedAt == nil {
			t.Errorf("after :stop with wait: state %q stopReason %q endedAt %v", stopped.State, stopped.stopReason(), stopped.EndedAt)
		}
		r := c.raw(t, "POST", "/v1/sandboxes/"+id+":exec", execReq{Command: "true"}, nil, requestTimeout)
		if r.Status != http.StatusConflict || r.Err == nil || r.Err.Code != "not_running" {
			t.Errorf("exec on a stopped sandbox: %v, want 409 not_running", r)
		}
		if pid := vmPID(id); pid != 0 {
			t.Errorf("stopped sandbox's VM is still running (pid %d)", pid)
		}
	})
}

// streamEvent is one NDJSON line of a streamed exec.
type streamEvent struct {
	Type       string    `json:"type"`
	ProcessID  string    `json:"processId"`
	Data       *string   `json:"data"`
	Base64     string    `json:"base64"`
	Offset     *int64    `json:"offset"`
	ResumeAt   *int64    `json:"resumeAt"`
	ExitCode   *int      `json:"exitCode"`
	TimedOut   *bool     `json:"timedOut"`
	DurationMs *int64    `json:"durationMs"`
	Error      *apiError `json:"error"`
}

// bytes returns the event's exact output bytes.
func (ev streamEvent) bytes(t testing.TB) []byte {
	if ev.Base64 != "" {
		b, err := base64.StdEncoding.DecodeString(ev.Base64)
		if err != nil {
			t.Errorf("bad base64 in event: %v", err)
		}
		return b
	}
	if ev.Data == nil {
		return nil
	}
	return []byte(*ev.Data)
}

func mustJSON(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

func deref(s *string) string {
	if s == nil {
		return "<nil>"
	}
	return *s
}

func firstDiff(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}
