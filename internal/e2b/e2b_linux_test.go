package e2b_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/emberbox/emberbox/internal/api"
	"github.com/emberbox/emberbox/internal/e2b"
	"github.com/emberbox/emberbox/internal/guest"
	"github.com/emberbox/emberbox/internal/sandbox"
	"github.com/emberbox/emberbox/internal/store"
	"github.com/emberbox/emberbox/internal/vmm/vmmtest"
)

// keys adapts the real store's keys, as the server does.
type keys struct{ st *store.Store }

func (k keys) Authenticate(ctx context.Context, secret string) (api.Key, error) {
	key, err := k.st.AuthenticateKey(ctx, secret)
	if err != nil {
		return api.Key{}, err
	}
	return api.Key{ID: key.ID, Role: key.Role, Generation: store.SecretGeneration(secret)}, nil
}

func (k keys) Generations(ctx context.Context, id string) ([]string, error) {
	return k.st.KeyGenerations(ctx, id)
}

// addKey records tenant key id with secret.
func addKey(t testing.TB, st *store.Store, id, secret string) {
	t.Helper()
	k, _, err := st.NewKey(id)
	if err != nil {
		t.Fatal(err)
	}
	k.ID = id
	if err := st.InsertKey(context.Background(), k, secret); err != nil {
		t.Fatal(err)
	}
}

// idem adapts the real store's idempotency records, as the server does.
type idem struct{ st *store.Store }

func (s idem) Reserve(ctx context.Context, keyID, key, fp string) (*api.IdempotentResult, bool, error) {
	rec, reserved, err := s.st.ReserveIdempotency(ctx, keyID, key, fp)
	if err != nil || rec == nil {
		return nil, reserved, err
	}
	return &api.IdempotentResult{Fingerprint: rec.Fingerprint, Status: rec.Status, Body: rec.Body, SandboxID: rec.SandboxID}, reserved, nil
}

func (s idem) Complete(ctx context.Context, keyID, key string, status int, ct string, body []byte) error {
	return s.st.CompleteIdempotency(ctx, keyID, key, status, ct, body)
}

func (s idem) Release(ctx context.Context, keyID, key string) error {
	return s.st.ReleaseIdempotency(ctx, keyID, key)
}

type fixture struct {
	t       testing.TB
	srv     *httptest.Server
	st      *store.Store
	mgr     *sandbox.Manager
	routed  chan sandbox.Routed // what the envd stand-in saw
	nextHit chan string         // paths Next served
}

// newFixture serves E2B's front for two tenants, key_a (secret-a) and
// key_b (secret-b), without rate limits.
func newFixture(t testing.TB) *fixture {
	t.Helper()
	return newLimitedFixture(t, nil, nil)
}

// newLimitedFixture is newFixture with rate limits, and next (nil: a
// stand-in answering 418) for what is not E2B's.
func newLimitedFixture(t testing.TB, limiter *api.RateLimiter, next func(*sandbox.Manager, api.Keys) http.Handler) *fixture {
	t.Helper()
	drv := vmmtest.NewDriver(t)
	dir := t.TempDir()
	st, err := store.Open(context.Background(), dir+"/test.db")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	mgr := sandbox.New(sandbox.Config{Store: st, Driver: drv, DataDir: dir, BootTimeout: 10 * time.Second})
	t.Cleanup(mgr.Close)
	tokens, err := e2b.NewTokens(bytes.Repeat([]byte{7}, 32))
	if err != nil {
		t.Fatal(err)
	}
	addKey(t, st, "key_a", "secret-a")
	addKey(t, st, "key_b", "secret-b")
	f := &fixture{t: t, st: st, mgr: mgr, routed: make(chan sandbox.Routed, 16), nextHit: make(chan string, 16)}
	envd := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rt, ok := sandbox.RoutedFrom(r.Context())
		if !ok {
			http.Error(w, "not routed", 500)
			return
		}
		f.routed <- rt
		res, err := rt.Guest.Exec(r.Context(), guest.ExecRequest{Command: "echo routed"}, nil)
		if err != nil {
			http.Error(w, err.Error(), 500)
			return
		}
		w.Write(res.Stdout)
	})
	var nextH http.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.nextHit <- r.URL.Path
		w.WriteHeader(http.StatusTeapot)
	})
	if next != nil {
		nextH = next(mgr, keys{st})
	}
	h := e2b.New(e2b.Config{
		Manager: mgr, Network: mgr.Networks, Keys: keys{st}, Tokens: tokens, Limiter: limiter, Envd: envd, EnvdVersion: "0.5.7", Idempotency: idem{st},
		Next: nextH, Domain: "sbx.example.test",
	})
	f.srv = httptest.NewServer(h)
	t.Cleanup(f.srv.Close)
	return f
}

