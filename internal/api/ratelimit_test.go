package api

import (
	"context"
	"fmt"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/emberbox/emberbox/internal/admission"
	"github.com/emberbox/emberbox/internal/errdefs"
)

// countingKeys is fakeKeys that counts lookups.
type countingKeys struct{ n atomic.Int32 }

func (k *countingKeys) Authenticate(ctx context.Context, secret string) (Key, error) {
	k.n.Add(1)
	return fakeKeys{}.Authenticate(ctx, secret)
}

// newLimitedEnv is newEnv with rate limits and a clock the test moves.
func newLimitedEnv(t *testing.T, rl RateLimits) (*testEnv, *countingKeys, *time.Time) {
	t.Helper()
	e := newEnv(t)
	keys := &countingKeys{}
	e.s = newServer(Config{Manager: rolesOf(e.m), Keys: keys, Idempotency: e.idem, RateLimits: rl})
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	e.s.now = func() time.Time { return now }
	return e, keys, &now
}

// limited checks that w is a 429 rate_limited with a wait.
func limited(t *testing.T, w *httptest.ResponseRecorder, wantMs int64) {
	t.Helper()
	if w.Code != 429 {
		t.Fatalf("HTTP %d %s, want 429", w.Code, w.Body)
	}
	ej := errorOf(t, w)
	if ej.Code != "rate_limited" || ej.RetryAfterMs != wantMs {
		t.Errorf("code %q retryAfterMs %d, want rate_limited and %d", ej.Code, ej.RetryAfterMs, wantMs)
	}
	if ra := w.Header().Get("Retry-After"); ra == "" || ra == "0" {
		t.Errorf("Retry-After %q", ra)
	}
}

func TestRateLimitPerKey(t *testing.T) {
	e, _, now := newLimitedEnv(t, RateLimits{Read: Rate{PerSecond: 2, Burst: 3}, Write: Rate{PerSecond: 1, Burst: 1}})
	e.m.add("key_a", "sbx_a", "running", time.Hour)
	for i := range 3 {
		if w := e.do("GET", "/v1/sandboxes/sbx_a", ""); w.Code != 200 {
			t.Fatalf("read %d: HTTP %d %s", i, w.Code, w.Body)
		}
	}
	limited(t, e.do("GET", "/v1/sandboxes/sbx_a", ""), 500) // half a second until the next token
	// Changes have a bucket of their own, and so has another key.
	if w := e.do("POST", "/v1/sandboxes/sbx_a:extend", `{"seconds":60}`); w.Code != 200 {
		t.Fatalf("write beside an empty read bucket: HTTP %d %s", w.Code, w.Body)
	}
	limited(t, e.do("POST", "/v1/sandboxes/sbx_a:extend", `{"seconds":60}`), 1000)
	if w := e.do("GET", "/v1/sandboxes", "", "Authorization", "Bearer secret-b"); w.Code != 200 {
		t.Fatalf("another key: HTTP %d %s", w.Code, w.Body)
	}
	// Tokens come back with time.
	*now = now.Add(500 * time.Millisecond)
	if w := e.do("GET", "/v1/sandboxes/sbx_a", ""); w.Code != 200 {
		t.Fatalf("after the wait: HTTP %d %s", w.Code, w.Body)
	}
	// A refusal with an Idempotency-Key is not stored: the retry runs.
	*now = now.Add(time.Second)
	limitedKey := []string{"Idempotency-Key", "k1"}
	if w := e.do("POST", "/v1/sandboxes/sbx_a:extend", `{"seconds":60}`, limitedKey...); w.Code != 200 {
		t.Fatalf("extend: HTTP %d %s", w.Code, w.Body)
	}
	limited(t, e.do("POST", "/v1/sandboxes/sbx_a:extend", `{"seconds":61}`, "Idempotency-Key", "k2"), 1000)
	*now = now.Add(time.Second)
	if w := e.do("POST", "/v1/sandboxes/sbx_a:extend", `{"seconds":61}`, "Idempotency-Key", "k2"); w.Code != 200 || strings.Contains(w.Body.String(), "replayed") {
		t.Fatalf("retry of a rate-limited request: HTTP %d %s, want it run", w.Code, w.Body)
	}
}

func TestRateLimitPublicByAddress(t *testing.T) {
	e, _, _ := newLimitedEnv(t, RateLimits{Read: Rate{PerSecond: 1, Burst: 2}})
	for range 2 {
		if w := e.do("GET", "/healthz", ""); w.Code != 200 {
			t.Fatalf("HTTP %d", w.Code)
		}
	}
	limited(t, e.do("GET", "/healthz", ""), 1000)
	r := httptest.NewRequest("GET", "/healthz", nil)
	r.RemoteAddr = "198.51.100.7:4000"
	w := httptest.NewRecorder()
	e.s.ServeHTTP(w, r)
	if w.Code != 200 {
		t.Errorf("another address: HTTP %d", w.Code)
	}
}

