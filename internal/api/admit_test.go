package api

import (
	"net/http/httptest"
	"testing"
)

// TestAdmitAtEntry: the gate an entry node runs before forwarding
// authenticates Runtime API routes and limits failed authentications per
// client address (the connection's, or the one a peer forwarded), so one
// client's wrong keys do not lock out another; public routes and other
// protocols pass to be gated where they are served.
func TestAdmitAtEntry(t *testing.T) {
	e, keys, _ := newLimitedEnv(t, RateLimits{AuthFail: Rate{PerSecond: 0.5, Burst: 3}})
	admit := Admit(e.s)
	try := func(method, path, addr, key string) (*httptest.ResponseRecorder, bool) {
		r := httptest.NewRequest(method, path, nil)
		r.RemoteAddr = addr
		if key != "" {
			r.Header.Set("Authorization", "Bearer "+key)
		}
		w := httptest.NewRecorder()
		return w, admit(w, r)
	}
	const bad, good = "198.51.100.1:40000", "198.51.100.2:40000"
	for i := range 3 {
		w, ok := try("POST", "/v1/sandboxes/sbx_on_b:exec", bad, "wrong")
		if ok || w.Code != 401 {
			t.Fatalf("wrong key %d: admitted %v, HTTP %d", i, ok, w.Code)
		}
		if errorOf(t, w).Code == "" || w.Header().Get("x-request-id") == "" {
			t.Fatalf("wrong key %d: not in the error shape: %s", i, w.Body)
		}
	}
	before := keys.n.Load()
	w, ok := try("GET", "/v1/sandboxes/sbx_on_b", bad, "secret-a")
	if ok {
		t.Fatal("a client over its failed-auth limit was admitted")
	}
	limited(t, w, 2000)
	if keys.n.Load() != before {
		t.Error("a limited client's key was looked up")
	}
	if w, ok := try("POST", "/v1/sandboxes", good, "secret-a"); !ok || w.Body.Len() != 0 {
		t.Errorf("another client with a good key: admitted %v, answered %d %s", ok, w.Code, w.Body)
	}
	if _, ok := try("POST", "/v1/sandboxes/sbx_on_b/previews", good, ""); ok {
		t.Error("a Runtime API route without a key was admitted")
	}
	for _, p := range []string{"/v1/links/tok", "/healthz", "/sandboxes/sbx_on_b/connect", "/preview/pv_1/", "/v1/no/such/route"} {
		if w, ok := try("GET", p, bad, ""); !ok || w.Body.Len() != 0 {
			t.Errorf("%s: admitted %v, answered %d %s; want it passed on", p, ok, w.Code, w.Body)
		}
	}
}