func (f *fixture) do(method, path, key string, body any, hdr map[string]string) (int, []byte, http.Header) {
	f.t.Helper()
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, _ := http.NewRequest(method, f.srv.URL+path, rd)
	if key != "" {
		req.Header.Set("X-API-KEY", key)
	}
	for k, v := range hdr {
		if k == "Host" {
			req.Host = v
			continue
		}
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		f.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b, resp.Header
}

// wantError checks E2B's error shape.
func wantError(t testing.TB, what string, status int, body []byte, want int) {
	t.Helper()
	var e struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	}
	if status != want || json.Unmarshal(body, &e) != nil || e.Code != want || e.Message == "" {
		t.Errorf("%s: %d %s, want %d in E2B's error shape", what, status, body, want)
	}
}

func TestControlPlaneAndRouting(t *testing.T) {
	f := newFixture(t)

	// No key, a wrong key, an unknown template, an unsupported field.
	st, b, _ := f.do("POST", "/v2/sandboxes", "", map[string]any{"templateID": "base"}, nil)
	wantError(t, "create without key", st, b, 401)
	st, b, _ = f.do("POST", "/v2/sandboxes", "nope", map[string]any{"templateID": "base"}, nil)
	wantError(t, "create with a bad key", st, b, 401)
	st, b, _ = f.do("POST", "/v2/sandboxes", "secret-a", map[string]any{"templateID": "nodejs"}, nil)
	wantError(t, "unknown template", st, b, 404)
	st, b, _ = f.do("POST", "/v2/sandboxes", "secret-a", map[string]any{"templateID": "base", "volumeMounts": []any{map[string]any{"name": "v"}}}, nil)
	wantError(t, "volume mounts", st, b, 400)
	st, b, _ = f.do("POST", "/v2/sandboxes", "secret-a", map[string]any{"templateID": "base", "timeout": 0}, nil)
	wantError(t, "zero timeout", st, b, 400)

	// Create answers a running sandbox.
	st, b, _ = f.do("POST", "/v2/sandboxes", "secret-a", map[string]any{
		"templateID": "code-interpreter-v1", "timeout": 300, "metadata": map[string]string{"team": "red"},
		"envVars": map[string]string{"GREETING": "hi"},
	}, nil)
	if st != 201 {
		t.Fatalf("create: %d %s", st, b)
	}
	var created struct {
		SandboxID, TemplateID, ClientID, EnvdVersion, EnvdAccessToken, TrafficAccessToken string
		Domain                                                                            *string
	}
	if err := json.Unmarshal(b, &created); err != nil {
		t.Fatal(err)
	}
	if created.SandboxID == "" || created.TemplateID != "code-interpreter-v1" || created.EnvdVersion != "0.5.7" ||
		created.EnvdAccessToken == "" || created.TrafficAccessToken == "" || created.Domain == nil || *created.Domain != "sbx.example.test" {
		t.Fatalf("create answer %s", b)
	}
	id := created.SandboxID
	sb, err := f.mgr.Get(context.Background(), "key_a", id)
	if err != nil || sb.State != sandbox.StateRunning || sb.Labels["team"] != "red" || sb.Labels["e2b.template"] != "code-interpreter-v1" ||
		sb.OnLeaseEnd != sandbox.LeaseEndDelete || sb.TimeoutSeconds != 300 {
		t.Fatalf("the Emberbox sandbox: %+v, %v", sb, err)
	}

	// Get, and another key's view.
	st, b, _ = f.do("GET", "/sandboxes/"+id, "secret-a", nil, nil)
	var detail map[string]any
	_ = json.Unmarshal(b, &detail)
	if st != 200 || detail["state"] != "running" || detail["metadata"].(map[string]any)["team"] != "red" || detail["envdAccessToken"] != created.EnvdAccessToken {
		t.Errorf("get: %d %s", st, b)
	}
	st, b, _ = f.do("GET", "/sandboxes/"+id, "secret-b", nil, nil)
	wantError(t, "get with another key", st, b, 404)
	st, b, _ = f.do("DELETE", "/sandboxes/"+id, "secret-b", nil, nil)
	wantError(t, "kill with another key", st, b, 404)

	// Lists: metadata and state filters, and pagination.
	st, b, _ = f.do("POST", "/sandboxes", "secret-a", map[string]any{"templateID": "base", "metadata": map[string]string{"team": "blue"}}, nil)
	if st != 201 {
		t.Fatalf("v1 create: %d %s", st, b)
	}
	var other struct{ SandboxID string }
	_ = json.Unmarshal(b, &other)
	if sb, err := f.mgr.Get(context.Background(), "key_a", other.SandboxID); err != nil || sb.TimeoutSeconds != 15 {
		t.Errorf("a v1 create without a timeout: %+v, %v; want E2B's v1 default of 15 s", sb, err)
	}
	st, b, _ = f.do("POST", "/v2/sandboxes", "secret-a", map[string]any{"templateID": "base", "metadata": map[string]string{"team": "green"}}, nil)
	var third struct{ SandboxID string }
	_ = json.Unmarshal(b, &third)
	if sb, err := f.mgr.Get(context.Background(), "key_a", third.SandboxID); st != 201 || err != nil || sb.TimeoutSeconds != 300 {
		t.Errorf("a v2 create without a timeout: %d %+v, %v; want E2B's v2 default of 300 s", st, sb, err)
	}
	list := func(q string) (ids []string, next string) {
		t.Helper()
		st, b, hdr := f.do("GET", "/v2/sandboxes"+q, "secret-a", nil, nil)
		var got []struct{ SandboxID, State string }
		if st != 200 || json.Unmarshal(b, &got) != nil {
			t.Fatalf("list %s: %d %s", q, st, b)
		}
		for _, g := range got {
			ids = append(ids, g.SandboxID+"/"+g.State)
		}
		return ids, hdr.Get("X-Next-Token")
	}
	if ids, _ := list("?metadata=team%3Dred"); len(ids) != 1 || ids[0] != id+"/running" {
		t.Errorf("list by metadata: %v", ids)
	}
	if ids, _ := list("?state=paused"); len(ids) != 0 {
		t.Errorf("list paused: %v", ids)
	}
	page1, next := list("?limit=1")
	if len(page1) != 1 || next == "" {
		t.Errorf("first page: %v next %q", page1, next)
	}
	if page2, _ := list("?limit=2&nextToken=" + next); len(page2) != 2 || page2[0] == page1[0] || page2[1] == page1[0] {
		t.Errorf("second page: %v after %v", page2, page1)
	}
	st, b, _ = f.do("GET", "/v2/sandboxes?state=stopped", "secret-a", nil, nil)
	wantError(t, "list by a state E2B lacks", st, b, 400)
	st, b, _ = f.do("GET", "/v2/sandboxes", "secret-b", nil, nil)
	if st != 200 || strings.TrimSpace(string(b)) != "[]" {
		t.Errorf("another key's list: %d %s", st, b)
	}

	// Sandbox traffic by headers: the envd token of this sandbox only.
	envdHdr := map[string]string{"E2b-Sandbox-Id": id, "E2b-Sandbox-Port": "49983", "X-Access-Token": created.EnvdAccessToken}
	st, b, _ = f.do("GET", "/health", "", nil, envdHdr)
	if st != 200 || string(b) != "routed\n" {
		t.Fatalf("envd traffic: %d %s", st, b)
	}
	if rt := <-f.routed; rt.Sandbox.ID != id || rt.Sandbox.OwnerKeyID != "key_a" || rt.Home != "/home/user" {
		t.Errorf("routed to %+v with home %q; want E2B's layout (/home/user) for a sandbox E2B created", rt.Sandbox, rt.Home)
	}
	for name, hdr := range map[string]map[string]string{
		"no token":                {"E2b-Sandbox-Id": id},
		"traffic token for envd":  {"E2b-Sandbox-Id": id, "X-Access-Token": created.TrafficAccessToken},
		"another sandbox's token": {"E2b-Sandbox-Id": other.SandboxID, "X-Access-Token": created.EnvdAccessToken},
		"forged token":            {"E2b-Sandbox-Id": id, "X-Access-Token": "e2b1.a2V5X2I.AAAA"},
	} {
		st, b, _ = f.do("GET", "/health", "", nil, hdr)
		wantError(t, name, st, b, 401)
	}
	st, b, _ = f.do("GET", "/health", "", nil, map[string]string{"E2b-Sandbox-Id": id, "E2b-Sandbox-Port": "x", "X-Access-Token": created.EnvdAccessToken})
	wantError(t, "bad port", st, b, 400)
	// The same by host name under the domain.
	st, b, _ = f.do("GET", "/health", "", nil, map[string]string{"Host": "49983-" + id + ".sbx.example.test", "X-Access-Token": created.EnvdAccessToken})
	if st != 200 || string(b) != "routed\n" {
		t.Errorf("envd traffic by host name: %d %s", st, b)
	}
	<-f.routed

	// Another port: proxied into the guest (the fake guest's loopback is
	// the host's), with the traffic token, credentials stripped.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	app := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "app %s token=%q", r.URL.Path, r.Header.Get("E2B-Traffic-Access-Token")+r.Header.Get("X-Access-Token"))
	})}
	go app.Serve(ln)
	t.Cleanup(func() { app.Close() })
	port := fmt.Sprint(ln.Addr().(*net.TCPAddr).Port)
	st, b, _ = f.do("GET", "/hello", "", nil, map[string]string{"E2b-Sandbox-Id": id, "E2b-Sandbox-Port": port, "E2B-Traffic-Access-Token": created.TrafficAccessToken})
	if st != 200 || string(b) != `app /hello token=""` {
		t.Errorf("port proxy: %d %s", st, b)
	}

	// Requests that are not E2B's go to Next.
	if st, _, _ := f.do("GET", "/v1/sandboxes", "", nil, nil); st != http.StatusTeapot || <-f.nextHit != "/v1/sandboxes" {
		t.Errorf("Runtime path: %d", st)
	}
	st, b, _ = f.do("GET", "/templates", "secret-a", nil, nil)
	wantError(t, "an E2B route not served", st, b, 501)

	// Timeout: shorter or longer, from now.
	st, b, _ = f.do("POST", "/sandboxes/"+id+"/timeout", "secret-a", map[string]int{"timeout": 120}, nil)
	if st != 204 {
		t.Errorf("timeout: %d %s", st, b)
	}
	if sb, _ := f.mgr.Get(context.Background(), "key_a", id); sb.ExpiresAt == nil || time.Until(*sb.ExpiresAt) > 121*time.Second || time.Until(*sb.ExpiresAt) < 100*time.Second {
		t.Errorf("after timeout 120: expires %v", sb.ExpiresAt)
	}

	// Pause, pause again (409), connect resumes (201), connect again (200).
	if st, b, _ = f.do("POST", "/sandboxes/"+id+"/pause", "secret-a", nil, nil); st != 204 {
		t.Fatalf("pause: %d %s", st, b)
	}
	if ids, _ := list("?state=paused"); len(ids) != 1 || ids[0] != id+"/paused" {
		t.Errorf("list paused: %v", ids)
	}
	st, b, _ = f.do("POST", "/sandboxes/"+id+"/pause", "secret-a", nil, nil)
	wantError(t, "pause twice", st, b, 409)
	if st, b, _ = f.do("POST", "/v2/sandboxes/"+id+"/connect", "secret-a", map[string]int{"timeout": 300}, nil); st != 201 {
		t.Fatalf("connect to paused: %d %s", st, b)
	}
	// Pause again, and resume (v1) with autoPause: the next timeout pauses.
	if st, b, _ = f.do("POST", "/sandboxes/"+id+"/pause", "secret-a", nil, nil); st != 204 {
		t.Fatalf("second pause: %d %s", st, b)
	}
	if st, b, _ = f.do("POST", "/sandboxes/"+id+"/resume", "secret-a", map[string]any{"timeout": 300, "autoPause": true}, nil); st != 201 {
		t.Fatalf("resume: %d %s", st, b)
	}
	if sb, _ := f.mgr.Get(context.Background(), "key_a", id); sb.OnLeaseEnd != sandbox.LeaseEndPause {
		t.Errorf("after resume with autoPause: onLeaseEnd %q", sb.OnLeaseEnd)
	}
	st, b, _ = f.do("POST", "/sandboxes/"+id+"/resume", "secret-a", map[string]any{}, nil)
	wantError(t, "resume of a running sandbox", st, b, 409)
	if st, b, _ = f.do("POST", "/v2/sandboxes/"+id+"/connect", "secret-a", map[string]int{"timeout": 300}, nil); st != 200 {
		t.Errorf("connect to running: %d %s", st, b)
	}
	st, b, _ = f.do("GET", "/health", "", nil, envdHdr)
	if st != 200 {
		t.Errorf("envd after resume: %d %s", st, b)
	}
	<-f.routed

	// Kill: 204, then 404; the Runtime record says deleted.
	if st, b, _ = f.do("DELETE", "/sandboxes/"+id, "secret-a", nil, nil); st != 204 {
		t.Errorf("kill: %d %s", st, b)
	}
	st, b, _ = f.do("DELETE", "/sandboxes/"+id, "secret-a", nil, nil)
	wantError(t, "kill twice", st, b, 404)
	st, b, _ = f.do("GET", "/sandboxes/"+id, "secret-a", nil, nil)
	wantError(t, "get after kill", st, b, 404)
	st, b, _ = f.do("GET", "/health", "", nil, envdHdr)
	if st == 200 {
		t.Errorf("envd traffic to a killed sandbox: %d %s", st, b)
	}
}

