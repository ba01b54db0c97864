package integration

import (
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestHostileWorkloads runs what a tenant's code can do inside its own
// guest without breaking any protocol: a CPU spin on every vCPU, a fork
// bomb, a memory bomb, a disk fill, an output flood and a process flood.
// A second sandbox runs beside it. For each: while the workload runs the
// other sandbox answers an exec within bystanderDeadline; the server's RSS
// stays under hostileRSSBound; and afterwards the hostile sandbox either
// answers again or is reported stopped with a reason.
func TestHostileWorkloads(t *testing.T) {
	s := startServer(t, t.TempDir())
	c := s.client(s.AdminKey)
	mon := startRSSMonitor(s.cmd.Process.Pid)
	defer mon.stop()

	const diskMiB = 3072
	hostile := c.createRunning(t, map[string]any{"vcpu": 2, "memoryMiB": 1024, "diskMiB": diskMiB})
	other := c.createRunning(t, map[string]any{"vcpu": 1, "memoryMiB": 1024})
	id := hostile.ID

	cases := []struct {
		name, command string
		timeoutMs     int64
		after         func(t *testing.T) // extra checks once it has ended
	}{
		{name: "cpu spin on every vCPU", timeoutMs: 15_000,
			command: `for i in $(seq $(nproc)); do (while :; do :; done) & done; wait`},
		{name: "fork bomb", timeoutMs: 10_000,
			command: `bomb() { bomb | bomb & }; bomb; sleep 60`},
		{name: "memory bomb", timeoutMs: 30_000,
			command: `python3 -c 'b = []
while True: b.append(bytearray(64 << 20))'`},
		{name: "disk fill", timeoutMs: 120_000,
			command: `dd if=/dev/zero of=/workspace/fill bs=1M status=none; sync; df -m /workspace`,
			after: func(t *testing.T) {
				// The host's copy-on-write disk stays within its cap.
				fi, err := os.Stat(filepath.Join(s.DataDir, "sandboxes", id, "disk.qcow2"))
				if err != nil {
					t.Errorf("overlay: %v", err)
				} else if limit := int64(diskMiB+diskMiB/16+64) << 20; fi.Size() > limit {
					t.Errorf("overlay grew to %d MiB, past its cap of %d MiB", fi.Size()>>20, limit>>20)
				} else {
					t.Logf("overlay %d MiB for a %d MiB disk", fi.Size()>>20, diskMiB)
				}
				c.sh(t, id, "rm -f /workspace/fill")
			}},
		{name: "output flood", timeoutMs: 30_000,
			command: `head -c 2G /dev/zero | tr '\0' x; base64 /dev/urandom`},
		{name: "process flood", timeoutMs: 30_000,
			command: `for i in $(seq 3000); do sleep 600 & done; wait`,
			after: func(t *testing.T) {
				// The API's listing of the guest's processes stays small.
				r := c.raw(t, "GET", "/v1/sandboxes/"+id+"/processes", nil, nil, requestTimeout)
				if r.err != nil || r.Status != http.StatusOK {
					t.Errorf("listing processes after the flood: %v", r)
				} else if len(r.Body) > 4<<20 {
					t.Errorf("process listing is %d bytes", len(r.Body))
				}
			}},
	}
	for _, tc := range cases {
		t.Run(strings.ReplaceAll(tc.name, " ", "_"), func(t *testing.T) {
			if sb := c.get(t, id); sb.State != "running" {
				t.Skipf("the hostile sandbox is %s (stopReason %q) after an earlier case", sb.State, sb.stopReason())
			}
			p, _ := call[processJSON](t, c, "POST", "/v1/sandboxes/"+id+"/processes",
				map[string]any{"command": tc.command, "timeoutMs": tc.timeoutMs}, nil)
			start := time.Now()
			// The other sandbox is probed all the while the workload runs
			// (and at least three times).
			probes, slowest := 0, time.Duration(0)
			for probes < 3 || (time.Since(start) < time.Duration(tc.timeoutMs)*time.Millisecond && processRunning(t, c, id, p.ID)) {
				slowest = max(slowest, probeBystander(t, c, other.ID))
				probes++
				time.Sleep(time.Second)
			}
			// It ends by itself or at its timeout; then whatever it left is
			// killed, as root, so the next case starts clean.
			waitUntil(time.Duration(tc.timeoutMs)*time.Millisecond+2*time.Minute, time.Second, func() bool {
				return !processRunning(t, c, id, p.ID)
			})
			alive := recovered(t, c, id)
			t.Logf("%s: %d bystander probes, slowest %s; ran %s; sandbox usable afterwards: %v; server peak RSS %d MiB",
				tc.name, probes, slowest.Round(time.Millisecond), time.Since(start).Round(time.Second), alive, mon.peak()>>20)
			if !alive {
				sb := c.get(t, id)
				if sb.State == "running" {
					t.Errorf("the sandbox neither answers nor was reported failed (state %s)", sb.State)
				} else if sb.stopReason() == "" {
					t.Errorf("the sandbox is %s without a reason", sb.State)
				}
			}
			if tc.after != nil && alive {
				tc.after(t)
			}
			if peak := mon.peak(); peak > hostileRSSBound {
				t.Errorf("server RSS reached %d MiB, bound %d MiB", peak>>20, hostileRSSBound>>20)
			}
			probeBystander(t, c, other.ID)
		})
	}
}

// processRunning reports whether the process is still running; a sandbox
// that cannot answer counts as not running (the caller checks it next).
func processRunning(t *testing.T, c *client, id, pid string) bool {
	r := c.raw(t, "GET", "/v1/sandboxes/"+id+"/processes/"+pid, nil, nil, 30*time.Second)
	if r.err != nil || r.Status != http.StatusOK {
		return false
	}
	var p processJSON
	return json.Unmarshal(r.Body, &p) == nil && p.State == "running"
}

// recovered kills what the workload left (as root, repeatedly: a fork bomb
// forks while it is being killed) and reports whether the sandbox then
// answers an exec.
func recovered(t *testing.T, c *client, id string) bool {
	return waitUntil(2*time.Minute, 2*time.Second, func() bool {
		r := c.raw(t, "POST", "/v1/sandboxes/"+id+":exec",
			execReq{Command: "pkill -9 -u user; pkill -9 -u user; sync; echo alive", User: "root", TimeoutMs: 20_000}, nil, time.Minute)
		if r.err != nil || r.Status != http.StatusOK {
			return false
		}
		var res execResult
		return json.Unmarshal(r.Body, &res) == nil && strings.Contains(res.Stdout, "alive") &&
			c.raw(t, "POST", "/v1/sandboxes/"+id+":exec", execReq{Command: "echo ok"}, nil, time.Minute).Status == http.StatusOK
	})
}
