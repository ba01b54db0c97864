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

type checkpointJSON struct {
	ID        string `json:"id"`
	Kind      string `json:"kind"`
	SandboxID string `json:"sandboxId"`
	Label     string `json:"label"`
	State     string `json:"state"`
	SizeBytes int64  `json:"sizeBytes"`
	BaseID    string `json:"baseId"`
}

// checkpoint takes a checkpoint of sandbox id and answers it with the
// time the call took.
func (c *client) checkpoint(t testing.TB, id, label string) (checkpointJSON, time.Duration) {
	t.Helper()
	start := time.Now()
	r := c.raw(t, "POST", "/v1/sandboxes/"+id+"/checkpoints", map[string]any{"label": label}, nil, requestTimeout)
	took := time.Since(start)
	if r.err != nil || r.Status != http.StatusOK {
		t.Fatalf("checkpoint of %s: %v", id, r)
	}
	var cp checkpointJSON
	if err := json.Unmarshal(r.Body, &cp); err != nil || cp.State != "ready" || cp.Kind != "checkpoint" || cp.SandboxID != id {
		t.Fatalf("checkpoint answered %s (%v)", r.Body, err)
	}
	return cp, took
}

func (c *client) checkpoints(t testing.TB, id string) []checkpointJSON {
	t.Helper()
	r := c.raw(t, "GET", "/v1/sandboxes/"+id+"/checkpoints", nil, nil, requestTimeout)
	if r.err != nil || r.Status != http.StatusOK {
		t.Fatalf("checkpoints of %s: %v", id, r)
	}
	var out struct {
		Checkpoints []checkpointJSON `json:"checkpoints"`
	}
	if err := json.Unmarshal(r.Body, &out); err != nil {
		t.Fatalf("checkpoints answered %s: %v", r.Body, err)
	}
	return out.Checkpoints
}

// restore brings sandbox id back to checkpoint cid and answers the time
// the call took (until the sandbox runs again).
func (c *client) restore(t testing.TB, id, cid string, keep bool) time.Duration {
	t.Helper()
	start := time.Now()
	r := c.raw(t, "POST", "/v1/sandboxes/"+id+"/checkpoints/"+cid+":restore", map[string]any{"keep": keep}, nil, requestTimeout)
	took := time.Since(start)
	if r.err != nil || r.Status != http.StatusOK {
		t.Fatalf("restore of %s to %s: %v", id, cid, r)
	}
	var sb sandboxJSON
	if err := json.Unmarshal(r.Body, &sb); err != nil || sb.ID != id || sb.State != "running" {
		t.Fatalf("restore answered %s (%v), want the sandbox running", r.Body, err)
	}
	return took
}

// exited0 reports whether a command ran to exit status 0.
func exited0(res execResult) bool { return res.ExitCode != nil && *res.ExitCode == 0 }

// serverPID is the process id of the sandbox's web server on port 8000.
func serverPID(t testing.TB, c *client, id string) string {
	t.Helper()
	return strings.TrimSpace(c.sh(t, id, "pgrep -f '^python3 -m http[.]server 8000' | head -1"))
}

