package api

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/emberbox/emberbox/internal/errdefs"
	"github.com/emberbox/emberbox/internal/guest"
	"github.com/emberbox/emberbox/internal/sandbox"
)

// A request whose client went away is not replayed: the retry with the
// same Idempotency-Key runs again.
func TestCancelledRequestNotReplayed(t *testing.T) {
	e := newEnv(t)
	e.m.add("key_a", "sbx_1", sandbox.StateRunning, time.Hour)
	ctx, cancel := context.WithCancel(context.Background())
	var runs atomic.Int32
	started := make(chan struct{})
	e.m.execHook = func(func(guest.Event) error) error {
		if runs.Add(1) == 1 {
			close(started)
			<-ctx.Done() // the guest call ends with the request
			return ctx.Err()
		}
		return nil
	}
	r := httptest.NewRequest("POST", "/v1/sandboxes/sbx_1:exec", strings.NewReader(`{"command":"sleep 100"}`)).WithContext(ctx)
	r.Header.Set("Authorization", "Bearer secret-a")
	r.Header.Set("Idempotency-Key", "k-cancel")
	done := make(chan struct{})
	go func() {
		defer close(done)
		e.s.ServeHTTP(httptest.NewRecorder(), r)
	}()
	select {
	case <-started:
	case <-done:
		t.Fatal("the exec never ran")
	}
	cancel()
	<-done

	w := e.do("POST", "/v1/sandboxes/sbx_1:exec", `{"command":"sleep 100"}`, "Idempotency-Key", "k-cancel")
	if w.Code != http.StatusOK || w.Header().Get("Idempotency-Replayed") != "" {
		t.Errorf("retry: %d replayed=%q %s; want a fresh 200", w.Code, w.Header().Get("Idempotency-Replayed"), w.Body)
	}
	if n := runs.Load(); n != 2 {
		t.Errorf("ran %d times, want 2", n)
	}
}

// Answers that say "not now" (429, a retryAfterMs, a passing state) are
// not kept: the retry runs.
func TestTransientAnswersNotKept(t *testing.T) {
	for _, err := range []error{
		errdefs.New(errdefs.ErrConflict, "rate_limited", "slow down"),
		errdefs.New(errdefs.ErrConflict, "no_capacity", "full"),
		errdefs.New(errdefs.ErrConflict, "sandbox_not_ready", "starting"),
	} {
		e := newEnv(t)
		e.m.createErr = err
		first := e.do("POST", "/v1/sandboxes", `{}`, "Idempotency-Key", "k")
		e.m.createErr = nil
		second := e.do("POST", "/v1/sandboxes", `{}`, "Idempotency-Key", "k")
		if first.Code < 400 || second.Code != http.StatusOK || e.m.creates != 2 {
			t.Errorf("%s: first %d, retry %d, %d creates; want the retry to run", errdefs.Code(err), first.Code, second.Code, e.m.creates)
		}
	}
}

// An answer too large to keep is recorded as such: the retry is told so
// (409) and nothing runs twice.
func TestLargeAnswerNotReplayed(t *testing.T) {
	e := newEnv(t)
	e.idem.maxBody = 64 << 10
	e.m.add("key_a", "sbx_1", sandbox.StateRunning, time.Hour)
	e.m.execResult = guest.ExecResult{Stdout: []byte(strings.Repeat("x", 64<<10))}
	var runs atomic.Int32
	e.m.execHook = func(func(guest.Event) error) error { runs.Add(1); return nil }
	first := e.do("POST", "/v1/sandboxes/sbx_1:exec", `{"command":"big"}`, "Idempotency-Key", "k-big")
	if first.Code != http.StatusOK {
		t.Fatalf("first: %d %s", first.Code, first.Body)
	}
	w := e.do("POST", "/v1/sandboxes/sbx_1:exec", `{"command":"big"}`, "Idempotency-Key", "k-big")
	if w.Code != http.StatusConflict || errorOf(t, w).Code != "idempotency_answer_too_large" {
		t.Errorf("retry: %d %s, want 409 idempotency_answer_too_large", w.Code, w.Body)
	}
	if n := runs.Load(); n != 1 {
		t.Errorf("ran %d times, want 1", n)
	}
}

// Revoked and expired keys are refused with 401, saying which.
func TestRevokedAndExpiredKeys(t *testing.T) {
	e := newEnv(t)
	for secret, msg := range map[string]string{"secret-revoked": "revoked", "secret-expired": "expired", "nope": "required"} {
		w := e.do("GET", "/v1/sandboxes", "", "Authorization", "Bearer "+secret)
		if w.Code != http.StatusUnauthorized || errorOf(t, w).Code != "unauthorized" || !strings.Contains(errorOf(t, w).Message, msg) {
			t.Errorf("%s: %d %s, want 401 saying %q", secret, w.Code, w.Body, msg)
		}
	}
}

// An admin key lists every key and every key's sandboxes; a tenant key
// sees only its own.
func TestAdminRole(t *testing.T) {
	e := newEnv(t)
	e.m.add("key_a", "sbx_a", sandbox.StateRunning, time.Hour)
	e.m.add("key_b", "sbx_b", sandbox.StateRunning, time.Hour)
	type list struct {
		Data []struct {
			ID    string `json:"id"`
			Owner string `json:"ownerKeyId"`
		} `json:"data"`
	}
	ids := func(w *httptest.ResponseRecorder) []string {
		t.Helper()
		if w.Code != http.StatusOK {
			t.Fatalf("status %d: %s", w.Code, w.Body)
		}
		var out []string
		for _, d := range decodeBody[list](t, w).Data {
			out = append(out, d.ID+"/"+d.Owner)
		}
		return out
	}
	admin := []string{"Authorization", "Bearer secret-admin"}
	if got := ids(e.do("GET", "/v1/sandboxes?owner=all", "", admin...)); strings.Join(got, ",") != "sbx_a/key_a,sbx_b/key_b" {
		t.Errorf("admin, owner=all: %v", got)
	}
	if got := ids(e.do("GET", "/v1/sandboxes?owner=key_b", "", admin...)); strings.Join(got, ",") != "sbx_b/key_b" {
		t.Errorf("admin, owner=key_b: %v", got)
	}
	if got := ids(e.do("GET", "/v1/sandboxes", "")); strings.Join(got, ",") != "sbx_a/" {
		t.Errorf("tenant: %v", got)
	}
	for _, o := range []string{"all", "key_b"} {
		if w := e.do("GET", "/v1/sandboxes?owner="+o, ""); w.Code != http.StatusForbidden || errorOf(t, w).Code != "admin_only" {
			t.Errorf("tenant, owner=%s: %d %s, want 403 admin_only", o, w.Code, w.Body)
		}
	}
	if got := ids(e.do("GET", "/v1/keys", "", admin...)); len(got) != 3 {
		t.Errorf("admin keys: %v", got)
	}
	if got := ids(e.do("GET", "/v1/keys", "")); strings.Join(got, ",") != "key_a/" {
		t.Errorf("tenant keys: %v", got)
	}
	// The admin key sees no other key's sandbox by id: listing is all it may do.
	if w := e.do("GET", "/v1/sandboxes/sbx_a", "", admin...); w.Code != http.StatusNotFound {
		t.Errorf("admin GET of another key's sandbox: %d", w.Code)
	}
}
