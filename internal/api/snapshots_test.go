package api

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/emberbox/emberbox/internal/sandbox"
)

func TestSnapshotRoutes(t *testing.T) {
	e := newEnv(t)
	e.m.add("key_a", "sbx_r", sandbox.StateRunning, time.Hour)
	w := e.do("POST", "/v1/sandboxes/sbx_r:snapshot", `{"name":"base","labels":{"a":"b"},"retentionDays":3,"mode":"disk"}`)
	if w.Code != 200 {
		t.Fatalf("snapshot: %d %s", w.Code, w.Body)
	}
	sn := decodeBody[map[string]any](t, w)
	id, _ := sn["id"].(string)
	// What withruntime reads: id, state, mode, error, sourceSandboxId,
	// createdAt, labels, shape.
	if sn["state"] != "ready" || sn["mode"] != "disk" || sn["sourceSandboxId"] != "sbx_r" || sn["kind"] != "snapshot" ||
		sn["createdAt"] == nil || sn["error"] != nil || sn["shape"].(map[string]any)["diskMiB"] != 4096.0 {
		t.Errorf("snapshot answered %v", sn)
	}
	for _, body := range []string{`{"mode":"ram"}`, `{"retentionDays":0}`, `{"retentionDays":366}`, `{"name":"-x"}`, `{"nope":1}`} {
		if w := e.do("POST", "/v1/sandboxes/sbx_r:snapshot", body); w.Code != 400 {
			t.Errorf("snapshot %s: %d, want 400", body, w.Code)
		}
	}
	if w := e.do("GET", "/v1/snapshots/"+id, ""); w.Code != 200 {
		t.Errorf("get: %d %s", w.Code, w.Body)
	}
	list := decodeBody[map[string]any](t, e.do("GET", "/v1/snapshots?sandboxId=sbx_r", ""))
	if data, _ := list["data"].([]any); len(data) != 1 {
		t.Errorf("list: %v", list)
	}
	w = e.do("POST", "/v1/snapshots/"+id+":update", `{"name":null,"labels":{"c":"d"}}`)
	if got := decodeBody[map[string]any](t, w); w.Code != 200 || got["name"] != nil || got["labels"].(map[string]any)["c"] != "d" {
		t.Errorf("update: %d %v", w.Code, got)
	}
	if w := e.do("POST", "/v1/snapshots/"+id+":extend", `{"retentionDays":30}`); w.Code != 200 || decodeBody[map[string]any](t, w)["retentionDays"] != 30.0 {
		t.Errorf("extend: %d %s", w.Code, w.Body)
	}
	if w := e.do("POST", "/v1/snapshots/"+id+":extend", `{}`); w.Code != 400 {
		t.Errorf("extend without days: %d", w.Code)
	}
	// Another key sees nothing.
	r := e.do("GET", "/v1/snapshots/"+id, "", "Authorization", "Bearer secret-b")
	if r.Code != http.StatusNotFound || errorOf(t, r).Code != "snapshot_not_found" {
		t.Errorf("another key's get: %d %s", r.Code, r.Body)
	}
	if w := e.do("POST", "/v1/snapshots/"+id+":delete", `{}`); w.Code != 200 {
		t.Errorf("delete: %d %s", w.Code, w.Body)
	}
	if w := e.do("GET", "/v1/snapshots/"+id, ""); w.Code != 404 {
		t.Errorf("get after delete: %d", w.Code)
	}
	// A create from a snapshot passes its id on.
	if w := e.do("POST", "/v1/sandboxes", `{"snapshot":"snap_9"}`); w.Code != 200 || e.m.lastSpec.SnapshotID != "snap_9" {
		t.Errorf("create from a snapshot: %d %s, spec %+v", w.Code, w.Body, e.m.lastSpec)
	}
}

func TestForkRoute(t *testing.T) {
	e := newEnv(t)
	e.m.add("key_a", "sbx_r", sandbox.StateRunning, time.Hour)
	w := e.do("POST", "/v1/sandboxes/sbx_r:fork", `{"count":2,"name":"kid","labels":{"a":"b"},"keepSnapshot":true,"funding":"trial"}`)
	if w.Code != 200 {
		t.Fatalf("fork: %d %s", w.Code, w.Body)
	}
	got := decodeBody[struct {
		Sandboxes []map[string]any `json:"sandboxes"`
	}](t, w)
	if len(got.Sandboxes) != 2 || got.Sandboxes[0]["id"] == nil || got.Sandboxes[0]["state"] != "running" {
		t.Errorf("fork answered %+v", got)
	}
	if f := e.m.lastFork; f.Count != 2 || f.Name != "kid" || !f.KeepSnapshot || f.Labels["a"] != "b" {
		t.Errorf("fork spec %+v", f)
	}
	// Without count, one copy.
	if w := e.do("POST", "/v1/sandboxes/sbx_r:fork", `{}`); w.Code != 200 || e.m.lastFork.Count != 1 {
		t.Errorf("fork without count: %d, spec %+v", w.Code, e.m.lastFork)
	}
	for _, body := range []string{`{"count":0}`, `{"count":11}`, `{"name":"` + string(make([]byte, 0)) + `-bad"}`} {
		if w := e.do("POST", "/v1/sandboxes/sbx_r:fork", body); w.Code != 400 {
			t.Errorf("fork %s: %d, want 400", body, w.Code)
		}
	}
}

