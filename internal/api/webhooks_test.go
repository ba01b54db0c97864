package api

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"

	"github.com/emberbox/emberbox/internal/store"
	"github.com/emberbox/emberbox/internal/webhook"
)

// newWebhookEnv is newEnv with webhooks on a real SQLite store.
func newWebhookEnv(t *testing.T) (*testEnv, *store.Store) {
	t.Helper()
	st, err := store.Open(t.Context(), filepath.Join(t.TempDir(), "emberbox.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	m, idem := newFakeManager(), newFakeIdem()
	s := newServer(Config{Manager: rolesOf(m), Keys: fakeKeys{}, Idempotency: idem, Version: "test",
		Webhooks: webhook.New(webhook.Config{Records: st, Outbox: st})})
	return &testEnv{t: t, m: m, idem: idem, s: s}, st
}

// TestWebhookRoutes: the routes withruntime's runtime.webhooks and
// runtime.events call, their shapes, and their refusals in the one
// error shape.
func TestWebhookRoutes(t *testing.T) {
	e, st := newWebhookEnv(t)
	var got []string
	rc := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got = append(got, r.Header.Get("Runtime-Signature"))
		w.WriteHeader(http.StatusOK)
	}))
	defer rc.Close()

	w := e.do("POST", "/v1/webhooks", `{"url":"`+rc.URL+`","events":["sandbox.*"],"description":"ci"}`)
	var hook map[string]any
	if w.Code != http.StatusOK || json.Unmarshal(w.Body.Bytes(), &hook) != nil {
		t.Fatalf("create: %d %s", w.Code, w.Body)
	}
	id, secret := hook["id"].(string), hook["secret"]
	if !strings.HasPrefix(id, "wh_") || secret == nil || hook["enabled"] != true {
		t.Fatalf("create answered %v", hook)
	}
	w = e.do("GET", "/v1/webhooks/"+id, "")
	if w.Code != http.StatusOK || strings.Contains(w.Body.String(), `"secret"`) {
		t.Errorf("get shows the secret or fails: %d %s", w.Code, w.Body)
	}
	if w := e.do("GET", "/v1/webhooks/"+id, "", "Authorization", "Bearer secret-b"); w.Code != http.StatusNotFound || errorOf(t, w).Code != "webhook_not_found" {
		t.Errorf("another key's get: %d %s", w.Code, w.Body)
	}
	w = e.do("GET", "/v1/webhooks", "")
	if w.Code != http.StatusOK || !strings.Contains(w.Body.String(), id) || strings.Contains(w.Body.String(), `"secret"`) {
		t.Errorf("list: %d %s", w.Code, w.Body)
	}
	w = e.do("POST", "/v1/webhooks/"+id+":update", `{"enabled":false,"events":["sandbox.stopped"]}`)
	if w.Code != http.StatusOK || !strings.Contains(w.Body.String(), `"enabled":false`) || !strings.Contains(w.Body.String(), `["sandbox.stopped"]`) {
		t.Errorf("update: %d %s", w.Code, w.Body)
	}
	w = e.do("POST", "/v1/webhooks/"+id+":rotate-secret", `{"keepPreviousSeconds":60}`)
	if w.Code != http.StatusOK || !strings.Contains(w.Body.String(), `"secret":"whsec_`) || strings.Contains(w.Body.String(), `"previousSecretExpiresAt":null`) {
		t.Errorf("rotate: %d %s", w.Code, w.Body)
	}
	w = e.do("POST", "/v1/webhooks/"+id+":test", `{}`)
	var d map[string]any
	if w.Code != http.StatusOK || json.Unmarshal(w.Body.Bytes(), &d) != nil || d["state"] != "delivered" || d["lastStatus"] != 200.0 {
		t.Fatalf("test: %d %s", w.Code, w.Body)
	}
	if len(got) != 1 || strings.Count(got[0], "v1=") != 2 {
		t.Errorf("the test's signature during a rotation: %q, want two v1", got)
	}
	w = e.do("GET", "/v1/webhooks/"+id+"/deliveries?state=delivered&limit=10", "")
	if w.Code != http.StatusOK || !strings.Contains(w.Body.String(), d["id"].(string)) {
		t.Errorf("deliveries: %d %s", w.Code, w.Body)
	}
	w = e.do("POST", "/v1/webhook-deliveries/"+d["id"].(string)+":retry", `{}`)
	if w.Code != http.StatusOK || !strings.Contains(w.Body.String(), `"attempts":2`) {
		t.Errorf("retry: %d %s", w.Code, w.Body)
	}

	if err := st.PublishEvent(t.Context(), &webhook.Event{Owner: "key_a", Type: webhook.SandboxStopped, ResourceType: "sandbox",
		ResourceID: "sbx_1", Data: map[string]any{"reason": "user"}}); err != nil {
		t.Fatal(err)
	}
	w = e.do("GET", "/v1/events?type=sandbox.*&resourceId=sbx_1", "")
	if w.Code != http.StatusOK || !strings.Contains(w.Body.String(), `"type":"sandbox.stopped"`) || !strings.Contains(w.Body.String(), `"reason":"user"`) {
		t.Errorf("events: %d %s", w.Code, w.Body)
	}
	if w := e.do("GET", "/v1/events", "", "Authorization", "Bearer secret-b"); w.Code != http.StatusOK || strings.Contains(w.Body.String(), "sbx_1") {
		t.Errorf("another key's events: %d %s", w.Code, w.Body)
	}

	for _, tc := range []struct{ method, path, body, code string }{
		{"POST", "/v1/webhooks", `{"url":"ftp://x"}`, "invalid_webhook_url"},
		{"POST", "/v1/webhooks", `{"url":"https://example.com","events":["sandbox.nope"]}`, "invalid_events"},
		{"POST", "/v1/webhooks", `{"url":"https://example.com","extra":1}`, "invalid_request"},
		{"POST", "/v1/webhooks/" + id + ":rotate-secret", `{"keepPreviousSeconds":604801}`, "invalid_request"},
		{"GET", "/v1/webhooks/" + id + "/deliveries?state=lost", "", "invalid_state"},
		{"GET", "/v1/webhooks/" + id + "/deliveries?cursor=x", "", "invalid_request"},
		{"GET", "/v1/events?type=nothing", "", "invalid_events"},
		{"POST", "/v1/webhook-deliveries/whd_none:retry", `{}`, "delivery_not_found"},
	} {
		w := e.do(tc.method, tc.path, tc.body)
		if got := errorOf(t, w); got.Code != tc.code || w.Code/100 != 4 {
			t.Errorf("%s %s %s: %d %s, want %s", tc.method, tc.path, tc.body, w.Code, w.Body, tc.code)
		}
	}
	if w := e.do("POST", "/v1/webhooks/"+id+":delete", `{}`); w.Code != http.StatusOK {
		t.Errorf("delete: %d %s", w.Code, w.Body)
	}
	if w := e.do("GET", "/v1/webhooks/"+id, ""); w.Code != http.StatusNotFound {
		t.Errorf("get after delete: %d %s", w.Code, w.Body)
	}
}
