package integration

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// Bounds every hostile case must stay within.
const (
	hostileRSSBound   = 300 << 20       // the server's resident memory
	bystanderDeadline = 2 * time.Second // an exec in the other sandbox
)

// TestHostileGuest runs a program as root in a sandbox that takes over the
// agent's channel (testdata/hostile: it freezes PID 1 with ptrace, takes
// its virtio-serial descriptor with pidfd_getfd and breaks the host's
// session, so the host reconnects to it) and then answers the host's calls
// itself. What the test really exercises is a guest whose every answer is
// hostile from the host's next connection on: the host cannot tell it from
// a broken agent. A second sandbox runs beside it throughout.
//
// Cases, in order, on the same two VMs: oversized answers (a process list
// of ~1.4 million empty objects in one frame, a frame header promising
// 1 GiB, JSON nested 512 Ki deep); a flood of guest-opened DNS streams and
// a few DNS frames over 64 KiB; a flood of streams left half-closed and
// full of data; a session that the guest drops right after each handshake,
// until the host stops the sandbox with reason guest_protocol_violation.
// For each: the server's peak RSS stays under hostileRSSBound, the other
// sandbox answers an exec within bystanderDeadline, and the hostile one is
// either still answering or stopped with that reason.
func TestHostileGuest(t *testing.T) {
	s := startServer(t, t.TempDir())
	c := s.client(s.AdminKey)
	bin := buildHostile(t)
	pid := s.cmd.Process.Pid
	mon := startRSSMonitor(pid)
	defer mon.stop()

	// Internet off: the DNS flood is answered by the host without asking
	// any resolver.
	hostileSB := c.createRunning(t, map[string]any{"memoryMiB": 1024, "network": map[string]any{"internet": false}})
	other := c.createRunning(t, map[string]any{"memoryMiB": 1024})
	id := hostileSB.ID

	// Upload the program in pieces under the body limit, and start it as
	// root in the background.
	const piece = 900 << 10
	var names []string
	for i := 0; i*piece < len(bin); i++ {
		name := fmt.Sprintf("/tmp/hostile.%d", i)
		c.writeFile(t, id, name, bin[i*piece:min(len(bin), (i+1)*piece)])
		names = append(names, name)
	}
	c.sh(t, id, "cat "+strings.Join(names, " ")+" > /tmp/hostile && chmod 755 /tmp/hostile")
	c.spawn(t, id, "sudo /tmp/hostile > /tmp/hostile.log 2>&1")

	// The host reconnects once the program has broken its session; from
	// then on every answer is the program's.
	if !waitUntil(90*time.Second, 250*time.Millisecond, func() bool {
		r := c.raw(t, "POST", "/v1/sandboxes/"+id+":exec", execReq{Command: "status"}, nil, 30*time.Second)
		return r.Status == 200 && strings.Contains(string(r.Body), "hellos=")
	}) {
		t.Fatalf("the hostile program did not take over; server log:\n%s", s.logTail(40))
	}
	status := func() string {
		res, _ := c.exec(t, id, execReq{Command: "status"})
		return res.Stdout
	}
	// counter reads one of the program's counters from its status.
	counter := func(st, name string) int {
		for _, f := range strings.Fields(st) {
			if v, ok := strings.CutPrefix(f, name+"="); ok {
				n, _ := strconv.Atoi(v)
				return n
			}
		}
		return 0
	}
	t.Logf("taken over: %s", status())

	check := func(t *testing.T, name string) {
		t.Helper()
		probeBystander(t, c, other.ID)
		peak := mon.peak()
		t.Logf("%s: server peak RSS %d MiB (now %d MiB)", name, peak>>20, mon.now()>>20)
		if peak > hostileRSSBound {
			t.Errorf("%s: server RSS reached %d MiB, bound %d MiB", name, peak>>20, hostileRSSBound>>20)
		}
	}
	noInternals := func(t *testing.T, r *response) {
		t.Helper()
		for _, bad := range []string{s.DataDir, "/tmp/", "agent.sock", "yamux", "dial ", "127.0.0.1"} {
			if bytes.Contains(r.Body, []byte(bad)) {
				t.Errorf("answer carries %q: %s", bad, r.Body)
			}
		}
	}

	t.Run("OversizedAnswers", func(t *testing.T) {
		var wg sync.WaitGroup
		rs := make([]*response, 2)
		start := time.Now()
		for i := range rs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				// Concurrent, like the two calls that once took the server
				// from 20 MiB to 1.9 GiB.
				rs[i] = c.raw(t, "GET", "/v1/sandboxes/"+id+"/processes", nil, nil, time.Minute)
			}()
		}
		wg.Wait()
		t.Logf("two process lists of ~1.4 million entries refused in %s", time.Since(start).Round(time.Millisecond))
		rs = append(rs,
			c.raw(t, "GET", "/v1/sandboxes/"+id+"/files/list?path=/", nil, nil, time.Minute),
			c.raw(t, "GET", "/v1/sandboxes/"+id+"/files/stat?path=/etc", nil, nil, time.Minute))
		for i, r := range rs {
			if r.Err == nil || r.Status != 503 || r.Err.Code != "guest_protocol_error" {
				t.Errorf("answer %d: %v, want 503 guest_protocol_error", i, r)
			}
			noInternals(t, r)
		}
		check(t, "oversized answers")
		if sb := c.get(t, id); sb.State != "running" {
			t.Errorf("after a few violations the sandbox is %s, want still running", sb.State)
		}
	})

	t.Run("DNSFlood", func(t *testing.T) {
		start := time.Now()
		c.exec(t, id, execReq{Command: "dnsflood 5000"})
		c.exec(t, id, execReq{Command: "bigdns 2"})
		if !waitUntil(5*time.Minute, time.Second, func() bool {
			probeBystander(t, c, other.ID)
			st := status()
			return counter(st, "dns.done") == 1 && counter(st, "bigdns.done") == 1
		}) {
			t.Errorf("the flood did not end: %s", status())
		}
		st := status()
		t.Logf("after %s of DNS flood: %s", time.Since(start).Round(time.Second), st)
		if counter(st, "dns.ok") == 0 {
			t.Errorf("no DNS question was answered: %s", st)
		}
		check(t, "DNS flood")
	})

	t.Run("HalfClosedFlood", func(t *testing.T) {
		c.exec(t, id, execReq{Command: "halfclosed 5000"})
		if !waitUntil(5*time.Minute, time.Second, func() bool {
			probeBystander(t, c, other.ID)
			return counter(status(), "halfclosed.done") == 1
		}) {
			t.Errorf("the flood did not end: %s", status())
		}
		t.Logf("after the half-closed flood: %s", status())
		check(t, "half-closed flood")
		if sb := c.get(t, id); sb.State != "running" {
			t.Errorf("after floods within the budgets the sandbox is %s (%s), want running", sb.State, sb.stopReason())
		}
	})

	t.Run("SessionFlapping", func(t *testing.T) {
		cpu0 := cpuTime(pid)
		start := time.Now()
		c.exec(t, id, execReq{Command: "flap"})
		var sb sandboxJSON
		if !waitUntil(3*time.Minute, 500*time.Millisecond, func() bool {
			probeBystander(t, c, other.ID)
			sb = c.get(t, id)
			return sb.State == "stopped"
		}) {
			t.Fatalf("the flapping sandbox is %s after 3 min; server log:\n%s", sb.State, s.logTail(30))
		}
		took := time.Since(start)
		cpu := cpuTime(pid) - cpu0
		t.Logf("stopped after %s of flapping (reason %q); server CPU meanwhile %s", took.Round(time.Millisecond), sb.stopReason(), cpu)
		if sb.stopReason() != "guest_protocol_violation" {
			t.Errorf("stopReason %q, want guest_protocol_violation", sb.stopReason())
		}
		// Reconnects back off: no busy loop.
		if cpu > took/2 {
			t.Errorf("server used %s of CPU in %s of flapping", cpu, took)
		}
		r := c.raw(t, "GET", "/v1/sandboxes/"+id+"/events?limit=1000", nil, nil, requestTimeout)
		var evs struct {
			Data []struct {
				Type    string         `json:"type"`
				Message string         `json:"message"`
				At      time.Time      `json:"at"`
				Data    map[string]any `json:"data"`
			} `json:"data"`
		}
		if r.Status != 200 || json.Unmarshal(r.Body, &evs) != nil {
			t.Fatalf("GET events: %v", r)
		}
		noInternals(t, r)
		kinds := map[string]int{}
		stoppedWhy := ""
		for _, ev := range evs.Data {
			kinds[ev.Type]++
			if ev.Type == "guest_protocol_violation" || ev.Type == "stopped" {
				t.Logf("event %s %s: %s", ev.At.Format("15:04:05.000"), ev.Type, ev.Message)
			}
			if ev.Type == "stopped" {
				stoppedWhy, _ = ev.Data["reason"].(string)
			}
		}
		t.Logf("events: %v", kinds)
		if kinds["guest_protocol_violation"] == 0 || stoppedWhy != "guest_protocol_violation" {
			t.Errorf("events %v (stopped: %q), want guest_protocol_violation events and a stop for that reason", kinds, stoppedWhy)
		}
		check(t, "session flapping")
		if n := strings.Count(readFileString(s.LogPath), "sandbox_id="+id); n > 200 {
			t.Errorf("%d server log lines about the hostile sandbox: not rate-limited", n)
		}
	})
}