func TestCreateWithIdempotencyKeyRunsOnce(t *testing.T) {
	f := newFixture(t)
	body := map[string]any{"templateID": "base", "timeout": 300}
	hdr := map[string]string{"Idempotency-Key": "retry-1"}
	st, b1, _ := f.do("POST", "/v2/sandboxes", "secret-a", body, hdr)
	st2, b2, _ := f.do("POST", "/v2/sandboxes", "secret-a", body, hdr)
	var a1, a2 struct{ SandboxID, EnvdAccessToken string }
	_ = json.Unmarshal(b1, &a1)
	_ = json.Unmarshal(b2, &a2)
	if st != 201 || st2 != 201 || a1.SandboxID == "" || a1 != a2 {
		t.Fatalf("two creates with one key: %d %s / %d %s", st, b1, st2, b2)
	}
	sbs, _, err := f.mgr.List(context.Background(), sandbox.ListOptions{OwnerKeyID: "key_a"})
	if err != nil || len(sbs) != 1 {
		t.Errorf("%d sandboxes after a retried create, want 1 (%v)", len(sbs), err)
	}
	st, b, _ := f.do("POST", "/v2/sandboxes", "secret-a", map[string]any{"templateID": "base", "timeout": 60}, hdr)
	wantError(t, "the key with another body", st, b, 422)
	// Another caller's key of the same name is its own.
	st, b, _ = f.do("POST", "/v2/sandboxes", "secret-b", body, hdr)
	var a3 struct{ SandboxID string }
	_ = json.Unmarshal(b, &a3)
	if st != 201 || a3.SandboxID == a1.SandboxID {
		t.Errorf("another key's create with the same Idempotency-Key: %d %s", st, b)
	}
	st, b, _ = f.do("POST", "/v2/sandboxes", "secret-a", body, map[string]string{"Idempotency-Key": "Bad Key"})
	wantError(t, "an invalid key", st, b, 400)
}

