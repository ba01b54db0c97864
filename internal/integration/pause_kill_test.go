package integration

import (
	"net/http"
	"testing"
	"time"
)

// TestKillDuringPauseAndWake kills the server at each step of a pause and
// of a wake: after a restart the sandbox is paused or running (the old
// state or the new, never lost), and once woken it has its file. It needs
// the QEMU driver's pause and resume.
func TestKillDuringPauseAndWake(t *testing.T) {
	needVMs(t)
	for _, fault := range []string{"pause.recorded", "pause.saved", "wake.recorded", "wake.resumed"} {
		t.Run(fault, func(t *testing.T) {
			dataDir := t.TempDir()
			s := startServer(t, dataDir)
			c := s.client(s.AdminKey)
			sb := c.createRunning(t, map[string]any{"vcpu": 1, "memoryMiB": 1024, "timeoutSeconds": 1800})
			c.sh(t, sb.ID, "echo kept > /workspace/kept")
			wake := fault == "wake.recorded" || fault == "wake.resumed"
			if wake {
				if r := c.raw(t, "POST", "/v1/sandboxes/"+sb.ID+":pause", map[string]any{}, http.Header{"Prefer": {"wait=60"}}, requestTimeout); r.err != nil || r.Status != http.StatusOK {
					t.Fatalf("pause: %v", r)
				}
				c.waitState(t, sb.ID, "paused")
			}
			s.kill9(t)

			verb := ":pause"
			if wake {
				verb = ":wake"
			}
			killedAt(t, dataDir, fault, func(s *server) {
				r := s.client(s.AdminKey).raw(t, "POST", "/v1/sandboxes/"+sb.ID+verb, map[string]any{}, nil, requestTimeout)
				if r.err == nil && r.Status != http.StatusOK {
					t.Fatalf("%s answered %v", verb, r)
				}
			})

			s = startServer(t, dataDir)
			c = s.client(s.AdminKey)
			var got sandboxJSON
			waitUntil(requestTimeout, 200*time.Millisecond, func() bool {
				got = c.get(t, sb.ID)
				return got.State != "pausing" && got.State != "resuming"
			})
			if got.State != "paused" && got.State != "running" {
				t.Fatalf("after a kill at %s the sandbox is %s (stopReason %q), want paused or running", fault, got.State, got.stopReason())
			}
			// An exec wakes it (autoWake) and finds the file.
			if out := c.sh(t, sb.ID, "cat /workspace/kept"); out != "kept\n" {
				t.Errorf("the file after a kill at %s: %q", fault, out)
			}
		})
	}
}
