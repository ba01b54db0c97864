package integration

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// lifecycle POSTs /v1/sandboxes/{id}:verb and returns the sandbox it
// answers; it fails t unless the answer is 200.
func (c *client) lifecycle(t testing.TB, id, verb string, body map[string]any) sandboxJSON {
	t.Helper()
	if body == nil {
		body = map[string]any{}
	}
	r := c.raw(t, "POST", "/v1/sandboxes/"+id+":"+verb, body, http.Header{"Prefer": {"wait=60"}}, requestTimeout)
	if r.err != nil || r.Status != http.StatusOK {
		t.Fatalf("%s %s: %v", verb, id, r)
	}
	var sb sandboxJSON
	if err := json.Unmarshal(r.Body, &sb); err != nil {
		t.Fatalf("%s: decoding %s: %v", verb, r.Body, err)
	}
	return sb
}

// serveHTTP starts a web server on port 8000 in the sandbox, as a process
// of its own, and waits until it answers.
func serveHTTP(t testing.TB, c *client, id string) {
	t.Helper()
	c.spawn(t, id, "python3 -m http.server 8000 --directory /workspace")
	// A slow, shared machine may take a minute to start Python: wait up to
	// five, in one command.
	cmd := "for i in $(seq 1500); do curl -sf -o /dev/null localhost:8000/ && exit 0; sleep 0.2; done; exit 1"
	res, _ := c.exec(t, id, execReq{Command: cmd, TimeoutMs: 6 * 60_000})
	if res.ExitCode == nil || *res.ExitCode != 0 {
		t.Fatalf("the sandbox's http.server did not answer: exit %s, stderr %q", res.exit(), res.Stderr)
	}
}

// checkKept checks that /workspace/kept holds want and that the web server
// serves it.
func checkKept(t testing.TB, c *client, id, want, when string) {
	t.Helper()
	if got := c.sh(t, id, "cat /workspace/kept"); got != want+"\n" {
		t.Errorf("%s: file holds %q, want %q", when, got, want)
	}
	if got := c.sh(t, id, "curl -sf localhost:8000/kept"); got != want+"\n" {
		t.Errorf("%s: the web server answers %q, want %q", when, got, want)
	}
}

