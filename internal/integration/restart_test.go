package integration

import (
	"net/http"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestRestart kills the server with SIGKILL and starts it again on the same
// data dir: running sandboxes are reattached (the same VMs, not rebooted);
// one whose VM died meanwhile is recorded as stopped.
func TestRestart(t *testing.T) {
	needVMs(t)
	dataDir := t.TempDir()
	s1 := startServer(t, dataDir)
	c := s1.client(s1.AdminKey)

	body := map[string]any{"vcpu": 1, "memoryMiB": 1024, "labels": map[string]string{"test": "restart"}}
	a := c.createRunning(t, body)
	b := c.createRunning(t, body)
	ids := []string{a.ID, b.ID}
	for _, id := range ids {
		c.writeFile(t, id, "/workspace/marker.txt", []byte("marker of "+id+"\n"))
	}
	proc := c.spawn(t, a.ID, "sleep 100000")
	uptime := map[string]float64{}
	pids := map[string]int{}
	for _, id := range ids {
		uptime[id] = guestUptime(t, c, id)
		if pids[id] = vmPID(id); pids[id] == 0 {
			t.Fatalf("no QEMU process found for %s", id)
		}
	}
	t.Logf("sandboxes %s (VM pid %d) and %s (VM pid %d); process %s in the first", a.ID, pids[a.ID], b.ID, pids[b.ID], proc.ID)

	// 1. SIGKILL the server; both VMs live on and are reattached.
	s1.kill9(t)
	for _, id := range ids {
		if !processAlive(pids[id]) {
			t.Fatalf("VM of %s (pid %d) died with the server", id, pids[id])
		}
	}
	killedAt := time.Now()
	s2 := startServer(t, dataDir)
	c = s2.client(s2.AdminKey)
	for _, id := range ids {
		waitAgent(t, c, id)
	}
	listed := c.list(t, "?label=test:restart")
	if len(listed) != 2 {
		t.Errorf("after restart %d sandboxes are listed, want 2: %+v", len(listed), listed)
	}
	for _, sb := range listed {
		if !slices.Contains(ids, sb.ID) || sb.State != "running" {
			t.Errorf("after restart: listed %s in state %s (stopReason %q), want one of %v running", sb.ID, sb.State, sb.stopReason(), ids)
		}
	}
	for _, id := range ids {
		if got := vmPID(id); got != pids[id] {
			t.Errorf("VM of %s is pid %d after the restart, was %d", id, got, pids[id])
		}
		if got, _ := c.readFile(t, id, "/workspace/marker.txt"); string(got) != "marker of "+id+"\n" {
			t.Errorf("marker file of %s reads %q after the restart", id, got)
		}
		up := guestUptime(t, c, id)
		// The guest clock ran on: uptime grew by about the time since it
		// was read (and a reboot would have reset it to a few seconds).
		if up < uptime[id] || up < time.Since(killedAt).Seconds()-1 {
			t.Errorf("guest %s uptime %.2f s after the restart, was %.2f s before it: the guest rebooted", id, up, uptime[id])
		}
		if out := c.sh(t, id, "echo alive-$((6*7))"); out != "alive-42\n" {
			t.Errorf("exec on %s after the restart printed %q", id, out)
		}
	}
	found := false
	for _, p := range c.processes(t, a.ID) {
		if p.ID == proc.ID {
			found = true
			if p.State != "running" {
				t.Errorf("spawned process %s is %s after the restart", p.ID, p.State)
			}
		}
	}
	if !found {
		t.Errorf("spawned process %s is not listed after the restart", proc.ID)
	}
	if out := c.sh(t, a.ID, "pgrep -x sleep || true"); !strings.Contains(out, strconv.Itoa(proc.PID)) {
		t.Errorf("the spawned sleep (guest pid %d) is not running in the guest: pgrep printed %q", proc.PID, out)
	}
	checkAccounted(t, dataDir, map[string]int{a.ID: pids[a.ID], b.ID: pids[b.ID]})

	// 2. SIGKILL the server, then the second VM: after the restart that
	// sandbox is stopped, the other still runs.
	s2.kill9(t)
	if err := syscall.Kill(pids[b.ID], syscall.SIGKILL); err != nil {
		t.Fatalf("killing VM of %s (pid %d): %v", b.ID, pids[b.ID], err)
	}
	if !waitUntil(30*time.Second, 50*time.Millisecond, func() bool { return !processAlive(pids[b.ID]) }) {
		t.Fatalf("VM pid %d still alive 30 s after SIGKILL", pids[b.ID])
	}
	s3 := startServer(t, dataDir)
	c = s3.client(s3.AdminKey)
	waitAgent(t, c, a.ID)
	gotB := c.get(t, b.ID)
	if gotB.State != "stopped" || gotB.stopReason() == "" || gotB.EndedAt == nil {
		t.Errorf("sandbox whose VM was killed: state %q stopReason %q endedAt %v, want stopped with a reason",
			gotB.State, gotB.stopReason(), gotB.EndedAt)
	} else {
		t.Logf("sandbox whose VM was killed while the server was down: stopped, stopReason %q", gotB.stopReason())
	}
	if r := c.raw(t, "POST", "/v1/sandboxes/"+b.ID+":exec", execReq{Command: "true"}, nil, requestTimeout); r.Status != 409 || r.Err == nil || r.Err.Code != "not_running" {
		t.Errorf("exec on the lost sandbox: %v, want 409 not_running", r)
	}
	gotA := c.get(t, a.ID)
	if gotA.State != "running" {
		t.Errorf("the other sandbox is %s (stopReason %q), want running", gotA.State, gotA.stopReason())
	}
	if out := c.sh(t, a.ID, "cat /workspace/marker.txt"); out != "marker of "+a.ID+"\n" {
		t.Errorf("after the second restart the marker reads %q", out)
	}
	if up := guestUptime(t, c, a.ID); up < uptime[a.ID] {
		t.Errorf("guest %s rebooted: uptime %.2f s, was %.2f s", a.ID, up, uptime[a.ID])
	}
	running := c.list(t, "?label=test:restart")
	if len(running) != 1 || running[0].ID != a.ID {
		t.Errorf("running sandboxes after the second restart: %+v, want only %s", running, a.ID)
	}
	checkAccounted(t, dataDir, map[string]int{a.ID: pids[a.ID]})
}

// waitAgent checks that a reattached sandbox answers at once: right after a
// restart the server is still reconnecting to its agent, and calls wait for
// that instead of failing.
func waitAgent(t testing.TB, c *client, id string) {
	t.Helper()
	start := time.Now()
	last := c.raw(t, "POST", "/v1/sandboxes/"+id+":exec", execReq{Command: "true"}, nil, requestTimeout)
	if last.Status != http.StatusOK {
		t.Fatalf("exec on %s right after the restart: %v (after %s)", id, last, time.Since(start).Round(time.Millisecond))
	}
	t.Logf("%s: first exec after the restart answered in %s", id, time.Since(start).Round(time.Millisecond))
}

// guestUptime reads the guest's /proc/uptime, in seconds.
func guestUptime(t testing.TB, c *client, id string) float64 {
	t.Helper()
	out := c.sh(t, id, "cat /proc/uptime")
	f := strings.Fields(out)
	if len(f) == 0 {
		t.Fatalf("/proc/uptime of %s: %q", id, out)
	}
	up, err := strconv.ParseFloat(f[0], 64)
	if err != nil {
		t.Fatalf("/proc/uptime of %s: %q: %v", id, out, err)
	}
	return up
}

// checkAccounted checks that the VMs running on dataDir are exactly want
// (sandbox id → QEMU pid).
func checkAccounted(t testing.TB, dataDir string, want map[string]int) {
	t.Helper()
	got := map[string]int{}
	for _, p := range vmProcesses(dataDir) {
		got[strings.TrimPrefix(p.Name, "emberbox-")] = p.PID
	}
	if len(got) != len(want) {
		t.Errorf("VMs running on the data dir: %v, want %v", got, want)
		return
	}
	for id, pid := range want {
		if got[id] != pid {
			t.Errorf("VMs running on the data dir: %v, want %v", got, want)
			return
		}
	}
}
