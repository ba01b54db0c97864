package api

import (
	"sync"
	"testing"
	"time"
)

type observed struct {
	route  string
	status int
}

func TestObserveRequest(t *testing.T) {
	e := newEnv(t)
	var mu sync.Mutex
	var got []observed
	e.s = newServer(Config{Manager: rolesOf(e.m), Keys: fakeKeys{}, Idempotency: e.idem,
		ObserveRequest: func(route string, status int, d time.Duration) {
			if d < 0 {
				t.Errorf("%s: negative duration %v", route, d)
			}
			mu.Lock()
			got = append(got, observed{route, status})
			mu.Unlock()
		}})
	e.m.add("key_a", "sbx_a", "running", time.Hour)

	tests := []struct {
		method, target, body string
		want                 observed
	}{
		{"GET", "/v1/sandboxes/sbx_a", "", observed{"GET /v1/sandboxes/{id}", 200}},
		{"GET", "/v1/sandboxes/sbx_9", "", observed{"GET /v1/sandboxes/{id}", 404}},
		{"HEAD", "/v1/sandboxes/sbx_a", "", observed{"GET /v1/sandboxes/{id}", 200}},
		{"POST", "/v1/sandboxes/sbx_a:extend", `{"seconds":60}`, observed{"POST /v1/sandboxes/{id}:extend", 200}},
		{"POST", "/v1/sandboxes/sbx_a/files:mkdir", `{"path":"/workspace/d"}`, observed{"POST /v1/sandboxes/{id}/files:mkdir", 200}},
		{"POST", "/v1/sandboxes/sbx_a:stop", `{}`, observed{"POST /v1/sandboxes/{id}:stop", 200}},
		{"GET", "/v1/sandboxes/panic", "", observed{"GET /v1/sandboxes/{id}", 500}},
		{"GET", "/healthz", "", observed{"GET /healthz", 200}},
		// No route served these.
		{"POST", "/v1/sandboxes/sbx_a:explode", `{}`, observed{"unmatched", 404}},
		{"PUT", "/v1/sandboxes/sbx_a", `{}`, observed{"unmatched", 405}},
		{"GET", "/v1/things/sbx_a", "", observed{"unmatched", 404}},
	}
	for _, tt := range tests {
		mu.Lock()
		got = nil
		mu.Unlock()
		w := e.do(tt.method, tt.target, tt.body)
		mu.Lock()
		if len(got) != 1 || got[0] != tt.want {
			t.Errorf("%s %s (HTTP %d): observed %v, want [%v]", tt.method, tt.target, w.Code, got, tt.want)
		} else if w.Code != tt.want.status {
			t.Errorf("%s %s: observed status %d, sent %d", tt.method, tt.target, tt.want.status, w.Code)
		}
		mu.Unlock()
	}
}
