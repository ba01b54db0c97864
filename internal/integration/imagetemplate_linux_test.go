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

// TestImageTemplate: a custom image's first create boots and has the
// image's template built; a later create is a copy of that template (its
// ready event says so) that sees the image's files and env and runs the
// image's start command itself, after the restore; such a copy restarts
// from its own disk, pauses and wakes, and forks; deleting the image once
// its sandboxes are gone removes its templates.
func TestImageTemplate(t *testing.T) {
	s := startServer(t, t.TempDir())
	c := s.client(s.AdminKey)
	img := buildImage(t, c, map[string]any{
		"name":   "tpl-app",
		"recipe": map[string]any{"files": []map[string]string{{"path": "/opt/tpl/hello.txt", "content": "hello from the image\n"}}},
		"env":    map[string]string{"APP_GREETING": "hi-from-image"},
		// The start command records the host name it ran under: a copy
		// is renamed after the restore, so the name proves it ran there.
		"start": map[string]any{"command": "hostname > /tmp/started.txt && echo \"$APP_GREETING\" >> /tmp/started.txt && exec sleep 3600",
			"readyCommand": "test -s /tmp/started.txt", "readyTimeoutSeconds": 120},
	})
	imageID := img["id"].(string)
	tplGlob := filepath.Join(s.DataDir, "templates", "images", "*", "*", "2cpu-4096mib-4096mib", "template.ok")

	check := func(id string) {
		t.Helper()
		if got := c.sh(t, id, "cat /opt/tpl/hello.txt"); got != "hello from the image\n" {
			t.Errorf("%s: the image's file reads %q", id, got)
		}
		if got := c.sh(t, id, `echo "$APP_GREETING"`); got != "hi-from-image\n" {
			t.Errorf("%s: the image's env reads %q", id, got)
		}
		host := strings.TrimSpace(c.sh(t, id, "hostname"))
		if got := c.sh(t, id, "cat /tmp/started.txt"); got != host+"\nhi-from-image\n" {
			t.Errorf("%s: the start command wrote %q, want its host name %q and the image's env", id, got, host)
		}
	}

	first := c.createRunning(t, map[string]any{"image": "tpl-app", "timeoutSeconds": 1800})
	if template, _ := readyEvent(t, c, first.ID)["template"].(bool); template {
		t.Fatalf("the image's first create was made from a template")
	}
	check(first.ID)
	if !waitUntil(5*time.Minute, 500*time.Millisecond, func() bool { m, _ := filepath.Glob(tplGlob); return len(m) == 1 }) {
		t.Fatalf("the image's template was not built in 5 minutes; log:\n%s", s.logTail(40))
	}
	markers, _ := filepath.Glob(tplGlob)
	imageTemplates := filepath.Dir(filepath.Dir(filepath.Dir(markers[0])))

	begin := time.Now()
	copied := c.createRunning(t, map[string]any{"image": "tpl-app", "timeoutSeconds": 1800})
	took := time.Since(begin)
	ready := readyEvent(t, c, copied.ID)
	if template, _ := ready["template"].(bool); !template {
		t.Fatalf("a create after the image's template was built booted: ready event %v", ready)
	}
	t.Logf("create from the image's template: %s to running (ready event %v)", took.Round(time.Millisecond), ready)
	check(copied.ID)

	// Its disk is over the template's: a restart boots that disk.
	c.sh(t, copied.ID, "echo mine > /workspace/kept && sync")
	if r := c.raw(t, "POST", "/v1/sandboxes/"+copied.ID+":stop", map[string]any{}, http.Header{"Prefer": {"wait=60"}}, requestTimeout); r.Status != http.StatusOK {
		t.Fatalf("stop: %v", r)
	}
	if r := c.raw(t, "POST", "/v1/sandboxes/"+copied.ID+":restart", map[string]any{}, http.Header{"Prefer": {"wait=60"}}, requestTimeout); r.Status != http.StatusOK {
		t.Fatalf("restart: %v", r)
	}
	c.waitState(t, copied.ID, "running")
	if got := c.sh(t, copied.ID, "cat /workspace/kept /opt/tpl/hello.txt"); got != "mine\nhello from the image\n" {
		t.Errorf("after a restart the disk reads %q", got)
	}
	// Paused and woken.
	if r := c.raw(t, "POST", "/v1/sandboxes/"+copied.ID+":pause", map[string]any{}, http.Header{"Prefer": {"wait=60"}}, requestTimeout); r.Status != http.StatusOK {
		t.Fatalf("pause: %v", r)
	}
	c.waitState(t, copied.ID, "paused")
	if r := c.raw(t, "POST", "/v1/sandboxes/"+copied.ID+":wake", map[string]any{}, nil, requestTimeout); r.Status != http.StatusOK {
		t.Fatalf("wake: %v", r)
	}
	c.waitState(t, copied.ID, "running")
	if got := c.sh(t, copied.ID, "cat /workspace/kept"); got != "mine\n" {
		t.Errorf("after a wake the disk reads %q", got)
	}
	// Forked.
	r := c.raw(t, "POST", "/v1/sandboxes/"+copied.ID+":fork", map[string]any{"count": 1}, nil, requestTimeout)
	var forked struct {
		Sandboxes []sandboxJSON `json:"sandboxes"`
	}
	if r.err != nil || r.Status != http.StatusOK || json.Unmarshal(r.Body, &forked) != nil || len(forked.Sandboxes) != 1 {
		t.Fatalf("fork: %v", r)
	}
	fork := forked.Sandboxes[0]
	s.tr.add(fork.ID, s.AdminKey)
	if fork.State != "running" {
		c.waitState(t, fork.ID, "running")
	}
	if got := c.sh(t, fork.ID, "cat /workspace/kept /opt/tpl/hello.txt"); got != "mine\nhello from the image\n" {
		t.Errorf("the fork's disk reads %q", got)
	}

	// The image goes once its sandboxes have, and its templates with it.
	if r := c.raw(t, "POST", "/v1/images/"+imageID+":delete", map[string]any{}, nil, requestTimeout); r.Status != http.StatusConflict {
		t.Errorf("deleting an image in use: %v", r)
	}
	if _, err := os.Stat(imageTemplates); err != nil {
		t.Fatalf("the image's templates went while it is in use: %v", err)
	}
	for _, id := range []string{first.ID, copied.ID, fork.ID} {
		c.delete(t, id)
	}
	if r := c.raw(t, "POST", "/v1/images/"+imageID+":delete", map[string]any{}, nil, requestTimeout); r.Status != http.StatusOK {
		t.Fatalf("deleting the image: %v", r)
	}
	if _, err := os.Stat(imageTemplates); !os.IsNotExist(err) {
		t.Errorf("the deleted image's templates are still in %s: %v", imageTemplates, err)
	}
}

// readyEvent is the data of sandbox id's "ready" event.
func readyEvent(t testing.TB, c *client, id string) map[string]any {
	t.Helper()
	// The manager appends the event just after the state change a create
	// waits for (Manager.ready), so it may be a moment behind it.
	var data map[string]any
	if !waitUntil(30*time.Second, 200*time.Millisecond, func() bool {
		page, _ := call[struct {
			Data []struct {
				Type string         `json:"type"`
				Data map[string]any `json:"data"`
			} `json:"data"`
		}](t, c, "GET", "/v1/sandboxes/"+id+"/events?limit=1000", nil, nil)
		for _, e := range page.Data {
			if e.Type == "ready" {
				data = e.Data
				return true
			}
		}
		return false
	}) {
		t.Fatalf("sandbox %s has no ready event", id)
	}
	return data
}
