package e2b_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/emberbox/emberbox/internal/api"
	"github.com/emberbox/emberbox/internal/sandbox"
)

// createFor makes a running sandbox with secret and returns its id and
// envd token.
func (f *fixture) createFor(secret string) (id, token string) {
	f.t.Helper()
	st, b, _ := f.do("POST", "/v2/sandboxes", secret, map[string]any{"templateID": "base", "timeout": 600}, nil)
	var c struct{ SandboxID, EnvdAccessToken string }
	if st != 201 || json.Unmarshal(b, &c) != nil || c.EnvdAccessToken == "" {
		f.t.Fatalf("create: %d %s", st, b)
	}
	return c.SandboxID, c.EnvdAccessToken
}

// connect answers a fresh envd token for id to the caller of secret.
func (f *fixture) connect(secret, id string) string {
	f.t.Helper()
	st, b, _ := f.do("POST", "/v2/sandboxes/"+id+"/connect", secret, map[string]int{"timeout": 600}, nil)
	var c struct{ EnvdAccessToken string }
	if st/100 != 2 || json.Unmarshal(b, &c) != nil || c.EnvdAccessToken == "" {
		f.t.Fatalf("connect: %d %s", st, b)
	}
	return c.EnvdAccessToken
}

// envd sends an envd request with token and returns its status.
func (f *fixture) envd(id, token string) (int, []byte) {
	f.t.Helper()
	st, b, _ := f.do("GET", "/health", "", nil, map[string]string{"E2b-Sandbox-Id": id, "X-Access-Token": token})
	if st == 200 {
		<-f.routed
	}
	return st, b
}

// A token lives as long as the secret it was issued to: a rotation's
// grace keeps it, the end of the grace (here a second rotation, which
// drops the first secret at once) ends it, and a revocation ends every
// token of the key at once.
func TestTokensEndWithTheirKey(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	id, first := f.createFor("secret-a")
	if st, b := f.envd(id, first); st != 200 {
		t.Fatalf("a fresh token: %d %s", st, b)
	}

	_, second, err := f.st.RotateKey(ctx, "key_a", 3600e9)
	if err != nil {
		t.Fatal(err)
	}
	if st, b := f.envd(id, first); st != 200 {
		t.Errorf("the old secret's token in the rotation's grace: %d %s", st, b)
	}
	fromSecond := f.connect(second, id)
	if fromSecond == first {
		t.Fatal("the new secret's connect answered the old secret's token")
	}
	if st, b := f.envd(id, fromSecond); st != 200 {
		t.Errorf("the new secret's token: %d %s", st, b)
	}

	_, third, err := f.st.RotateKey(ctx, "key_a", 0)
	if err != nil {
		t.Fatal(err)
	}
	for name, tok := range map[string]string{"first": first, "second": fromSecond} {
		st, b := f.envd(id, tok)
		wantError(t, "the "+name+" secret's token after its grace", st, b, 401)
		if !strings.Contains(string(b), "no longer valid") {
			t.Errorf("the %s secret's token: %s, want it to say the token ended", name, b)
		}
	}
	fromThird := f.connect(third, id)
	if st, b := f.envd(id, fromThird); st != 200 {
		t.Errorf("the current secret's token: %d %s", st, b)
	}
	// A token of key_b's is untouched by key_a's changes.
	idB, tokB := f.createFor("secret-b")

	if _, err := f.st.RevokeKey(ctx, "key_a"); err != nil {
		t.Fatal(err)
	}
	st, b := f.envd(id, fromThird)
	wantError(t, "a revoked key's token", st, b, 401)
	st, b, _ = f.do("GET", "/hello", "", nil, map[string]string{"E2b-Sandbox-Id": id, "E2b-Sandbox-Port": "8080", "X-Access-Token": fromThird})
	wantError(t, "a revoked key's token on another port", st, b, 401)
	st, b, _ = f.do("POST", "/v2/sandboxes/"+id+"/connect", third, map[string]int{"timeout": 600}, nil)
	wantError(t, "a revoked key's connect", st, b, 401)
	if st, b := f.envd(idB, tokB); st != 200 {
		t.Errorf("another key's token: %d %s", st, b)
	}
}