// FuzzE2BRequest sends arbitrary requests, some with a real sandbox's id
// and token: none may panic or answer 5xx.
func FuzzE2BRequest(f *testing.F) {
	fx := newFixture(f)
	st, b, _ := fx.do("POST", "/v2/sandboxes", "secret-a", map[string]any{"templateID": "base", "timeout": 3600}, nil)
	if st != 201 {
		f.Fatalf("create: %d %s", st, b)
	}
	var sb struct{ SandboxID, EnvdAccessToken, TrafficAccessToken string }
	_ = json.Unmarshal(b, &sb)
	go func() { // the stand-ins report every request they serve
		for range fx.routed {
		}
	}()
	go func() {
		for range fx.nextHit {
		}
	}()
	for _, seed := range []struct {
		method, path, body string
		sel                uint8
	}{
		{"GET", "/v2/sandboxes?metadata=a%3Db&state=running,paused&limit=5", "", 1},
		{"POST", "/v2/sandboxes", `{"templateID":"base","timeout":5,"metadata":{"k":"v"},"network":{"allowOut":["pypi.org"]}}`, 1},
		{"POST", "/sandboxes/{id}/timeout", `{"timeout":10}`, 1},
		{"POST", "/v2/sandboxes/{id}/connect", `{"timeout":-1}`, 1},
		{"GET", "/files?path=/x", "", 2},
		{"GET", "/", "", 3},
		{"DELETE", "/sandboxes/{id}", "", 0},
	} {
		f.Add(seed.method, seed.path, seed.body, seed.sel)
	}
	f.Fuzz(func(t *testing.T, method, path, body string, sel uint8) {
		if !strings.HasPrefix(path, "/") || strings.ContainsAny(path, " \r\n#") || len(method) == 0 || strings.ContainsAny(method, " \r\n") {
			return
		}
		path = strings.ReplaceAll(path, "{id}", sb.SandboxID)
		if method == "DELETE" || strings.HasSuffix(path, "/pause") {
			return // keep the one sandbox running for the other inputs
		}
		req, err := http.NewRequest(method, fx.srv.URL+path, strings.NewReader(body))
		if err != nil {
			return
		}
		switch sel % 4 {
		case 1:
			req.Header.Set("X-API-KEY", "secret-a")
		case 2:
			req.Header.Set("E2b-Sandbox-Id", sb.SandboxID)
			req.Header.Set("X-Access-Token", sb.EnvdAccessToken)
		case 3:
			req.Header.Set("E2b-Sandbox-Id", sb.SandboxID)
			req.Header.Set("E2b-Sandbox-Port", fmt.Sprint(1+int(sel)))
			req.Header.Set("E2B-Traffic-Access-Token", sb.TrafficAccessToken)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return
		}
		rb, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode >= 500 && resp.StatusCode != http.StatusBadGateway && resp.StatusCode != http.StatusNotImplemented {
			t.Fatalf("%s %s (sel %d): %d %s", method, path, sel, resp.StatusCode, rb)
		}
	})
}

