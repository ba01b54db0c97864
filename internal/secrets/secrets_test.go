package secrets_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/emberbox/emberbox/internal/errdefs"
	"github.com/emberbox/emberbox/internal/secrets"
	"github.com/emberbox/emberbox/internal/store"
)

func newService(t *testing.T) (*secrets.Service, *store.Store, string) {
	t.Helper()
	dir := t.TempDir()
	st, err := store.Open(t.Context(), filepath.Join(dir, "emberbox.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	key, err := secrets.LoadOrCreateKey(filepath.Join(dir, "secrets.key"))
	if err != nil {
		t.Fatal(err)
	}
	again, err := secrets.LoadOrCreateKey(filepath.Join(dir, "secrets.key"))
	if err != nil || string(again) != string(key) {
		t.Fatalf("the key read back differs: %v", err)
	}
	sealer, err := secrets.NewSealer(key)
	if err != nil {
		t.Fatal(err)
	}
	return secrets.New(secrets.Config{Store: st, Sealer: sealer}), st, filepath.Join(dir, "emberbox.db")
}

const value = "sk-live-0123456789abcdef"

// TestSwap: the value goes only into a credential header of a request to
// the secret's hosts that its rules allow, for a sandbox in its scope;
// after delete, nowhere.
func TestSwap(t *testing.T) {
	svc, _, _ := newService(t)
	ctx := t.Context()
	sc, err := svc.Set(ctx, "k", "API_TOKEN", secrets.Spec{Value: value, Hosts: []string{"api.example.com", "*.models.example"},
		Rules: []secrets.Rule{{Methods: []string{"GET", "POST"}, Paths: []string{"/v1/*", "/health"}}},
		Only:  &secrets.Scope{Labels: []map[string]string{{"team": "ml"}}}})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(sc.Placeholder, "emberbox-secret-") || strings.Contains(sc.Sealed, value) {
		t.Fatalf("placeholder %q, sealed %q", sc.Placeholder, sc.Sealed)
	}
	labels := map[string]string{"team": "ml"}
	var mu sync.Mutex
	var uses []secrets.Use
	sw := svc.Swapper("sbx_1", func(context.Context, string) (string, map[string]string, error) { return "k", labels, nil },
		func(u secrets.Use) { mu.Lock(); uses = append(uses, u); mu.Unlock() })
	if got := svc.Env("k", "sbx_1", labels); got["API_TOKEN"] != sc.Placeholder || len(got) != 1 {
		t.Errorf("env: %v", got)
	}
	if got := svc.Env("k", "sbx_2", nil); len(got) != 0 {
		t.Errorf("env of a sandbox out of scope: %v", got)
	}
	if p, ok := svc.Placeholder("k", "API_TOKEN", "sbx_1", labels); !ok || p != sc.Placeholder {
		t.Errorf("placeholder: %q, %v", p, ok)
	}
	for _, c := range []struct {
		owner, name string
		labels      map[string]string
	}{{"k", "API_TOKEN", nil}, {"k", "OTHER", labels}, {"j", "API_TOKEN", labels}} {
		if p, ok := svc.Placeholder(c.owner, c.name, "sbx_2", c.labels); ok || p != "" {
			t.Errorf("placeholder of %+v: %q, %v", c, p, ok)
		}
	}
	if !sw.Intercepts("api.example.com", 443) || !sw.Intercepts("eu.models.example", 8443) || sw.Intercepts("models.example", 443) || sw.Intercepts("other.example", 443) {
		t.Error("Intercepts: wrong hosts")
	}
	swap := func(host, method, target string, hdr ...string) *http.Request {
		r := httptest.NewRequest(method, target, strings.NewReader("body "+sc.Placeholder))
		for i := 0; i+1 < len(hdr); i += 2 {
			r.Header.Add(hdr[i], hdr[i+1])
		}
		sw.Swap(host, r)
		return r
	}
	r := swap("api.example.com", "POST", "https://api.example.com/v1/chat?k="+sc.Placeholder,
		"Authorization", "Bearer "+sc.Placeholder, "X-Other", sc.Placeholder, "x-api-key", sc.Placeholder)
	if r.Header.Get("Authorization") != "Bearer "+value || r.Header.Get("X-Api-Key") != value {
		t.Errorf("credential headers: %v", r.Header)
	}
	if r.Header.Get("X-Other") != sc.Placeholder || !strings.Contains(r.URL.RawQuery, sc.Placeholder) {
		t.Errorf("the placeholder was replaced outside a credential header: %v %s", r.Header, r.URL)
	}
	for _, tc := range []struct{ host, method, target string }{
		{"api.example.com", "DELETE", "https://api.example.com/v1/x"},       // a method the rules do not name
		{"api.example.com", "GET", "https://api.example.com/v2/x"},          // a path outside them
		{"api.example.com", "GET", "https://api.example.com/v1/../admin"},   // not canonical
		{"api.example.com", "GET", "https://api.example.com/v1/a%2F..%2Fb"}, // an encoded slash
		{"other.example", "GET", "https://other.example/v1/x"},              // another host
	} {
		if r := swap(tc.host, tc.method, tc.target, "Authorization", "Bearer "+sc.Placeholder); r.Header.Get("Authorization") != "Bearer "+sc.Placeholder {
			t.Errorf("%s %s %s: the value went out", tc.host, tc.method, tc.target)
		}
	}
	mu.Lock()
	for _, u := range uses {
		if u.Name != "API_TOKEN" {
			t.Errorf("use of %q", u.Name)
		}
	}
	if len(uses) < 5 || !uses[0].Used || uses[1].Used || uses[1].Reason != "rules" {
		t.Errorf("uses: %+v", uses)
	}
	mu.Unlock()

	if _, err := svc.Delete(ctx, "k", "API_TOKEN"); err != nil {
		t.Fatal(err)
	}
	if r := swap("api.example.com", "GET", "https://api.example.com/v1/x", "Authorization", "Bearer "+sc.Placeholder); r.Header.Get("Authorization") != "Bearer "+sc.Placeholder {
		t.Error("the value went out after delete")
	}
	if sw.Intercepts("api.example.com", 443) {
		t.Error("a deleted secret's host is still intercepted")
	}
}

// TestSetReplaceNarrowScope: a replace keeps the placeholder and the
// scope; narrowing refuses anything wider; a header secret is set on
// every allowed request; bad input is refused with its code.
func TestSetReplaceNarrowScope(t *testing.T) {
	svc, st, _ := newService(t)
	ctx := t.Context()
	first, err := svc.Set(ctx, "k", "GH", secrets.Spec{Value: value, Hosts: []string{"api.github.com", "*.github.com"},
		Only: &secrets.Scope{Sandboxes: []string{"sbx_1"}}})
	if err != nil {
		t.Fatal(err)
	}
	second, err := svc.Set(ctx, "k", "GH", secrets.Spec{Value: "other-value", Hosts: []string{"api.github.com"}, Header: "X-Token", Format: "token {value}"})
	if err != nil || second.Placeholder != first.Placeholder || second.Only == nil || second.Only.Sandboxes[0] != "sbx_1" {
		t.Fatalf("replace: %+v, %v", second, err)
	}
	sw := svc.Swapper("sbx_1", func(context.Context, string) (string, map[string]string, error) { return "k", nil, nil }, nil)
	r := httptest.NewRequest("GET", "https://api.github.com/user", nil)
	sw.Swap("api.github.com", r)
	if r.Header.Get("X-Token") != "token other-value" {
		t.Errorf("header secret: %v", r.Header)
	}
	if _, err := svc.Narrow(ctx, "k", "GH", []string{"*.github.com"}, nil); errdefs.Code(err) != "not_narrower" {
		t.Errorf("widening hosts: %v", err)
	}
	if _, err := svc.Narrow(ctx, "k", "GH", nil, []secrets.Rule{{Paths: []string{"/repos/*"}}}); err != nil {
		t.Errorf("narrowing no rules to some: %v", err)
	}
	if _, err := svc.Narrow(ctx, "k", "GH", nil, []secrets.Rule{{Paths: []string{"/*"}}}); errdefs.Code(err) != "not_narrower" {
		t.Errorf("widening rules: %v", err)
	}
	if _, err := svc.Narrow(ctx, "k", "GH", nil, []secrets.Rule{{Methods: []string{"GET"}, Paths: []string{"/repos/acme/*"}}}); err != nil {
		t.Errorf("narrowing rules: %v", err)
	}
	if sc, err := svc.SetScope(ctx, "k", "GH", secrets.Scope{}); err != nil || sc.Only != nil {
		t.Errorf("scope to every sandbox: %+v, %v", sc, err)
	}
	for _, tc := range []struct {
		name string
		sp   secrets.Spec
		code string
	}{
		{"1BAD", secrets.Spec{Value: value, Hosts: []string{"a.example"}}, "invalid_secret_name"},
		{"OK", secrets.Spec{Value: "a\nb", Hosts: []string{"a.example"}}, "invalid_secret_value"},
		{"OK", secrets.Spec{Value: strings.Repeat("x", 8193), Hosts: []string{"a.example"}}, "invalid_secret_value"},
		{"OK", secrets.Spec{Value: value}, "invalid_hosts"},
		{"OK", secrets.Spec{Value: value, Hosts: []string{"A.example"}}, "invalid_hosts"},
		{"OK", secrets.Spec{Value: value, Hosts: []string{"a.example/x"}}, "invalid_hosts"},
		{"OK", secrets.Spec{Value: value, Hosts: []string{"a.example"}, Rules: []secrets.Rule{{Paths: []string{"/a/../b"}}}}, "invalid_rules"},
		{"OK", secrets.Spec{Value: value, Hosts: []string{"a.example"}, Rules: []secrets.Rule{{Paths: []string{"/a*b"}}}}, "invalid_rules"},
		{"OK", secrets.Spec{Value: value, Hosts: []string{"a.example"}, Header: "Bad Header"}, "invalid_header"},
		{"OK", secrets.Spec{Value: value, Hosts: []string{"a.example"}, Header: "X-K", Format: "no value"}, "invalid_header"},
	} {
		if _, err := svc.Set(ctx, "k", tc.name, tc.sp); errdefs.Code(err) != tc.code {
			t.Errorf("Set(%s, %+v): %v, want %s", tc.name, tc.sp.Hosts, err, tc.code)
		}
	}
	env := "GH"
	if _, err := svc.Set(ctx, "k", "GH2", secrets.Spec{Value: value, Hosts: []string{"a.example"}, Env: &env}); errdefs.Code(err) != "env_taken" {
		t.Errorf("a second secret in the same variable: %v", err)
	}
	// No column holds the value in clear.
	list, err := st.ListSecrets(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	for _, sc := range list {
		if strings.Contains(sc.Sealed, "other-value") || strings.Contains(sc.Sealed, value) {
			t.Errorf("%s is stored in clear", sc.Name)
		}
	}
}

// TestSealedElsewhere: a value sealed by another key, or moved onto
// another secret's row, does not open.
func TestSealedElsewhere(t *testing.T) {
	a, _ := secrets.NewSealer(make([]byte, 32))
	k := make([]byte, 32)
	k[0] = 1
	b, _ := secrets.NewSealer(k)
	sealed := a.Seal("k", "A", value)
	if v, err := a.Open("k", "A", sealed); err != nil || v != value {
		t.Fatalf("Open: %q, %v", v, err)
	}
	if _, err := b.Open("k", "A", sealed); err == nil {
		t.Error("opened with another key")
	}
	if _, err := a.Open("k", "B", sealed); err == nil {
		t.Error("opened as another secret")
	}
	if _, err := a.Open("other", "A", sealed); err == nil {
		t.Error("opened as another key's secret")
	}
}

// TestBudget: a sandbox's requests that carry a secret with an api policy
// are answered 429 past the hour's calls, and writes past its writes,
// before anything is sent; requests that do not carry it are not counted.
func TestBudget(t *testing.T) {
	svc, _, _ := newService(t)
	ctx := t.Context()
	none := 0
	sc, err := svc.Set(ctx, "k", "API_TOKEN", secrets.Spec{Value: value, Hosts: []string{"api.example.com"},
		API: &secrets.APIPolicy{CallsPerHour: 3, WritesPerHour: &none}})
	if err != nil {
		t.Fatal(err)
	}
	sw := svc.Swapper("sbx_1", func(context.Context, string) (string, map[string]string, error) { return "k", nil, nil }, nil)
	try := func(method string, carry bool) (refused bool, sent string) {
		r := httptest.NewRequest(method, "https://api.example.com/v1/x", nil)
		if carry {
			r.Header.Set("Authorization", "Bearer "+sc.Placeholder)
		}
		if a := sw.Refuse("api.example.com", r); a != nil {
			if a.RetryAfter <= 0 || a.RetryAfter > time.Hour || a.Status != 0 {
				t.Errorf("answer %+v", a)
			}
			return true, ""
		}
		sw.Swap("api.example.com", r)
		return false, r.Header.Get("Authorization")
	}
	if refused, _ := try("POST", true); !refused {
		t.Error("a write with no writes allowed was not refused")
	}
	for i := range 3 {
		if refused, sent := try("GET", true); refused || sent != "Bearer "+value {
			t.Fatalf("call %d of 3: refused %v, sent %q", i+1, refused, sent)
		}
	}
	if refused, _ := try("GET", false); refused {
		t.Error("a request without the secret was refused")
	}
	if refused, _ := try("GET", true); !refused {
		t.Error("the fourth call of the hour was not refused")
	}
	// Another sandbox has its own hour.
	other := svc.Swapper("sbx_2", func(context.Context, string) (string, map[string]string, error) { return "k", nil, nil }, nil)
	r := httptest.NewRequest("GET", "https://api.example.com/v1/x", nil)
	r.Header.Set("Authorization", "Bearer "+sc.Placeholder)
	if a := other.Refuse("api.example.com", r); a != nil {
		t.Errorf("another sandbox refused: %+v", a)
	}
}
