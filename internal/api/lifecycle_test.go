package api

import (
	"net/http"
	"testing"
	"time"

	"github.com/emberbox/emberbox/internal/sandbox"
)

func TestPauseWakeRoutes(t *testing.T) {
	e := newEnv(t)
	e.m.add("key_a", "sbx_r", sandbox.StateRunning, time.Hour)
	w := e.do("POST", "/v1/sandboxes/sbx_r:pause", "{}")
	if w.Code != 200 {
		t.Fatalf("pause: %d %s", w.Code, w.Body)
	}
	got := decodeBody[map[string]any](t, w)
	if got["state"] != "pausing" || got["pausedAt"] == nil || got["endsAt"] != nil {
		t.Errorf("pause answered %v", got)
	}
	// Pausing again answers the sandbox as it is.
	if w := e.do("POST", "/v1/sandboxes/sbx_r:pause", ""); w.Code != 200 {
		t.Errorf("second pause: %d %s", w.Code, w.Body)
	}
	e.m.mu.Lock()
	e.m.sandboxes["sbx_r"].State = sandbox.StatePaused
	e.m.mu.Unlock()
	w = e.do("POST", "/v1/sandboxes/sbx_r:wake", `{"timeoutSeconds":600}`)
	if w.Code != 200 {
		t.Fatalf("wake: %d %s", w.Code, w.Body)
	}
	if got := decodeBody[map[string]any](t, w); got["state"] != "resuming" || got["timeoutSeconds"] != 600.0 {
		t.Errorf("wake answered %v", got)
	}
	e.m.add("key_a", "sbx_run", sandbox.StateRunning, time.Hour)
	w = e.do("POST", "/v1/sandboxes/sbx_run:wake", "{}")
	if w.Code != http.StatusConflict || errorOf(t, w).Code != "not_paused" {
		t.Errorf("wake of a running sandbox: %d %s, want 409 not_paused", w.Code, w.Body)
	}
	w = e.do("POST", "/v1/sandboxes/sbx_run:wake", `{"timeoutSeconds":5}`)
	if w.Code != 400 {
		t.Errorf("wake with timeoutSeconds 5: %d, want 400", w.Code)
	}
	// Another key's sandbox is not found.
	e.m.add("key_b", "sbx_b", sandbox.StatePaused, time.Hour)
	if w := e.do("POST", "/v1/sandboxes/sbx_b:wake", "{}"); w.Code != 404 {
		t.Errorf("wake of another key's sandbox: %d", w.Code)
	}
	// The paused states are known to waitFor and to list filters.
	for _, st := range []string{"pausing", "paused", "resuming"} {
		if w := e.do("GET", "/v1/sandboxes?state="+st, ""); w.Code != 200 {
			t.Errorf("list state=%s: %d %s", st, w.Code, w.Body)
		}
		if w := e.do("GET", "/v1/sandboxes/sbx_r?waitFor="+st+"&timeoutSeconds=0", ""); w.Code != 200 {
			t.Errorf("waitFor=%s: %d %s", st, w.Code, w.Body)
		}
	}
}

func TestRestartAndUpdateRoutes(t *testing.T) {
	e := newEnv(t)
	e.m.add("key_a", "sbx_s", sandbox.StateStopped, 0)
	w := e.do("POST", "/v1/sandboxes/sbx_s:restart", "{}")
	if w.Code != 200 || decodeBody[map[string]any](t, w)["state"] != "starting" || e.m.restarts != 1 {
		t.Fatalf("restart: %d %s", w.Code, w.Body)
	}
	w = e.do("POST", "/v1/sandboxes/sbx_s:update",
		`{"name":"n1","labels":{"a":"b"},"env":{"X":"1","Y":null},"autoWake":false,"idlePauseSeconds":30,"persistent":true,"timeoutSeconds":0,"onTimeout":"pause","maxTotalCostMicros":null}`)
	if w.Code != 200 {
		t.Fatalf("update: %d %s", w.Code, w.Body)
	}
	u := e.m.lastUpdate
	if *u.Name != "n1" || u.Labels["a"] != "b" || *u.Env["X"] != "1" || u.Env["Y"] != nil || *u.AutoWake ||
		*u.IdlePauseSeconds != 60 || !*u.Persistent || *u.TimeoutSeconds != 0 || *u.OnLeaseEnd != "pause" {
		t.Errorf("update spec %+v (a short idle pause is raised to 60)", u)
	}
	got := decodeBody[map[string]any](t, w)
	if got["name"] != "n1" || got["autoWake"] != false || got["persistent"] != true || got["onLeaseEnd"] != "pause" {
		t.Errorf("update answered %v", got)
	}
	for _, body := range []string{`{"name":"-x"}`, `{"idlePauseSeconds":-1}`, `{"timeoutSeconds":59}`,
		`{"onTimeout":"explode"}`, `{"user":"root"}`, `{"env":{"1X":"y"}}`, `{"vcpu":4}`} {
		if w := e.do("POST", "/v1/sandboxes/sbx_s:update", body); w.Code != 400 {
			t.Errorf("update %s: %d, want 400", body, w.Code)
		}
	}
}