// TestRateLimitAuthFailures: an address sending wrong keys is refused
// before its keys are looked up.
func TestRateLimitAuthFailures(t *testing.T) {
	e, keys, now := newLimitedEnv(t, RateLimits{AuthFail: Rate{PerSecond: 0.5, Burst: 3}})
	for i := range 3 {
		if w := e.do("GET", "/v1/sandboxes", "", "Authorization", fmt.Sprintf("Bearer wrong-%d", i)); w.Code != 401 {
			t.Fatalf("wrong key %d: HTTP %d", i, w.Code)
		}
	}
	before := keys.n.Load()
	for range 100 {
		limited(t, e.do("GET", "/v1/sandboxes", "", "Authorization", "Bearer wrong"), 2000)
	}
	if n := keys.n.Load() - before; n != 0 {
		t.Errorf("%d key lookups for a flooding address, want none", n)
	}
	*now = now.Add(2 * time.Second)
	if w := e.do("GET", "/v1/sandboxes", ""); w.Code != 200 {
		t.Errorf("a good key once a token is back: HTTP %d %s", w.Code, w.Body)
	}
	// Good keys cost no token.
	for range 5 {
		if w := e.do("GET", "/v1/sandboxes", ""); w.Code != 200 {
			t.Fatalf("good key: HTTP %d", w.Code)
		}
	}
}

// TestLimitersBounded: buckets are forgotten once idle, and callers beyond
// the bound share one bucket instead of growing the map.
func TestLimitersBounded(t *testing.T) {
	l := newLimiters(Rate{PerSecond: 10, Burst: 10}, 100)
	now := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	for i := range 1000 {
		l.allow(fmt.Sprintf("10.0.%d.%d", i/256, i%256), now)
	}
	if n := l.size(); n != 100 {
		t.Errorf("%d buckets after 1000 callers, want the bound 100", n)
	}
	// The 101st caller and later share the overflow bucket: 10 tokens.
	if ok, _ := l.allow("10.9.9.9", now); ok {
		t.Error("the overflow bucket, drained by 900 callers, let a request through")
	}
	// After the refill time (1 s), idle buckets go at the next sweep.
	now = now.Add(limiterSweep)
	if ok, _ := l.allow("fresh", now); !ok {
		t.Error("a new caller after the sweep was refused")
	}
	if n := l.size(); n != 1 {
		t.Errorf("%d buckets after everyone went idle, want 1", n)
	}
	if newLimiters(Rate{}, 0) != nil {
		t.Error("a zero rate made limiters")
	}
}

func TestClientAddr(t *testing.T) {
	for in, want := range map[string]string{
		"192.0.2.1:1234":                "192.0.2.1",
		"[2001:db8:1:2:3:4:5:6]:80":     "2001:db8:1:2::/64",
		"[2001:db8:1:2:ffff::1]:80":     "2001:db8:1:2::/64",
		"[::ffff:192.0.2.9]:80":         "192.0.2.9",
		"@":                             "local",
		"":                              "local",
		"[fe80::1%eth0]:80":             "fe80::/64",
		"not an address at all, really": "local",
	} {
		r := httptest.NewRequest("GET", "/", nil)
		r.RemoteAddr = in
		if got := clientAddr(r); got != want {
			t.Errorf("clientAddr(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestAdmissionErrors: the manager's refusals reach the caller with their
// status, code, wait and details, and are never stored for a retry.
func TestAdmissionErrors(t *testing.T) {
	tests := []struct {
		name   string
		err    error
		status int
		code   string
		retry  string
	}{
		{name: "no capacity", status: 409, code: admission.CodeNoCapacity, retry: "2",
			err: &errdefs.CodedError{Class: errdefs.ErrConflict, Code: admission.CodeNoCapacity, Message: "no room (boots)",
				RetryAfter: admission.BootRetryAfter, Details: map[string]any{"resource": "boots"}}},
		{name: "quota", status: 429, code: admission.CodeQuotaExceeded, retry: "10",
			err: &errdefs.CodedError{Class: errdefs.ErrConflict, Code: admission.CodeQuotaExceeded, Message: "quota",
				RetryAfter: admission.ResourceRetryAfter, Details: map[string]any{"quota": "vcpu"}}},
		{name: "too big", status: 400, code: "invalid_request",
			err: &errdefs.CodedError{Class: errdefs.ErrInvalidArgument, Code: "invalid_request", Message: "vcpu: must be at most 2 on this server",
				Details: map[string]any{"issues": []map[string]string{{"path": "vcpu", "message": "must be at most 2 on this server"}}}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t)
			e.m.createErr = tt.err
			for try := 1; try <= 2; try++ {
				w := e.do("POST", "/v1/sandboxes", `{}`, "Idempotency-Key", "create-1")
				if w.Code != tt.status {
					t.Fatalf("try %d: HTTP %d %s, want %d", try, w.Code, w.Body, tt.status)
				}
				if try == 2 && tt.retry == "" {
					break // a replay, which keeps the first answer's requestId
				}
				ej := errorOf(t, w)
				if ej.Code != tt.code || w.Header().Get("Retry-After") != tt.retry {
					t.Errorf("code %q Retry-After %q, want %q and %q", ej.Code, w.Header().Get("Retry-After"), tt.code, tt.retry)
				}
				if tt.retry != "" && ej.RetryAfterMs <= 0 {
					t.Errorf("no retryAfterMs: %s", w.Body)
				}
				if len(ej.Details) == 0 {
					t.Errorf("details lost: %s", w.Body)
				}
			}
			wantCreates := 2 // a retry-later answer is not kept: the retry runs
			if tt.retry == "" {
				wantCreates = 1 // a final answer is replayed
			}
			if e.m.creates != wantCreates {
				t.Errorf("%d creates for two tries, want %d", e.m.creates, wantCreates)
			}
		})
	}
}