func TestNetworkRulesTranslate(t *testing.T) {
	f := newFixture(t)
	st, b, _ := f.do("POST", "/v2/sandboxes", "secret-a", map[string]any{"templateID": "base",
		"network": map[string]any{"allowOut": []string{"pypi.org", "*.pythonhosted.org"}, "denyOut": []string{"0.0.0.0/0"}}}, nil)
	if st != 201 {
		t.Fatalf("create: %d %s", st, b)
	}
	var c struct{ SandboxID string }
	_ = json.Unmarshal(b, &c)
	ns, err := f.mgr.Networks.Network(context.Background(), "key_a", c.SandboxID)
	if err != nil {
		t.Fatal(err)
	}
	if p := ns.Network.Policy; p.Internet || len(p.Allow) != 2 || len(p.Deny) != 0 {
		t.Errorf("denyOut 0.0.0.0/0 + allowOut became %+v, want internet off and the two allowed", p)
	}
	st, b, _ = f.do("PUT", "/sandboxes/"+c.SandboxID+"/network", "secret-a", map[string]any{"denyOut": []string{"10.1.0.0/16"}}, nil)
	if st != 204 {
		t.Fatalf("put network: %d %s", st, b)
	}
	ns, _ = f.mgr.Networks.Network(context.Background(), "key_a", c.SandboxID)
	if p := ns.Network.Policy; !p.Internet || len(p.Allow) != 0 || len(p.Deny) != 1 || p.Deny[0] != "10.1.0.0/16" {
		t.Errorf("after the update: %+v", p)
	}
	st, b, _ = f.do("PUT", "/sandboxes/"+c.SandboxID+"/network", "secret-a", map[string]any{"denyOut": []string{"example.com"}}, nil)
	wantError(t, "a domain in denyOut", st, b, 400)
	st, b, _ = f.do("PUT", "/sandboxes/"+c.SandboxID+"/network", "secret-b", map[string]any{}, nil)
	wantError(t, "another key's network", st, b, 404)
	st, b, _ = f.do("POST", "/v2/sandboxes", "secret-a", map[string]any{"templateID": "base", "allow_internet_access": false}, nil)
	_ = json.Unmarshal(b, &c)
	if ns, err := f.mgr.Networks.Network(context.Background(), "key_a", c.SandboxID); st != 201 || err != nil || ns.Network.Policy.Internet {
		t.Errorf("allow_internet_access false: %d %s %+v %v", st, b, ns, err)
	}
}