// E2B's front counts against the API's buckets: failed tokens and keys
// from an address end in 429 on both fronts, and a key's requests through
// E2B's protocol and the Runtime API share one bucket.
func TestRateLimitsSharedWithTheAPI(t *testing.T) {
	limiter := api.NewRateLimiter(api.RateLimits{
		Read:     api.Rate{PerSecond: 0.001, Burst: 3},
		AuthFail: api.Rate{PerSecond: 0.001, Burst: 2},
	})
	runtime := func(mgr *sandbox.Manager, k api.Keys) http.Handler {
		return api.New(api.Config{Manager: api.Manager{Sandboxes: mgr, Power: mgr, Switcher: mgr.Switcher, Snapshots: mgr.Snapshots,
			Usage: mgr.Meter, Guests: mgr, Network: mgr.Networks}, Keys: k, Limiter: limiter})
	}
	f := newLimitedFixture(t, limiter, runtime)
	id, tok := f.createFor("secret-a") // a write: the read bucket stays full

	// Three reads of key_a's: two through envd, one through the API.
	for i := range 2 {
		if st, b := f.envd(id, tok); st != 200 {
			t.Fatalf("envd read %d: %d %s", i, st, b)
		}
	}
	if st, b, _ := f.do("GET", "/v1/sandboxes", "", nil, map[string]string{"Authorization": "Bearer secret-a"}); st != 200 {
		t.Fatalf("the API's read: %d %s", st, b)
	}
	st, b, hdr := f.do("GET", "/health", "", nil, map[string]string{"E2b-Sandbox-Id": id, "X-Access-Token": tok})
	wantError(t, "a fourth read through envd", st, b, 429)
	if hdr.Get("Retry-After") == "" {
		t.Error("429 without Retry-After")
	}
	st, b, _ = f.do("GET", "/v2/sandboxes", "secret-a", nil, nil)
	wantError(t, "a fourth read through E2B's control plane", st, b, 429)
	if st, b, _ := f.do("GET", "/v2/sandboxes", "secret-b", nil, nil); st != 200 {
		t.Errorf("another key's read: %d %s", st, b)
	}

	// Two failures from this address (a forged token, a wrong key), then
	// even a good credential is refused before it is looked at, on both
	// fronts.
	forged := "e2b2." + base64.RawURLEncoding.EncodeToString([]byte("key_b")) + ".AAAAAAAAAAAAAAAAAAAAAA.AAAA"
	st, b, _ = f.do("GET", "/health", "", nil, map[string]string{"E2b-Sandbox-Id": id, "X-Access-Token": forged})
	wantError(t, "a forged token", st, b, 401)
	st, b, _ = f.do("GET", "/v2/sandboxes", "wrong", nil, nil)
	wantError(t, "a wrong key", st, b, 401)
	st, b, _ = f.do("GET", "/v2/sandboxes", "secret-b", nil, nil)
	wantError(t, "a good key from a failing address", st, b, 429)
	st, b, _ = f.do("POST", "/process.Process/List", "", nil, map[string]string{"E2b-Sandbox-Id": id, "X-Access-Token": tok})
	wantError(t, "a good token from a failing address", st, b, 429)
	if st, b, _ := f.do("GET", "/v1/sandboxes", "", nil, map[string]string{"Authorization": "Bearer secret-b"}); st != 429 {
		t.Errorf("the API from a failing address: %d %s, want 429", st, b)
	}
}

// A request proxied to a guest's port carries none of our credentials,
// whoever they belong to; the guest's own headers, cookies and
// subprotocols pass.
func TestPortProxyStripsCredentials(t *testing.T) {
	f := newFixture(t)
	id, tok := f.createFor("secret-a")
	var mu sync.Mutex
	var seen *http.Request
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	app := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = r
		mu.Unlock()
		w.WriteHeader(204)
	})}
	go app.Serve(ln)
	t.Cleanup(func() { app.Close() })
	port := fmt.Sprint(ln.Addr().(*net.TCPAddr).Port)

	keyProto := "emberbox.key." + base64.RawURLEncoding.EncodeToString([]byte("secret-b"))
	st, b, _ := f.do("GET", "/page?runtime_preview_token=pv.1.x&q=1", "secret-b", nil, map[string]string{
		"E2b-Sandbox-Id": id, "E2b-Sandbox-Port": port, "X-Access-Token": tok,
		"E2B-Traffic-Access-Token": "e2b2.other", "Authorization": "Bearer secret-b",
		"X-Runtime-Preview-Token": "pv.1.x", "Cookie": "runtime_preview_token=pv.1.x; app=kept",
		"Sec-WebSocket-Protocol": keyProto + ", chat.v2", "X-App": "kept",
	})
	if st != 204 {
		t.Fatalf("proxied: %d %s", st, b)
	}
	mu.Lock()
	defer mu.Unlock()
	for _, h := range []string{"Authorization", "X-Api-Key", "X-Access-Token", "E2b-Traffic-Access-Token", "X-Runtime-Preview-Token", "E2b-Sandbox-Id"} {
		if v := seen.Header.Get(h); v != "" {
			t.Errorf("the guest saw %s: %q", h, v)
		}
	}
	all := fmt.Sprint(seen.Header) + seen.URL.String()
	for _, secret := range []string{"secret-b", tok, "pv.1.x", keyProto} {
		if strings.Contains(all, secret) {
			t.Errorf("the guest saw %q in %s", secret, all)
		}
	}
	if seen.Header.Get("X-App") != "kept" || seen.URL.Query().Get("q") != "1" || seen.Header.Get("Sec-WebSocket-Protocol") != "chat.v2" {
		t.Errorf("the guest's own headers were not passed: %v %s", seen.Header, seen.URL)
	}
	if c, err := seen.Cookie("app"); err != nil || c.Value != "kept" {
		t.Errorf("the guest's own cookie: %v %v", c, err)
	}
}