// TestCheckpointRoutes: the checkpoint routes' bodies, validation and
// answers, over the fake manager.
func TestCheckpointRoutes(t *testing.T) {
	e := newEnv(t)
	e.m.add("key_a", "sbx_r", sandbox.StateRunning, time.Hour)
	w := e.do("POST", "/v1/sandboxes/sbx_r/checkpoints", `{"label":"step-1"}`)
	if w.Code != 200 {
		t.Fatalf("checkpoint: %d %s", w.Code, w.Body)
	}
	cp := decodeBody[map[string]any](t, w)
	if cp["kind"] != "checkpoint" || cp["sandboxId"] != "sbx_r" || cp["label"] != "step-1" || cp["state"] != "ready" || cp["baseId"] != nil {
		t.Errorf("checkpoint answered %v", cp)
	}
	id, _ := cp["id"].(string)
	if w := e.do("POST", "/v1/sandboxes/sbx_r/checkpoints", `{"wait":false}`); w.Code != 202 || decodeBody[map[string]any](t, w)["state"] != "capturing" {
		t.Errorf("a checkpoint without wait: %d %s, want 202 capturing", w.Code, w.Body)
	}
	for _, body := range []string{`{"label":"a\u0001b"}`, `{"label":"` + strings.Repeat("x", 64) + `"}`, `{"wait":"no"}`, `{"other":1}`} {
		if w := e.do("POST", "/v1/sandboxes/sbx_r/checkpoints", body); w.Code != 400 {
			t.Errorf("checkpoint %s: %d, want 400", body, w.Code)
		}
	}
	list := decodeBody[struct {
		Checkpoints []map[string]any `json:"checkpoints"`
	}](t, e.do("GET", "/v1/sandboxes/sbx_r/checkpoints", ""))
	if len(list.Checkpoints) != 2 {
		t.Errorf("list: %+v", list)
	}
	if w := e.do("GET", "/v1/sandboxes/sbx_r/checkpoints/"+id, ""); w.Code != 200 {
		t.Errorf("get: %d %s", w.Code, w.Body)
	}
	if w := e.do("POST", "/v1/sandboxes/sbx_r/checkpoints/"+id+":restore", `{"keep":true}`); w.Code != 200 ||
		decodeBody[map[string]any](t, w)["id"] != "sbx_r" || e.m.lastRestore != id {
		t.Errorf("restore: %d %s", w.Code, w.Body)
	}
	w = e.do("POST", "/v1/sandboxes/sbx_r/checkpoints/"+id+":branch", `{"count":2,"name":"try"}`)
	if got := decodeBody[struct {
		Sandboxes []map[string]any `json:"sandboxes"`
	}](t, w); w.Code != 200 || len(got.Sandboxes) != 2 || e.m.lastFork.Name != "try" {
		t.Errorf("branch: %d %s", w.Code, w.Body)
	}
	for _, body := range []string{`{"count":0}`, `{"count":11}`} {
		if w := e.do("POST", "/v1/sandboxes/sbx_r/checkpoints/"+id+":branch", body); w.Code != 400 {
			t.Errorf("branch %s: %d, want 400", body, w.Code)
		}
	}
	if w := e.do("GET", "/v1/sandboxes/sbx_r/checkpoints/ckpt_nope", ""); w.Code != 404 || !strings.Contains(w.Body.String(), "checkpoint_not_found") {
		t.Errorf("an unknown checkpoint: %d %s", w.Code, w.Body)
	}
	if w := e.do("DELETE", "/v1/sandboxes/sbx_r/checkpoints/"+id, ""); w.Code != 200 {
		t.Errorf("delete: %d %s", w.Code, w.Body)
	}
	if w := e.do("GET", "/v1/sandboxes/sbx_other/checkpoints", ""); w.Code != 404 {
		t.Errorf("another sandbox's list: %d, want 404", w.Code)
	}
}
