package api

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/emberbox/emberbox/internal/guest"
	"github.com/emberbox/emberbox/internal/sandbox"
)

func TestWatchRoutes(t *testing.T) {
	e := newEnv(t)
	e.m.add("key_a", "sbx_r", sandbox.StateRunning, time.Hour)
	w := e.do("POST", "/v1/sandboxes/sbx_r/files/watches", `{"path":"/workspace","recursive":true,"events":["create","write","remove"],"timeoutMs":60000}`)
	if w.Code != 200 {
		t.Fatalf("start: %d %s", w.Code, w.Body)
	}
	got := decodeBody[map[string]any](t, w)
	e.m.mu.Lock()
	req := e.m.watch.req
	e.m.mu.Unlock()
	if got["id"] != "wat_1" || !req.Recursive || strings.Join(req.Events, ",") != "create,modify,delete" || *req.TimeoutMs != 60000 {
		t.Fatalf("start answered %v; the guest got %+v", got, req)
	}
	for _, body := range []string{`{}`, `{"path":"/w","events":["explode"]}`, `{"path":"/w","timeoutMs":-1}`, `{"path":"/w","maxWatches":0}`} {
		if w := e.do("POST", "/v1/sandboxes/sbx_r/files/watches", body); w.Code != 400 {
			t.Errorf("%s: %d", body, w.Code)
		}
	}
	if w := e.do("POST", "/v1/sandboxes/sbx_r/files/watches", `{"path":"/w","webhook":true}`); w.Code != 501 {
		t.Errorf("webhook: %d", w.Code)
	}
	if w := e.do("GET", "/v1/sandboxes/sbx_r/files/watches", ""); w.Code != 200 || len(decodeBody[dataJSON[watchJSON]](t, w).Data) != 1 {
		t.Fatalf("list: %d %s", w.Code, w.Body)
	}
	at := time.Now().UTC()
	e.m.mu.Lock()
	e.m.watch.events = []guest.WatchEvent{{Type: "create", Path: "/workspace/a", At: at}, {Type: "modify", Path: "/workspace/a", At: at}}
	e.m.mu.Unlock()
	w = e.do("GET", "/v1/sandboxes/sbx_r/files/watches/wat_1/events?cursor=1&waitMs=0", "")
	batch := decodeBody[watchBatchJSON](t, w)
	if w.Code != 200 || batch.NextCursor != 2 || len(batch.Events) != 1 || batch.Events[0].Type != "modify" {
		t.Fatalf("events: %d %s", w.Code, w.Body)
	}
	if w := e.do("GET", "/v1/sandboxes/sbx_r/files/watches/wat_9/events", ""); w.Code != 404 {
		t.Fatalf("no such watch: %d", w.Code)
	}
	// Once stopped, a follow streams what is left and ends.
	if w := e.do("DELETE", "/v1/sandboxes/sbx_r/files/watches/wat_1", ""); w.Code != 200 || !decodeBody[map[string]any](t, w)["stopped"].(bool) {
		t.Fatalf("stop: %d %s", w.Code, w.Body)
	}
	w = e.do("GET", "/v1/sandboxes/sbx_r/files/watches/wat_1/events?cursor=0&follow=true", "")
	if w.Code != 200 || w.Header().Get("Content-Type") != "application/x-ndjson" {
		t.Fatalf("follow: %d %s", w.Code, w.Body)
	}
	var kinds []string
	for _, l := range strings.Split(strings.TrimSpace(w.Body.String()), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("line %q: %v", l, err)
		}
		kinds = append(kinds, m["k"].(string))
		if m["k"] == "events" && (len(m["events"].([]any)) != 2 || m["cursor"] != float64(2)) {
			t.Errorf("events line: %s", l)
		}
		if m["k"] == "end" && m["reason"] != "stopped" {
			t.Errorf("end line: %s", l)
		}
	}
	if strings.Join(kinds, ",") != "events,end" {
		t.Fatalf("follow lines: %v", kinds)
	}
}