// TestPauseWake: a sandbox with a file and a running web server keeps both
// across a pause, a restart of the server and a kill -9 of it while paused,
// and ten pause/wake cycles in a row; a paused sandbox has no VM process;
// an exec wakes it (autoWake), and with autoWake off it answers
// sandbox_paused (and its public preview a "paused" page, without waking
// it); waking a running one answers not_paused; the guest's clock is right
// after a wake.
func TestPauseWake(t *testing.T) {
	dataDir := t.TempDir()
	s := startServer(t, dataDir)
	c := s.client(s.AdminKey)
	sb := c.createRunning(t, map[string]any{"timeoutSeconds": 1800})
	c.sh(t, sb.ID, "echo kept > /workspace/kept")
	serveHTTP(t, c, sb.ID)

	paused := c.lifecycle(t, sb.ID, "pause", nil)
	if paused.State != "paused" {
		paused = c.waitState(t, sb.ID, "paused")
	}
	if pid := vmPID(sb.ID); pid != 0 {
		t.Errorf("a paused sandbox has a VM process (pid %d)", pid)
	}
	// A paused sandbox's memory and disk survive the server.
	s.terminate(t)
	s = startServer(t, dataDir)
	c = s.client(s.AdminKey)
	if got := c.get(t, sb.ID); got.State != "paused" {
		t.Fatalf("after a restart the sandbox is %s, want paused", got.State)
	}
	s.kill9(t)
	s = startServer(t, dataDir)
	c = s.client(s.AdminKey)
	// Some minutes pass while it is paused: the wake corrects the clock.
	woken := c.lifecycle(t, sb.ID, "wake", nil)
	if woken.State != "running" {
		c.waitState(t, sb.ID, "running")
	}
	checkKept(t, c, sb.ID, "kept", "after a restart and a kill -9")
	skew := c.sh(t, sb.ID, "date +%s")
	if d := time.Since(time.Unix(atoi(t, strings.TrimSpace(skew)), 0)); d < -5*time.Second || d > 5*time.Second {
		t.Errorf("guest clock is %s off after a wake", d)
	}

	for i := range 10 {
		c.lifecycle(t, sb.ID, "pause", nil)
		c.waitState(t, sb.ID, "paused")
		c.lifecycle(t, sb.ID, "wake", nil)
		c.waitState(t, sb.ID, "running")
		c.sh(t, sb.ID, "echo "+itoa(i)+" > /workspace/kept")
		checkKept(t, c, sb.ID, itoa(i), "cycle "+itoa(i))
	}

	t.Run("AutoWake", func(t *testing.T) {
		c.lifecycle(t, sb.ID, "pause", nil)
		c.waitState(t, sb.ID, "paused")
		checkKept(t, c, sb.ID, "9", "an exec on a paused sandbox")
		if got := c.get(t, sb.ID); got.State != "running" {
			t.Errorf("after an exec the sandbox is %s, want running", got.State)
		}
	})
	t.Run("NotPaused", func(t *testing.T) {
		r := c.raw(t, "POST", "/v1/sandboxes/"+sb.ID+":wake", map[string]any{}, nil, requestTimeout)
		if r.Status != http.StatusConflict || r.Err == nil || r.Err.Code != "not_paused" {
			t.Errorf("wake of a running sandbox: %v, want 409 not_paused", r)
		}
	})
	t.Run("AutoWakeOff", func(t *testing.T) {
		c.lifecycle(t, sb.ID, "update", map[string]any{"autoWake": false})
		c.lifecycle(t, sb.ID, "pause", nil)
		c.waitState(t, sb.ID, "paused")
		r := c.raw(t, "POST", "/v1/sandboxes/"+sb.ID+":exec", execReq{Command: "true"}, nil, requestTimeout)
		if r.Status != http.StatusConflict || r.Err == nil || r.Err.Code != "sandbox_paused" {
			t.Errorf("exec on a paused sandbox without autoWake: %v, want 409 sandbox_paused", r)
		}
		if got := c.get(t, sb.ID); got.State != "paused" {
			t.Errorf("the refused call left it %s", got.State)
		}
	})
	// A visitor of a public preview does not wake a paused sandbox at its
	// owner's cost: a page says it is paused; with autoWake the visit
	// wakes it.
	t.Run("PreviewOfPaused", func(t *testing.T) {
		pv, _ := call[struct{ URL string }](t, c, "POST", "/v1/sandboxes/"+sb.ID+"/previews",
			map[string]any{"port": 8000, "visibility": "public"}, nil)
		visit := func() (int, string) {
			req, _ := http.NewRequest("GET", pv.URL+"kept", nil)
			req.Header.Set("Accept", "text/html")
			resp, err := previewClient.Do(req)
			if err != nil {
				t.Fatalf("GET %s: %v", pv.URL, err)
			}
			defer resp.Body.Close()
			body, _ := io.ReadAll(resp.Body)
			return resp.StatusCode, string(body)
		}
		if code, body := visit(); code != http.StatusServiceUnavailable || !strings.Contains(body, "This sandbox is paused") {
			t.Errorf("the preview of a paused sandbox without autoWake: %d %q", code, body)
		}
		if got := c.get(t, sb.ID); got.State != "paused" {
			t.Errorf("a visit left it %s", got.State)
		}
		c.lifecycle(t, sb.ID, "update", map[string]any{"autoWake": true})
		if code, body := visit(); code != http.StatusOK || body != "9\n" {
			t.Errorf("the preview of a paused sandbox with autoWake: %d %q", code, body)
		}
		if got := c.get(t, sb.ID); got.State != "running" {
			t.Errorf("a visit with autoWake left it %s", got.State)
		}
	})
}

