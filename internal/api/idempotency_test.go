package api

import (
	"encoding/json"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/emberbox/emberbox/internal/errdefs"
	"github.com/emberbox/emberbox/internal/guest"
	"github.com/emberbox/emberbox/internal/sandbox"
)

func TestIdempotentReplay(t *testing.T) {
	e := newEnv(t)
	first := e.do("POST", "/v1/sandboxes", `{"name":"a"}`, "Idempotency-Key", "k-1")
	second := e.do("POST", "/v1/sandboxes", `{"name":"a"}`, "Idempotency-Key", "k-1")
	if first.Code != 200 || second.Code != 200 {
		t.Fatalf("statuses %d, %d", first.Code, second.Code)
	}
	if e.m.creates != 1 {
		t.Errorf("created %d times, want 1", e.m.creates)
	}
	if first.Header().Get("Idempotency-Replayed") != "" || second.Header().Get("Idempotency-Replayed") != "true" {
		t.Errorf("Idempotency-Replayed: %q then %q", first.Header().Get("Idempotency-Replayed"), second.Header().Get("Idempotency-Replayed"))
	}
	a, b := decodeBody[map[string]any](t, first), decodeBody[map[string]any](t, second)
	if a["replayed"] != nil || b["replayed"] != true || a["id"] != b["id"] {
		t.Errorf("first %v, replay %v", a, b)
	}
	// Another key's same Idempotency-Key is its own.
	if w := e.do("POST", "/v1/sandboxes", `{"name":"a"}`, "Idempotency-Key", "k-1", "Authorization", "Bearer secret-b"); w.Header().Get("Idempotency-Replayed") != "" {
		t.Error("replayed another key's answer")
	}
	// A stored 4xx is replayed too.
	e.do("POST", "/v1/sandboxes", `{"vcpu":0}`, "Idempotency-Key", "k-2")
	w := e.do("POST", "/v1/sandboxes", `{"vcpu":0}`, "Idempotency-Key", "k-2")
	if w.Code != 400 || decodeBody[map[string]any](t, w)["replayed"] != true {
		t.Errorf("replayed 400: %d %s", w.Code, w.Body)
	}
}

func TestIdempotencyKeyReused(t *testing.T) {
	e := newEnv(t)
	e.do("POST", "/v1/sandboxes", `{"name":"a"}`, "Idempotency-Key", "k")
	for _, tt := range []struct{ method, target, body string }{
		{"POST", "/v1/sandboxes", `{"name":"b"}`},
		{"POST", "/v1/sandboxes/sbx_1:stop", `{"name":"a"}`},
	} {
		w := e.do(tt.method, tt.target, tt.body, "Idempotency-Key", "k")
		if w.Code != 422 || errorOf(t, w).Code != "idempotency_key_reused" {
			t.Errorf("%s %s: %d %s", tt.method, tt.target, w.Code, w.Body)
		}
	}
}

func TestIdempotencyKeyFormat(t *testing.T) {
	e := newEnv(t)
	for _, key := range []string{"has space", string(make([]byte, 129)), "ünï"} {
		w := e.do("POST", "/v1/sandboxes", `{}`, "Idempotency-Key", key)
		if w.Code != 400 {
			t.Errorf("key %q: status %d", key, w.Code)
		}
	}
	if w := e.do("POST", "/v1/sandboxes", `{}`, "Idempotency-Key", "aZ09_.:-"); w.Code != 200 {
		t.Errorf("good key refused: %d %s", w.Code, w.Body)
	}
}

