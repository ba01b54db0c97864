package integration

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// The kill tests run `emberbox serve` with a fault point armed
// (internal/faultpoint): the server kills itself with SIGKILL at that exact
// step of a create or a delete. The next server on the same data dir must
// account for every sandbox: a create replayed with its Idempotency-Key
// answers with the one sandbox it made (never a second), a delete is
// finished, and no VM or disk is left that no record owns.

// killedAt starts a server with fault armed, runs step (which must make the
// server hit it), and waits for the server to die.
func killedAt(t *testing.T, dataDir, fault string, step func(s *server)) {
	t.Helper()
	s := startServerEnv(t, dataDir, "EMBERBOX_FAULTPOINT="+fault)
	step(s)
	select {
	case <-s.exited:
	case <-time.After(2 * time.Minute):
		t.Fatalf("the server did not die at fault point %s", fault)
	}
	t.Logf("server killed at %s (%v)", fault, s.waitErr)
}

func TestKillDuringCreate(t *testing.T) {
	needVMs(t)
	// Each fault point, and what the sandbox is after the restart: the VM
	// was not started or not recorded (it cannot be trusted), or it runs.
	cases := []struct {
		fault string
		state string // after the restart; "" means the replay made it anew
	}{
		{"idempotency.reserved", ""},
		{"create.recorded", "stopped"},
		{"create.vm_started", "stopped"},
		{"create.vm_recorded", "running"},
		{"idempotency.answered", "running"},
	}
	for _, tc := range cases {
		t.Run(tc.fault, func(t *testing.T) {
			dataDir := t.TempDir()
			label := strings.ReplaceAll(tc.fault, ".", "-")
			body := map[string]any{"vcpu": 1, "memoryMiB": 1024, "labels": map[string]string{"kill": label}}
			hdr := http.Header{"Idempotency-Key": {"create-" + label}, "Prefer": {"wait=60"}}
			killedAt(t, dataDir, tc.fault, func(s *server) {
				r := s.client(s.AdminKey).raw(t, "POST", "/v1/sandboxes", body, hdr, requestTimeout)
				if r.err == nil {
					t.Fatalf("create answered %d before the fault point: %s", r.Status, r.Body)
				}
			})

			s := startServer(t, dataDir)
			c := s.client(s.AdminKey)
			r := c.raw(t, "POST", "/v1/sandboxes", body, hdr, requestTimeout)
			if r.err != nil || r.Status != http.StatusOK {
				t.Fatalf("replayed create: %v", r)
			}
			var sb sandboxJSON
			if err := json.Unmarshal(r.Body, &sb); err != nil || sb.ID == "" {
				t.Fatalf("replayed create: %s: %v", r.Body, err)
			}
			replayed := r.Header.Get("Idempotency-Replayed") == "true"
			if tc.state == "" && replayed {
				t.Errorf("the create was replayed, but the first try recorded nothing")
			}
			if tc.state != "" && !replayed {
				t.Errorf("the create ran again instead of answering with the sandbox the first try recorded")
			}

			all := c.list(t, "?includeStopped=true&label=kill:"+label)
			if len(all) != 1 || all[0].ID != sb.ID {
				t.Fatalf("after the replay %d sandboxes carry the label (%v), want exactly %s", len(all), ids(all), sb.ID)
			}
			want := tc.state
			if want == "" {
				want = "running"
			}
			if want == "running" && sb.State != "running" {
				sb = c.waitState(t, sb.ID, "running")
			}
			if sb.State != want {
				t.Errorf("sandbox %s is %s (stopReason %q), want %s", sb.ID, sb.State, sb.stopReason(), want)
			}
			if want == "running" {
				if out := c.sh(t, sb.ID, "echo alive"); out != "alive\n" {
					t.Errorf("exec after the restart: %q", out)
				}
			}
			// Exactly the running sandbox has a VM: none from a boot the
			// crash cut short.
			vms := vmProcesses(dataDir)
			wantVMs := 0
			if want == "running" {
				wantVMs = 1
			}
			if len(vms) != wantVMs {
				t.Errorf("%d VMs run on the data dir (%v), want %d", len(vms), vms, wantVMs)
			}
		})
	}
}

func TestKillDuringDelete(t *testing.T) {
	needVMs(t)
	for _, fault := range []string{"delete.recorded", "delete.vm_ended", "delete.files_removed"} {
		t.Run(fault, func(t *testing.T) {
			dataDir := t.TempDir()
			var id string
			killedAt(t, dataDir, fault, func(s *server) {
				c := s.client(s.AdminKey)
				sb := c.createRunning(t, map[string]any{"vcpu": 1, "memoryMiB": 1024})
				id = sb.ID
				r := c.raw(t, "DELETE", "/v1/sandboxes/"+id, nil, http.Header{"Prefer": {deleteWaitValue}}, requestTimeout)
				if r.err == nil {
					t.Fatalf("delete answered %d before the fault point: %s", r.Status, r.Body)
				}
			})

			s := startServer(t, dataDir)
			c := s.client(s.AdminKey)
			// The restart finishes the delete in the background.
			gone := waitUntil(2*time.Minute, 200*time.Millisecond, func() bool {
				r := c.raw(t, "GET", "/v1/sandboxes/"+id, nil, nil, requestTimeout)
				return r.err == nil && r.Status == http.StatusNotFound
			})
			if !gone {
				t.Fatalf("sandbox %s is still there after the restart: %s", id, c.raw(t, "GET", "/v1/sandboxes/"+id, nil, nil, requestTimeout).Body)
			}
			if _, err := os.Stat(filepath.Join(dataDir, "sandboxes", id)); !os.IsNotExist(err) {
				t.Errorf("the deleted sandbox's files are still on disk (%v)", err)
			}
			if vms := vmProcesses(dataDir); len(vms) != 0 {
				t.Errorf("VMs still run after the delete: %v", vms)
			}
			if all := c.list(t, "?includeStopped=true"); len(all) != 0 {
				t.Errorf("sandboxes listed after the delete: %v", ids(all))
			}
		})
	}
}

// TestKillWhileCreatingAdminKey kills the first start between writing the
// admin key file and recording the key: the next start must still leave a
// working admin key in the file.
func TestKillWhileCreatingAdminKey(t *testing.T) {
	needVMs(t)
	dataDir := t.TempDir()
	s, err := launch(t, "127.0.0.1", dataDir, nil, []string{"EMBERBOX_FAULTPOINT=admin_key.written"})
	if err == nil {
		t.Fatalf("the server started although its fault point is on the way: %s", s.URL)
	}
	s2 := startServer(t, dataDir)
	r := s2.client(s2.AdminKey).raw(t, "GET", "/v1/sandboxes", nil, nil, requestTimeout)
	if r.err != nil || r.Status != http.StatusOK {
		t.Fatalf("the admin key in the file does not work after the restart: %v", r)
	}
}

func ids(sbs []sandboxJSON) []string {
	out := make([]string, 0, len(sbs))
	for _, sb := range sbs {
		out = append(out, fmt.Sprintf("%s(%s)", sb.ID, sb.State))
	}
	return out
}