// TestPausesByItself: a lease with onLeaseEnd "pause" pauses its sandbox,
// and idlePauseSeconds pauses an idle one; both wake on the next exec with
// their files. Work is activity: a 3-minute exec and a 3-minute terminal
// session, each in a sandbox of its own with idlePauseSeconds 60, finish
// with all their output, and each sandbox pauses about 60 s after its work
// ended (run beside the others, so the test waits for them once).
func TestPausesByItself(t *testing.T) {
	// Five default sandboxes: more than a default server admits on a
	// 24 GiB host (each is charged its whole 4 GiB), none of them busy.
	s := startServerWith(t, t.TempDir(), "--memory-overcommit", "2")
	c := s.client(s.AdminKey)
	lease := c.createRunning(t, map[string]any{"timeoutSeconds": 60, "onLeaseEnd": "pause"})
	idle := c.createRunning(t, map[string]any{"idlePauseSeconds": 60, "persistent": false})
	keep := c.createRunning(t, map[string]any{"persistent": true})
	execSb := c.createRunning(t, map[string]any{"idlePauseSeconds": 60})
	termSb := c.createRunning(t, map[string]any{"idlePauseSeconds": 60})
	for _, sb := range []sandboxJSON{lease, idle, keep} {
		c.sh(t, sb.ID, "echo "+sb.ID+" > /workspace/kept")
	}
	var wg sync.WaitGroup
	for _, sb := range []sandboxJSON{lease, idle} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			waitPaused(t, c, sb.ID, 4*time.Minute)
		}()
	}
	const seconds = 180
	wg.Add(2)
	go func() {
		defer wg.Done()
		res, _ := c.exec(t, execSb.ID, execReq{Command: "for i in $(seq 1 " + itoa(seconds) + "); do echo $i; sleep 1; done", TimeoutMs: 2 * seconds * 1000})
		ended := time.Now()
		if res.ExitCode == nil || *res.ExitCode != 0 || res.TimedOut {
			t.Errorf("a %d s exec under idlePauseSeconds 60: exit %s, timedOut %v, stderr %q", seconds, res.exit(), res.TimedOut, res.Stderr)
		}
		if want := seqLines(seconds); res.Stdout != want {
			t.Errorf("a %d s exec under idlePauseSeconds 60 printed %d bytes, want all %d: tail %q", seconds, len(res.Stdout), len(want), tail(res.Stdout, 40))
		}
		pausedAfter(t, c, execSb.ID, "exec", ended)
	}()
	go func() {
		defer wg.Done()
		ctx, cancel := context.WithTimeout(context.Background(), 3*seconds*time.Second)
		defer cancel()
		term := dialTerminal(t, ctx, c, termSb.ID, url.Values{"command": {"for i in $(seq 1 " + itoa(seconds) + "); do echo t$i; sleep 1; done"}, "cols": {"80"}, "rows": {"24"}})
		terminalReady(t, ctx, term)
		out, code := terminalToExit(t, ctx, term)
		ended := time.Now()
		if code != 0 {
			t.Errorf("a %d s terminal session under idlePauseSeconds 60 exited %d", seconds, code)
		}
		for i := 1; i <= seconds; i++ {
			if !strings.Contains(out, "t"+itoa(i)+"\r\n") {
				t.Errorf("a %d s terminal session under idlePauseSeconds 60 lost its line t%d: tail %q", seconds, i, tail(out, 40))
				break
			}
		}
		pausedAfter(t, c, termSb.ID, "terminal session", ended)
	}()
	wg.Wait()
	if got := c.get(t, keep.ID); got.State != "running" {
		t.Errorf("a persistent sandbox is %s after the others paused, want running", got.State)
	}
	for _, sb := range []sandboxJSON{lease, idle} {
		if got := c.sh(t, sb.ID, "cat /workspace/kept"); got != sb.ID+"\n" {
			t.Errorf("%s after it paused by itself: %q", sb.ID, got)
		}
	}
}

// waitPaused waits up to d for sandbox id to pause by itself; it fails t
// if the sandbox takes another way or does not pause.
func waitPaused(t *testing.T, c *client, id string, d time.Duration) bool {
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		got, _ := call[sandboxJSON](t, c, "GET", "/v1/sandboxes/"+id+"?waitFor=paused&timeoutSeconds=30", nil, nil)
		if got.State == "paused" {
			return true
		}
		if got.State != "running" && got.State != "pausing" {
			t.Errorf("%s is %s (stopReason %q), want it to pause", id, got.State, got.stopReason())
			return false
		}
	}
	t.Errorf("%s did not pause within %s", id, d)
	return false
}

// pausedAfter checks that sandbox id, whose last work ended at ended, was
// running until its idle time had passed and then paused by itself: about
// 60 s after, within the lease clock's tick and a loaded machine's slack.
func pausedAfter(t *testing.T, c *client, id, work string, ended time.Time) {
	if got := c.get(t, id); got.State != "running" {
		t.Errorf("right after its %s ended the sandbox is %s, want running", work, got.State)
		return
	}
	if !waitPaused(t, c, id, 3*time.Minute) {
		return
	}
	// The client hears the answer a moment before the server counts the
	// call ended, so the gap it sees can be a little short of 60 s.
	if gap := time.Since(ended); gap < 58*time.Second || gap > 2*time.Minute {
		t.Errorf("the sandbox paused %s after its %s ended, want about 60 s", gap.Round(time.Second), work)
	}
}

// seqLines is what `seq 1 n` prints.
func seqLines(n int) string {
	var b strings.Builder
	for i := 1; i <= n; i++ {
		b.WriteString(itoa(i) + "\n")
	}
	return b.String()
}