// TestCheckpoints: a sandbox runs a web server, has files in /workspace and
// its home, and a package installed with pip; it is checkpointed; the next
// step breaks all of it; a restore brings back the files, the package and
// the same server process, answering on its port. A branch of three from
// the checkpoint gives sandboxes that diverge from it independently. A
// restore works on a paused sandbox and after a kill -9 of the server;
// the checkpoints are the sandbox's own (not another key's, not among the
// snapshots) and go with it.
func TestCheckpoints(t *testing.T) {
	dataDir := t.TempDir()
	s := startServer(t, dataDir)
	c := s.client(s.AdminKey)
	sb := c.createRunning(t, map[string]any{"timeoutSeconds": 1800})
	c.sh(t, sb.ID, "echo before > /workspace/kept && echo notes > ~/notes")
	serveHTTP(t, c, sb.ID)
	pid := serverPID(t, c, sb.ID)
	if res, _ := c.exec(t, sb.ID, execReq{Command: "pip install -q --disable-pip-version-check tabulate 2>&1 && python3 -c 'import tabulate'", TimeoutMs: 600_000}); !exited0(res) {
		t.Fatalf("pip install: %+v", res)
	}

	cp, took := c.checkpoint(t, sb.ID, "good")
	t.Logf("checkpoint after a pip install: %s, %d MiB", took.Round(time.Millisecond), cp.SizeBytes>>20)
	if cp.Label != "good" || cp.SizeBytes <= 0 {
		t.Errorf("checkpoint %+v", cp)
	}
	checkKept(t, c, sb.ID, "before", "running on after the checkpoint")

	// The next step breaks everything.
	c.sh(t, sb.ID, "rm -rf /workspace/* ~/*; pip uninstall -y -q tabulate 2>&1; kill "+pid+"; echo broken")
	if res, _ := c.exec(t, sb.ID, execReq{Command: "python3 -c 'import tabulate'"}); exited0(res) {
		t.Fatalf("the package is still importable after pip uninstall")
	}
	if res, _ := c.exec(t, sb.ID, execReq{Command: "curl -sf localhost:8000/"}); exited0(res) {
		t.Fatalf("the web server still answers after its kill")
	}

	took = c.restore(t, sb.ID, cp.ID, false)
	t.Logf("restore of a running sandbox: %s", took.Round(time.Millisecond))
	checkKept(t, c, sb.ID, "before", "after the restore")
	if got := serverPID(t, c, sb.ID); got != pid {
		t.Errorf("after the restore the web server is pid %q, want the same process %q", got, pid)
	}
	if got := c.sh(t, sb.ID, "cat ~/notes && python3 -c 'import tabulate; print(\"tabulate\")'"); got != "notes\ntabulate\n" {
		t.Errorf("after the restore: %q, want the home file and the package back", got)
	}
	if got := c.get(t, sb.ID); got.State != "running" {
		t.Errorf("after the restore the sandbox is %s", got.State)
	}

	// The checkpoint is the sandbox's own.
	if list := c.checkpoints(t, sb.ID); len(list) != 1 || list[0].ID != cp.ID {
		t.Errorf("checkpoints: %+v, want the one taken", list)
	}
	other := s.client(s.createKey(t, "other"))
	if r := other.raw(t, "GET", "/v1/sandboxes/"+sb.ID+"/checkpoints/"+cp.ID, nil, nil, requestTimeout); r.Status != http.StatusNotFound {
		t.Errorf("another key's GET of the checkpoint: %v, want 404", r)
	}
	if r := other.raw(t, "POST", "/v1/sandboxes/"+sb.ID+"/checkpoints/"+cp.ID+":restore", map[string]any{}, nil, requestTimeout); r.Status != http.StatusNotFound {
		t.Errorf("another key's restore: %v, want 404", r)
	}
	if r := c.raw(t, "GET", "/v1/snapshots/"+cp.ID, nil, nil, requestTimeout); r.Status != http.StatusOK {
		t.Errorf("GET /v1/snapshots of a checkpoint: %v", r)
	}
	if r := c.raw(t, "POST", "/v1/sandboxes/"+sb.ID+"/checkpoints", map[string]any{"label": "bad\x01label"}, nil, requestTimeout); r.Status != http.StatusBadRequest {
		t.Errorf("a label with a control character: %v, want 400", r)
	}

	t.Run("Branch", func(t *testing.T) {
		start := time.Now()
		r := c.raw(t, "POST", "/v1/sandboxes/"+sb.ID+"/checkpoints/"+cp.ID+":branch", map[string]any{"count": 3, "name": "try"}, nil, requestTimeout)
		if r.err != nil || r.Status != http.StatusOK {
			t.Fatalf("branch: %v", r)
		}
		t.Logf("branch of 3: %s", time.Since(start).Round(time.Millisecond))
		var out struct {
			Sandboxes []sandboxJSON `json:"sandboxes"`
		}
		if err := json.Unmarshal(r.Body, &out); err != nil || len(out.Sandboxes) != 3 {
			t.Fatalf("branch answered %s (%v), want three sandboxes", r.Body, err)
		}
		for _, b := range out.Sandboxes {
			s.tr.add(b.ID, s.AdminKey)
		}
		// The source moves on; each branch starts from the checkpoint and
		// goes its own way.
		c.sh(t, sb.ID, "echo source > /workspace/kept")
		for _, b := range out.Sandboxes {
			checkKept(t, c, b.ID, "before", "branch "+b.ID)
			c.sh(t, b.ID, "echo "+b.ID+" > /workspace/kept")
		}
		for _, b := range out.Sandboxes {
			checkKept(t, c, b.ID, b.ID, "branch "+b.ID+" after each wrote its own")
			c.delete(t, b.ID)
		}
		checkKept(t, c, sb.ID, "source", "the source after its branches")
	})

	// A paused sandbox, after a kill -9 of the server (the same test, not
	// a subtest: the new server lives until the end).
	c.sh(t, sb.ID, "echo present > /workspace/kept")
	c.lifecycle(t, sb.ID, "pause", nil)
	c.waitState(t, sb.ID, "paused")
	s.kill9(t)
	s = startServer(t, dataDir)
	c = s.client(s.AdminKey)
	if list := c.checkpoints(t, sb.ID); len(list) != 1 || list[0].ID != cp.ID {
		t.Fatalf("checkpoints after a kill -9: %+v", list)
	}
	took = c.restore(t, sb.ID, cp.ID, true)
	t.Logf("restore of a paused sandbox, keeping the present: %s", took.Round(time.Millisecond))
	checkKept(t, c, sb.ID, "before", "after restoring a paused sandbox")
	list := c.checkpoints(t, sb.ID)
	if len(list) != 2 || list[1].Label != "before-restore" {
		t.Fatalf("after a restore with keep: %+v", list)
	}
	// The kept one is stored as what differs from the first, whole one.
	t.Logf("a checkpoint over the first: %d KiB (the first: %d MiB)", list[1].SizeBytes>>10, cp.SizeBytes>>20)
	if list[1].BaseID != cp.ID || list[1].SizeBytes >= cp.SizeBytes/2 {
		t.Errorf("the kept checkpoint: base %q, %d bytes; want a difference over %s (%d bytes)", list[1].BaseID, list[1].SizeBytes, cp.ID, cp.SizeBytes)
	}
	// The kept present comes back too, from its difference over the first.
	c.restore(t, sb.ID, list[1].ID, false)
	checkKept(t, c, sb.ID, "present", "back to the kept present")
	if got := c.sh(t, sb.ID, "cat ~/notes && python3 -c 'import tabulate; print(\"tabulate\")'"); got != "notes\ntabulate\n" {
		t.Errorf("after restoring a difference: %q, want the home file and the package", got)
	}
	// The first, whole one deleted: its files stay while the one over it
	// needs them, and a restore from that one still works.
	if r := c.raw(t, "DELETE", "/v1/sandboxes/"+sb.ID+"/checkpoints/"+cp.ID, nil, nil, requestTimeout); r.err != nil || r.Status != http.StatusOK {
		t.Fatalf("delete checkpoint: %v", r)
	}
	if _, err := os.Stat(filepath.Join(dataDir, "snapshots", cp.ID)); err != nil {
		t.Errorf("a base's files after its delete, with a checkpoint over it: %v", err)
	}
	c.sh(t, sb.ID, "echo later > /workspace/kept")
	c.restore(t, sb.ID, list[1].ID, false)
	checkKept(t, c, sb.ID, "present", "restoring a difference whose base was deleted")

	// Deleted with the sandbox, files and all.
	c.delete(t, sb.ID)
	if r := c.raw(t, "GET", "/v1/snapshots/"+cp.ID, nil, nil, requestTimeout); r.Status != http.StatusNotFound {
		t.Errorf("the checkpoint after its sandbox's delete: %v, want 404", r)
	}
	if _, err := os.Stat(filepath.Join(dataDir, "snapshots", cp.ID)); !os.IsNotExist(err) {
		t.Errorf("the checkpoint's files after its sandbox's delete: %v", err)
	}
}