// buildHostile builds testdata/hostile for the guest (static) and returns it.
func buildHostile(t *testing.T) []byte {
	t.Helper()
	out := filepath.Join(t.TempDir(), "hostile")
	cmd := exec.Command("go", "build", "-ldflags=-s -w", "-o", out, "./testdata/hostile")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building the hostile program: %v\n%s", err, b)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// probeBystander runs an exec in the other sandbox and fails t unless it
// answers within bystanderDeadline.
func probeBystander(t *testing.T, c *client, id string) time.Duration {
	t.Helper()
	start := time.Now()
	r := c.raw(t, "POST", "/v1/sandboxes/"+id+":exec", execReq{Command: "echo ok"}, nil, 30*time.Second)
	took := time.Since(start)
	if r.err != nil || r.Status != 200 || !strings.Contains(string(r.Body), "ok") {
		t.Errorf("bystander exec: %v", r)
	} else if took > bystanderDeadline {
		t.Errorf("bystander exec took %s, bound %s", took, bystanderDeadline)
	}
	return took
}

// rssMonitor samples a process's resident memory.
type rssMonitor struct {
	pid  int
	mu   sync.Mutex
	max  int64
	done chan struct{}
}

func startRSSMonitor(pid int) *rssMonitor {
	m := &rssMonitor{pid: pid, done: make(chan struct{})}
	go func() {
		t := time.NewTicker(20 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-m.done:
				return
			case <-t.C:
				m.peak()
			}
		}
	}()
	return m
}

func (m *rssMonitor) stop() { close(m.done) }

// now returns VmRSS.
func (m *rssMonitor) now() int64 { return procStatusBytes(m.pid, "VmRSS:") }

// peak returns the highest of the samples and the kernel's VmHWM.
func (m *rssMonitor) peak() int64 {
	v := max(m.now(), procStatusBytes(m.pid, "VmHWM:"))
	m.mu.Lock()
	defer m.mu.Unlock()
	m.max = max(m.max, v)
	return m.max
}

func procStatusBytes(pid int, field string) int64 {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, field); ok {
			f := strings.Fields(rest)
			if len(f) > 0 {
				kb, _ := strconv.ParseInt(f[0], 10, 64)
				return kb << 10
			}
		}
	}
	return 0
}

// cpuTime returns the user+system CPU time of pid.
func cpuTime(pid int) time.Duration {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 13 {
		return 0
	}
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(ut+st) * time.Second / 100 // USER_HZ
}

func readFileString(path string) string {
	b, _ := os.ReadFile(path)
	return string(b)
}
