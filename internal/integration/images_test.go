package integration

import (
	"bytes"
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// serverRootfs returns the default image's disk the server boots, from
// its log line "guest image image=<recipe hash>".
func serverRootfs(t *testing.T, s *server) string {
	t.Helper()
	log, err := os.ReadFile(s.LogPath)
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`msg="guest image" image=([0-9a-f]+)`).FindSubmatch(log)
	if m == nil {
		t.Fatalf("no guest image line in the server log")
	}
	cache := os.Getenv("XDG_CACHE_HOME")
	if cache == "" {
		home, _ := os.UserHomeDir()
		cache = filepath.Join(home, ".cache")
	}
	p := filepath.Join(cache, "emberbox", "images", string(m[1]), "rootfs.img")
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("the server's rootfs: %v", err)
	}
	return p
}

// TestImageCatalog registers a custom image (a copy of the default disk
// with a start command) for one key, boots a sandbox of it, and checks
// the start command was ready when the create answered running, the
// image's env, other keys' blindness to it, and delete refused while in
// use.
func TestImageCatalog(t *testing.T) {
	dataDir := t.TempDir()
	s := startServer(t, dataDir)
	keyA, keyB := s.createKey(t, "img-a"), s.createKey(t, "img-b")
	a, b := s.client(keyA), s.client(keyB)
	me, _ := call[struct {
		ID string `json:"keyId"`
	}](t, a, "GET", "/v1/me", nil, nil)

	// The operator imports a copy of the default disk as key a's image
	// "web", whose sandboxes serve HTTP on port 8000 once started.
	begin := time.Now()
	cmd := exec.Command(filepath.Join(binDir, "emberbox"), "images", "import", serverRootfs(t, s), "--data-dir", dataDir,
		"--name", "web", "--owner", me.ID, "--env", "GREETING=hello", "--workdir", "/tmp",
		"--start-command", "python3 -m http.server 8000", "--ready-port", "8000", "--ready-timeout", "120")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("emberbox images import: %v: %s", err, stderr.String())
	}
	imageID := strings.TrimSpace(string(out))
	t.Logf("import: %s (%s)", strings.TrimSpace(stderr.String()), time.Since(begin).Round(time.Millisecond))

	type imageJSON struct {
		ID      string   `json:"id"`
		State   string   `json:"state"`
		Tags    []string `json:"tags"`
		DiskMiB int      `json:"diskMiB"`
		Public  bool     `json:"public"`
	}
	img, _ := call[imageJSON](t, a, "GET", "/v1/images/resolve?ref=web:latest", nil, nil)
	if img.ID != imageID || img.State != "ready" || img.Public {
		t.Fatalf("web:latest is %+v, want the import %s, ready, private", img, imageID)
	}
	if r := b.raw(t, "GET", "/v1/images/"+imageID, nil, nil, requestTimeout); r.Status != 404 || r.Err.Code != "image_not_found" {
		t.Errorf("key b reads key a's image: %v", r)
	}
	if r := b.raw(t, "POST", "/v1/sandboxes", map[string]any{"image": "web"}, nil, requestTimeout); r.Status != 404 || r.Err.Code != "image_not_found" {
		t.Errorf("key b creates from key a's image: %v", r)
	}

	type created struct {
		ID    string `json:"id"`
		State string `json:"state"`
		Start *struct {
			Command string  `json:"command"`
			Ready   bool    `json:"ready"`
			ReadyMs *int64  `json:"readyMs"`
			Error   *string `json:"error"`
		} `json:"start"`
	}
	createTimed := func(c *client, body map[string]any) (created, time.Duration) {
		t.Helper()
		begin := time.Now()
		r := c.raw(t, "POST", "/v1/sandboxes", body, http.Header{"Prefer": {"wait=120"}}, 3*time.Minute)
		took := time.Since(begin)
		if r.err != nil || r.Status != 200 {
			t.Fatalf("create %v: %v", body, r)
		}
		var sb created
		if err := json.Unmarshal(r.Body, &sb); err != nil {
			t.Fatal(err)
		}
		if sb.State != "running" {
			t.Fatalf("create %v answered %s, want running: %s", body, sb.State, r.Body)
		}
		return sb, took
	}

	def, defTook := createTimed(a, map[string]any{"image": "default"})
	custom, customTook := createTimed(a, map[string]any{"image": "web:latest", "env": map[string]string{"MINE": "1"}})
	t.Logf("create until running: default image %s, custom image %s (with its start command ready)",
		defTook.Round(time.Millisecond), customTook.Round(time.Millisecond))
	if def.Start != nil {
		t.Errorf("a default sandbox has a start report: %+v", def.Start)
	}
	if custom.Start == nil || !custom.Start.Ready || custom.Start.ReadyMs == nil || custom.Start.Command != "python3 -m http.server 8000" {
		t.Fatalf("start report %+v", custom.Start)
	}
	t.Logf("start command ready in %d ms", *custom.Start.ReadyMs)

	// Ready when the create answered: the server answers at once.
	res, _ := a.exec(t, custom.ID, execReq{Command: `curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:8000/ || ` +
		`python3 -c 'import urllib.request; print(urllib.request.urlopen("http://127.0.0.1:8000/").status, end="")'`})
	if res.exit() != "0" || res.Stdout != "200" {
		t.Errorf("the start command's server: exit %s stdout %q stderr %q", res.exit(), res.Stdout, res.Stderr)
	}
	// The image's env reaches commands, under the create's own.
	res, _ = a.exec(t, custom.ID, execReq{Command: `echo "$GREETING $MINE"; id -un`})
	if res.Stdout != "hello 1\nuser\n" {
		t.Errorf("env and user in a sandbox of the image: %q", res.Stdout)
	}
	// The start command runs as the sandbox user, in the image's workdir.
	res, _ = a.exec(t, custom.ID, execReq{Command: `ps -o user=,args= -C python3 | grep http.server; readlink /proc/$(pgrep -f http.server | head -1)/cwd`})
	if !strings.Contains(res.Stdout, "user") || !strings.Contains(res.Stdout, "/tmp") {
		t.Errorf("the start command's process: %q %q", res.Stdout, res.Stderr)
	}
	// Its events say so.
	if r := a.raw(t, "GET", "/v1/sandboxes/"+custom.ID+"/events", nil, nil, requestTimeout); r.Status != 200 ||
		!strings.Contains(string(r.Body), `"start_ready"`) {
		t.Errorf("events of the sandbox: %v", r)
	}
	// A read of the sandbox still carries the report.
	got, _ := call[created](t, a, "GET", "/v1/sandboxes/"+custom.ID, nil, nil)
	if got.Start == nil || !got.Start.Ready {
		t.Errorf("GET lost the start report: %+v", got.Start)
	}

	// Delete is refused while a sandbox uses the image, allowed after.
	if r := a.raw(t, "POST", "/v1/images/"+imageID+":delete", map[string]any{}, nil, requestTimeout); r.Status != 409 || r.Err.Code != "image_in_use" {
		t.Errorf("delete in use: %v", r)
	}
	a.delete(t, custom.ID)
	a.delete(t, def.ID)
	deleted, _ := call[imageJSON](t, a, "POST", "/v1/images/"+imageID+":delete", map[string]any{}, nil)
	if deleted.State != "deleted" {
		t.Errorf("deleted image: %+v", deleted)
	}
	if blobs, _ := filepath.Glob(filepath.Join(dataDir, "images", "blobs", "*", "rootfs.img")); len(blobs) != 0 {
		t.Errorf("blobs left after the image's delete: %v", blobs)
	}
	if r := a.raw(t, "POST", "/v1/sandboxes", map[string]any{"image": "web"}, nil, requestTimeout); r.Status != 404 {
		t.Errorf("create from a deleted image: %v", r)
	}
}
