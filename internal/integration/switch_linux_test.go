package integration

import (
	"bytes"
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// editedRootfs copies the server's default disk to dir/name and runs the
// debugfs commands on the copy (a disk with a file more, or broken on
// purpose), without a build VM.
func editedRootfs(t *testing.T, s *server, dir, name string, cmds ...string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if out, err := exec.Command("cp", "--sparse=always", serverRootfs(t, s), p).CombinedOutput(); err != nil {
		t.Fatalf("copying the rootfs: %v: %s", err, out)
	}
	script := filepath.Join(dir, name+".debugfs")
	if err := os.WriteFile(script, []byte(strings.Join(cmds, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("debugfs", "-w", "-f", script, p).CombinedOutput(); err != nil {
		t.Fatalf("debugfs: %v: %s", err, out)
	}
	return p
}

// importImage registers a disk as owner's image name and returns its id.
func importImage(t *testing.T, dataDir, owner, disk, name string) string {
	t.Helper()
	cmd := exec.Command(filepath.Join(binDir, "emberbox"), "images", "import", disk, "--data-dir", dataDir, "--name", name, "--owner", owner)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("emberbox images import %s: %v: %s", name, err, stderr.String())
	}
	return strings.TrimSpace(string(out))
}

// TestSwitchImage moves a sandbox to another image on real VMs: its
// /workspace (with ~/.local), its volume, env, id and name stay, its
// sudo install outside /workspace goes, the new image's file is there; a
// switch to an image that cannot hold /workspace is undone with the
// sandbox's processes still running; the old image is free to delete
// after, the new one held; bad requests are refused.
func TestSwitchImage(t *testing.T) {
	needVMs(t)
	if _, err := exec.LookPath("debugfs"); err != nil {
		t.Skip("no debugfs to make test images")
	}
	dataDir := t.TempDir()
	s := startServer(t, dataDir)
	key, other := s.createKey(t, "switch"), s.createKey(t, "switch-other")
	a, b := s.client(key), s.client(other)
	me, _ := call[struct {
		ID string `json:"keyId"`
	}](t, a, "GET", "/v1/me", nil, nil)

	// Three images: "base", a copy of the default disk; "fresh", with a
	// file of its own; "broken", whose /workspace is a file, so that a
	// workspace cannot be written into it.
	work := publicDir(t)
	marker := filepath.Join(work, "marker")
	if err := os.WriteFile(marker, []byte("fresh image\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	freshDisk := editedRootfs(t, s, work, "fresh.img", "cd /etc", "write "+marker+" emberbox-fresh")
	brokenDisk := editedRootfs(t, s, work, "broken.img", "unlink /workspace", "write "+marker+" workspace")
	baseID := importImage(t, dataDir, me.ID, serverRootfs(t, s), "base")
	freshID := importImage(t, dataDir, me.ID, freshDisk, "fresh")
	importImage(t, dataDir, me.ID, brokenDisk, "broken")
	os.Remove(freshDisk)
	os.Remove(brokenDisk)

	sb := a.createRunning(t, map[string]any{"image": "base", "name": "switcher", "vcpu": 1, "memoryMiB": 1024,
		"env": map[string]string{"MINE": "kept"}})
	vol := a.newVolume(t, 64)
	a.attach(t, vol.ID, sb.ID, "/workspace/data")
	home := a.sh(t, sb.ID, `echo hello > /workspace/keep.txt && mkdir -p ~/.local/bin && printf 'echo tool\n' > ~/.local/bin/mytool && `+
		`chmod 755 ~/.local/bin/mytool && echo voldata > /workspace/data/v.txt && sudo sh -c 'echo m > /etc/marker' && echo $HOME`)
	if strings.TrimSpace(home) != "/workspace" {
		t.Fatalf("HOME is %q, want /workspace", home)
	}
	sleeper := a.spawn(t, sb.ID, "sleep 100000")

	switchImage := func(c *client, id string, body map[string]any) (*response, time.Duration) {
		begin := time.Now()
		r := c.raw(t, "POST", "/v1/sandboxes/"+id+":switch-image", body, http.Header{"Prefer": {"wait=120"}}, 10*time.Minute)
		if r.err != nil {
			t.Fatalf("switch-image %v: %v", body, r.err)
		}
		return r, time.Since(begin)
	}

	// Refused: a keep other than workspace, an unknown image, another
	// key's sandbox, no image.
	for _, tc := range []struct {
		c      *client
		body   map[string]any
		status int
		code   string
	}{
		{a, map[string]any{"image": "fresh", "keep": "disk"}, 400, "invalid_request"},
		{a, map[string]any{"keep": "workspace"}, 400, "invalid_request"},
		{a, map[string]any{"image": "nope", "keep": "workspace"}, 404, "image_not_found"},
		{b, map[string]any{"image": "fresh", "keep": "workspace"}, 404, "not_found"},
	} {
		if r, _ := switchImage(tc.c, sb.ID, tc.body); r.Status != tc.status || errCode(r) != tc.code {
			t.Errorf("switch %v: %v, want %d %s", tc.body, r, tc.status, tc.code)
		}
	}

	// A switch that fails is undone: on its old image, its files and its
	// processes as they were.
	r, took := switchImage(a, sb.ID, map[string]any{"image": "broken", "keep": "workspace"})
	if r.Status != http.StatusConflict || errCode(r) != "switch_undone" {
		t.Fatalf("switch to the broken image: %v, want 409 switch_undone", r)
	}
	t.Logf("undone switch: %s: %s", took.Round(time.Millisecond), r.Err.Message)
	got := a.get(t, sb.ID)
	if got.State != "running" {
		t.Fatalf("after the undone switch the sandbox is %s", got.State)
	}
	if out := a.sh(t, sb.ID, "cat /workspace/keep.txt /etc/marker /workspace/data/v.txt; test -e /etc/emberbox-fresh || echo nofresh"); out != "hello\nm\nvoldata\nnofresh\n" {
		t.Errorf("after the undone switch: %q", out)
	}
	if p, _ := call[processJSON](t, a, "GET", "/v1/sandboxes/"+sb.ID+"/processes/"+sleeper.ID, nil, nil); p.State != "running" {
		t.Errorf("the process from before the undone switch: %+v", p)
	}

	// The switch.
	r, took = switchImage(a, sb.ID, map[string]any{"image": "fresh", "keep": "workspace"})
	if r.Status != http.StatusOK {
		t.Fatalf("switch to fresh: %v", r)
	}
	t.Logf("switch of a running sandbox to another image: %s", took.Round(time.Millisecond))
	var after struct {
		ID, State, ImageID string
		Name               *string
		EnvNames           []string
	}
	if err := json.Unmarshal(r.Body, &after); err != nil {
		t.Fatal(err)
	}
	if after.ID != sb.ID || after.State != "running" || after.ImageID != freshID || after.Name == nil || *after.Name != "switcher" {
		t.Errorf("switched sandbox: %s", r.Body)
	}
	out := a.sh(t, sb.ID, `cat /etc/emberbox-fresh /workspace/keep.txt; stat -c %U /workspace/keep.txt; mytool; `+
		`test -e /etc/marker || echo nomarker; cat /workspace/data/v.txt; echo $MINE`)
	if want := "fresh image\nhello\nuser\ntool\nnomarker\nvoldata\nkept\n"; out != want {
		t.Errorf("after the switch: %q, want %q", out, want)
	}
	if mnt := a.sh(t, sb.ID, "findmnt -n -o TARGET /workspace/data || true"); strings.TrimSpace(mnt) != "/workspace/data" {
		t.Errorf("the volume is not mounted after the switch: %q", mnt)
	}
	if p, r := call[processJSON](t, a, "GET", "/v1/sandboxes/"+sb.ID+"/processes/"+sleeper.ID, nil, nil); r.Status == 200 && p.State == "running" {
		t.Errorf("the old image's process still runs: %+v", p)
	}
	// Files written after the switch land on the new disk, and the volume
	// takes writes.
	a.sh(t, sb.ID, "echo more >> /workspace/data/v.txt && echo new > /workspace/new.txt")
	if ev := a.raw(t, "GET", "/v1/sandboxes/"+sb.ID+"/events", nil, nil, requestTimeout); !strings.Contains(string(ev.Body), `"image_switched"`) ||
		!strings.Contains(string(ev.Body), `"switch_undone"`) {
		t.Errorf("events: %s", ev.Body)
	}

	// The old image is no longer held; the new one is.
	if r := a.raw(t, "POST", "/v1/images/"+freshID+":delete", map[string]any{}, nil, requestTimeout); r.Status != 409 || errCode(r) != "image_in_use" {
		t.Errorf("delete of the image in use: %v", r)
	}
	if r := a.raw(t, "POST", "/v1/images/"+baseID+":delete", map[string]any{}, nil, requestTimeout); r.Status != 200 {
		t.Errorf("delete of the image switched away from: %v", r)
	}

	// A paused sandbox is switched too (woken to read its workspace), and
	// back to the default image.
	if r := a.raw(t, "POST", "/v1/sandboxes/"+sb.ID+":pause", map[string]any{}, http.Header{"Prefer": {"wait=120"}}, requestTimeout); r.Status != 200 {
		t.Fatalf("pause: %v", r)
	}
	a.waitState(t, sb.ID, "paused")
	r, took = switchImage(a, sb.ID, map[string]any{"image": "default"})
	if r.Status != http.StatusOK || strings.Contains(string(r.Body), `"imageId"`) {
		t.Fatalf("switch of a paused sandbox to the default image: %v", r)
	}
	t.Logf("switch of a paused sandbox to the default image: %s", took.Round(time.Millisecond))
	if out := a.sh(t, sb.ID, "cat /workspace/new.txt /workspace/data/v.txt; test -e /etc/emberbox-fresh || echo nofresh"); out != "new\nvoldata\nmore\nnofresh\n" {
		t.Errorf("after the switch back: %q", out)
	}
	a.delete(t, sb.ID)
	if r := a.raw(t, "POST", "/v1/images/"+freshID+":delete", map[string]any{}, nil, requestTimeout); r.Status != 200 {
		t.Errorf("delete of fresh after the sandbox left it: %v", r)
	}
	if left, _ := filepath.Glob(filepath.Join(dataDir, "sandboxes", "*.switch")); len(left) != 0 {
		t.Errorf("switch files left: %v", left)
	}
}

// TestKillDuringSwitch: a server killed once the new image's VM has booted
// (the old VM paused, its files aside) leaves, at the next start, the
// sandbox paused on its old image with its memory: a wake finds its
// process and files, no VM or switch files are left over, and a switch
// then goes through.
func TestKillDuringSwitch(t *testing.T) {
	needVMs(t)
	dataDir := t.TempDir()
	var id, sleeper string
	killedAt(t, dataDir, "switch.booted", func(s *server) {
		c := s.client(s.AdminKey)
		sb := c.createRunning(t, map[string]any{"vcpu": 1, "memoryMiB": 1024})
		id = sb.ID
		c.sh(t, id, "echo hello > /workspace/keep.txt && sudo sh -c 'echo m > /etc/marker'")
		sleeper = c.spawn(t, id, "sleep 100000").ID
		r := c.raw(t, "POST", "/v1/sandboxes/"+id+":switch-image", map[string]any{"image": "default"}, nil, 10*time.Minute)
		if r.err == nil {
			t.Fatalf("switch answered %d before the fault point: %s", r.Status, r.Body)
		}
	})
	s := startServer(t, dataDir)
	c := s.client(s.AdminKey)
	if got := c.get(t, id); got.State != "paused" {
		t.Fatalf("after the restart the sandbox is %s (%s), want paused", got.State, got.stopReason())
	}
	if left, _ := filepath.Glob(filepath.Join(dataDir, "sandboxes", "*.switch")); len(left) != 0 {
		t.Errorf("switch files left: %v", left)
	}
	if vms := vmProcesses(dataDir); len(vms) != 0 {
		t.Errorf("VMs running for a paused sandbox: %+v", vms)
	}
	if r := c.raw(t, "POST", "/v1/sandboxes/"+id+":wake", map[string]any{}, http.Header{"Prefer": {"wait=120"}}, requestTimeout); r.Status != 200 {
		t.Fatalf("wake: %v", r)
	}
	c.waitState(t, id, "running")
	if out := c.sh(t, id, "cat /workspace/keep.txt /etc/marker"); out != "hello\nm\n" {
		t.Errorf("after the undone switch: %q", out)
	}
	if p, _ := call[processJSON](t, c, "GET", "/v1/sandboxes/"+id+"/processes/"+sleeper, nil, nil); p.State != "running" {
		t.Errorf("the process from before the switch: %+v", p)
	}
	r := c.raw(t, "POST", "/v1/sandboxes/"+id+":switch-image", map[string]any{"image": "default"}, nil, 10*time.Minute)
	if r.err != nil || r.Status != 200 {
		t.Fatalf("switch after the restart: %v", r)
	}
	if out := c.sh(t, id, "cat /workspace/keep.txt; test -e /etc/marker || echo nomarker"); out != "hello\nnomarker\n" {
		t.Errorf("after the switch: %q", out)
	}
	c.delete(t, id)
}