// TestForkAndSnapshots: a fork of a sandbox with a running web server gives
// copies whose server answers, whose files diverge afterwards and which read
// different random bytes and boot ids; a snapshot made by one key is not
// another key's; a create from a snapshot has its files.
func TestForkAndSnapshots(t *testing.T) {
	s := startServer(t, t.TempDir())
	c := s.client(s.AdminKey)
	parent := c.createRunning(t, map[string]any{"timeoutSeconds": 1800})
	c.sh(t, parent.ID, "echo parent > /workspace/kept")
	serveHTTP(t, c, parent.ID)

	r := c.raw(t, "POST", "/v1/sandboxes/"+parent.ID+":fork", map[string]any{"count": 2}, nil, requestTimeout)
	if r.err != nil || r.Status != http.StatusOK {
		t.Fatalf("fork: %v", r)
	}
	var forked struct {
		Sandboxes []sandboxJSON `json:"sandboxes"`
	}
	if err := json.Unmarshal(r.Body, &forked); err != nil || len(forked.Sandboxes) != 2 {
		t.Fatalf("fork answered %s (%v), want two sandboxes", r.Body, err)
	}
	ids := []string{parent.ID}
	for _, cp := range forked.Sandboxes {
		s.tr.add(cp.ID, s.AdminKey)
		if cp.State != "running" {
			c.waitState(t, cp.ID, "running")
		}
		ids = append(ids, cp.ID)
	}
	seen := map[string]string{}
	for _, id := range ids {
		checkKept(t, c, id, "parent", "copy "+id)
		c.sh(t, id, "echo "+id+" > /workspace/kept")
		for _, probe := range []string{"head -c 16 /dev/urandom | od -An -tx1", "cat /proc/sys/kernel/random/boot_id", "cat /etc/machine-id", "hostname"} {
			got := c.sh(t, id, probe)
			if other, dup := seen[probe+got]; dup {
				t.Errorf("%s and %s read the same %q: %q", other, id, probe, got)
			}
			seen[probe+got] = id
		}
	}
	for _, id := range ids {
		checkKept(t, c, id, id, "after each wrote its own")
	}

	// A user snapshot, and a create from it.
	r = c.raw(t, "POST", "/v1/sandboxes/"+parent.ID+":snapshot", map[string]any{"name": "base"}, http.Header{"Prefer": {"wait=60"}}, requestTimeout)
	if r.err != nil || r.Status != http.StatusOK {
		t.Fatalf("snapshot: %v", r)
	}
	var sn struct {
		ID    string `json:"id"`
		State string `json:"state"`
	}
	if err := json.Unmarshal(r.Body, &sn); err != nil || sn.ID == "" {
		t.Fatalf("snapshot answered %s: %v", r.Body, err)
	}
	other := s.client(s.createKey(t, "other"))
	if r := other.raw(t, "GET", "/v1/snapshots/"+sn.ID, nil, nil, requestTimeout); r.Status != http.StatusNotFound {
		t.Errorf("another key's GET of the snapshot: %v, want 404", r)
	}
	if r := other.raw(t, "POST", "/v1/sandboxes", map[string]any{"snapshot": sn.ID}, nil, requestTimeout); r.Status != http.StatusNotFound {
		t.Errorf("another key's create from the snapshot: %v, want 404", r)
	}
	cp := c.createRunning(t, map[string]any{"snapshot": sn.ID, "timeoutSeconds": 600})
	checkKept(t, c, cp.ID, parent.ID, "a create from a snapshot")
}

// TestPauseFreesCapacity: a paused sandbox gives back its memory, so a
// create that had no room gets it; waking the paused one then answers
// no_capacity and leaves it paused, until there is room again.
func TestPauseFreesCapacity(t *testing.T) {
	s := startServerWith(t, t.TempDir(), "--max-memory-mib", "1536", "--vm-overhead-mib", "256", "--max-vcpus", "4")
	c := s.client(s.AdminKey)
	small := map[string]any{"vcpu": 1, "memoryMiB": 1024, "diskMiB": 3072, "timeoutSeconds": 600}
	a := c.createRunning(t, small)
	c.sh(t, a.ID, "echo a > /workspace/kept")
	r := c.raw(t, "POST", "/v1/sandboxes", small, nil, requestTimeout)
	if r.Status != http.StatusConflict || r.Err == nil || r.Err.Code != "no_capacity" {
		t.Fatalf("a create beyond capacity: %v, want 409 no_capacity", r)
	}
	c.lifecycle(t, a.ID, "pause", nil)
	c.waitState(t, a.ID, "paused")
	b := c.createRunning(t, small)
	r = c.raw(t, "POST", "/v1/sandboxes/"+a.ID+":wake", map[string]any{}, nil, requestTimeout)
	if r.Status != http.StatusConflict || r.Err == nil || r.Err.Code != "no_capacity" {
		t.Errorf("a wake beyond capacity: %v, want 409 no_capacity", r)
	}
	if got := c.get(t, a.ID); got.State != "paused" {
		t.Errorf("a refused wake left the sandbox %s, want paused", got.State)
	}
	c.delete(t, b.ID)
	c.lifecycle(t, a.ID, "wake", nil)
	c.waitState(t, a.ID, "running")
	if got := c.sh(t, a.ID, "cat /workspace/kept"); got != "a\n" {
		t.Errorf("after the wake: %q", got)
	}
}

func itoa(i int) string { return strconv.Itoa(i) }

func atoi(t testing.TB, s string) int64 {
	t.Helper()
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		t.Fatalf("not a number: %q", s)
	}
	return n
}
