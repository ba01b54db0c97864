package api

import (
	"encoding/json"
	"net/http"
	"path/filepath"
	"strings"
	"testing"

	"github.com/emberbox/emberbox/internal/secrets"
	"github.com/emberbox/emberbox/internal/store"
)

// TestEgressSecretRoutes: the routes withruntime's runtime.secrets calls
// for sandboxes' secrets, their shapes (never the value), and their
// refusals.
func TestEgressSecretRoutes(t *testing.T) {
	st, err := store.Open(t.Context(), filepath.Join(t.TempDir(), "emberbox.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	sealer, _ := secrets.NewSealer(make([]byte, 32))
	m, idem := newFakeManager(), newFakeIdem()
	e := &testEnv{t: t, m: m, idem: idem, s: newServer(Config{Manager: rolesOf(m), Keys: fakeKeys{}, Idempotency: idem,
		Version: "test", Secrets: secrets.New(secrets.Config{Store: st, Sealer: sealer})})}
	const value = "sk-test-secret-value-0001"

	w := e.do("PUT", "/v1/egress-secrets/API_TOKEN", `{"value":"`+value+`","hosts":["api.example.com"],"rules":[{"methods":["GET"],"paths":["/v1/*"]}],"only":{"labels":[{"team":"ml"}]}}`)
	var sc map[string]any
	if w.Code != http.StatusOK || json.Unmarshal(w.Body.Bytes(), &sc) != nil || !strings.HasPrefix(sc["placeholder"].(string), "emberbox-secret-") {
		t.Fatalf("set: %d %s", w.Code, w.Body)
	}
	w = e.do("GET", "/v1/egress-secrets", "")
	if w.Code != http.StatusOK || !strings.Contains(w.Body.String(), `"secrets":[{"name":"API_TOKEN"`) {
		t.Errorf("list: %d %s", w.Code, w.Body)
	}
	if w := e.do("GET", "/v1/egress-secrets", "", "Authorization", "Bearer secret-b"); strings.Contains(w.Body.String(), "API_TOKEN") {
		t.Errorf("another key's list: %s", w.Body)
	}
	w = e.do("PUT", "/v1/egress-secrets/API_TOKEN/sandboxes", `{}`)
	if w.Code != http.StatusOK || strings.Contains(w.Body.String(), `"only"`) {
		t.Errorf("scope to every sandbox: %d %s", w.Code, w.Body)
	}
	w = e.do("PUT", "/v1/egress-secrets/API_TOKEN/rules", `{"rules":[{"methods":["GET"],"paths":["/v1/models"]}]}`)
	if w.Code != http.StatusOK || !strings.Contains(w.Body.String(), `"/v1/models"`) {
		t.Errorf("narrow: %d %s", w.Code, w.Body)
	}
	for _, tc := range []struct{ method, path, body, code string }{
		{"PUT", "/v1/egress-secrets/API_TOKEN/rules", `{"rules":[{"paths":["/*"]}]}`, "not_narrower"},
		{"PUT", "/v1/egress-secrets/9X", `{"value":"v","hosts":["a.example"]}`, "invalid_secret_name"},
		{"PUT", "/v1/egress-secrets/X", `{"value":"v"}`, "invalid_hosts"},
		{"PUT", "/v1/egress-secrets/X", `{"value":"v","hosts":["a.example"],"githubApp":{"id":1,"installation":2}}`, "github_app_unavailable"},
		{"PUT", "/v1/egress-secrets/X", `{"value":"v","hosts":["a.example"],"api":{"callsPerHour":5,"copies":true}}`, "api_policy_unavailable"},
		{"PUT", "/v1/egress-secrets/X", `{"value":"v","hosts":["a.example"],"api":{"writesPerHour":-1}}`, "invalid_api_policy"},
		{"PUT", "/v1/egress-secrets/X", `{"value":"v","hosts":["a.example"],"only":{"apps":["app_1"]}}`, "apps_unavailable"},
		{"DELETE", "/v1/egress-secrets/NONE", ``, "secret_not_found"},
	} {
		w := e.do(tc.method, tc.path, tc.body)
		if got := errorOf(t, w); got.Code != tc.code {
			t.Errorf("%s %s %s: %d %s, want %s", tc.method, tc.path, tc.body, w.Code, w.Body, tc.code)
		}
	}
	w = e.do("PUT", "/v1/egress-secrets/BUDGET", `{"value":"v","hosts":["a.example"],"api":{"callsPerHour":5,"writesPerHour":0}}`)
	if w.Code != http.StatusOK || !strings.Contains(w.Body.String(), `"api":{"callsPerHour":5,"writesPerHour":0}`) {
		t.Errorf("set with an api policy: %d %s", w.Code, w.Body)
	}
	w = e.do("DELETE", "/v1/egress-secrets/API_TOKEN", "")
	if w.Code != http.StatusOK || !strings.Contains(w.Body.String(), `"deleted":true`) {
		t.Errorf("delete: %d %s", w.Code, w.Body)
	}
	if strings.Contains(w.Body.String(), value) {
		t.Error("an answer holds the value")
	}
}