func TestIdempotencyInProgress(t *testing.T) {
	t.Run("gives up", func(t *testing.T) {
		e := newEnv(t)
		e.s.idemPoll, e.s.idemPollMax = time.Millisecond, 20*time.Millisecond
		e.idem.recs["key_a/k"] = &IdempotentResult{Fingerprint: fingerprint("POST", "/v1/sandboxes", []byte("{}"))}
		w := e.do("POST", "/v1/sandboxes", `{}`, "Idempotency-Key", "k")
		if w.Code != 409 || errorOf(t, w).Code != "idempotency_in_progress" {
			t.Errorf("got %d %s", w.Code, w.Body)
		}
		if e.m.creates != 0 {
			t.Error("ran the request a second time")
		}
	})
	t.Run("waits and replays", func(t *testing.T) {
		e := newEnv(t)
		e.s.idemPoll = time.Millisecond
		entered, release := make(chan struct{}), make(chan struct{})
		var once sync.Once
		e.m.createHook = func() { once.Do(func() { close(entered); <-release }) }
		var first *httptest.ResponseRecorder
		done := make(chan struct{})
		go func() {
			defer close(done)
			first = e.do("POST", "/v1/sandboxes", `{}`, "Idempotency-Key", "k")
		}()
		<-entered
		time.AfterFunc(20*time.Millisecond, func() { close(release) })
		second := e.do("POST", "/v1/sandboxes", `{}`, "Idempotency-Key", "k")
		<-done
		if first.Code != 200 || second.Code != 200 || second.Header().Get("Idempotency-Replayed") != "true" {
			t.Fatalf("first %d, second %d %v", first.Code, second.Code, second.Header())
		}
		if e.m.creates != 1 {
			t.Errorf("created %d times", e.m.creates)
		}
	})
}

func TestIdempotencyReleasedOn5xx(t *testing.T) {
	e := newEnv(t)
	e.m.createErr = errdefs.New(errdefs.ErrUnavailable, "busy", "busy")
	if w := e.do("POST", "/v1/sandboxes", `{}`, "Idempotency-Key", "k"); w.Code != 503 {
		t.Fatalf("status %d", w.Code)
	}
	e.m.createErr = nil
	w := e.do("POST", "/v1/sandboxes", `{}`, "Idempotency-Key", "k")
	if w.Code != 200 || w.Header().Get("Idempotency-Replayed") != "" {
		t.Errorf("retry: %d replayed=%q", w.Code, w.Header().Get("Idempotency-Replayed"))
	}
	if e.m.creates != 2 || e.idem.released != 1 {
		t.Errorf("creates %d, releases %d; want 2, 1", e.m.creates, e.idem.released)
	}
	// A panic releases too.
	if w := e.do("POST", "/v1/sandboxes/panic:stop", `{}`, "Idempotency-Key", "p"); w.Code != 500 {
		t.Errorf("panic: %d", w.Code)
	}
	if _, held := e.idem.recs["key_a/p"]; held {
		t.Error("panicking request kept its key")
	}
}

func TestIdempotencyStreamNotStored(t *testing.T) {
	e := newEnv(t)
	e.m.add("key_a", "sbx_r", sandbox.StateRunning, time.Hour)
	e.m.execEvents = []guest.Event{{Type: "start", ProcessID: "p1"}, {Type: "exit", Exit: &guest.ExecResult{State: "exited"}}}
	body := `{"command":"true","stream":true}`
	for i := range 2 {
		w := e.do("POST", "/v1/sandboxes/sbx_r:exec", body, "Idempotency-Key", "s")
		if w.Code != 200 || w.Header().Get("Idempotency-Replayed") != "" {
			t.Errorf("try %d: %d replayed=%q", i, w.Code, w.Header().Get("Idempotency-Replayed"))
		}
	}
	if e.idem.released != 2 || len(e.idem.recs) != 0 {
		t.Errorf("released %d, kept %d", e.idem.released, len(e.idem.recs))
	}
}

func TestMarkReplayed(t *testing.T) {
	for in, want := range map[string]string{
		`{"a":1}` + "\n": `{"a":1,"replayed":true}` + "\n",
		`{}`:             `{"replayed":true}` + "\n",
		`[1]`:            `[1]`,
	} {
		got := string(markReplayed([]byte(in)))
		if got != want {
			t.Errorf("markReplayed(%q) = %q, want %q", in, got, want)
		}
		if got != in {
			var v any
			if err := json.Unmarshal([]byte(got), &v); err != nil {
				t.Errorf("%q is not JSON", got)
			}
		}
	}
}
