package store

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/emberbox/emberbox/internal/sandbox"
)

// After a crash, pending records are released at startup while completed
// ones stay for replay, and a create that had recorded its sandbox becomes
// an answer naming that sandbox.
func TestResolvePendingIdempotency(t *testing.T) {
	s, path := openTest(t)
	ctx := t.Context()
	for _, k := range []string{"a", "b", "c", "d"} {
		if _, ok, err := s.ReserveIdempotency(ctx, "k1", k, "fp"); err != nil || !ok {
			t.Fatalf("reserve %s: %v, %v", k, ok, err)
		}
	}
	if err := s.CompleteIdempotency(ctx, "k1", "b", 201, "application/json", []byte("{}")); err != nil {
		t.Fatal(err)
	}
	// d's request recorded a sandbox, in the same transaction as the link.
	sb := newSandbox("sbx_d", "k1", base)
	if err := s.InsertSandbox(ctx, sb, "d"); err != nil {
		t.Fatal(err)
	}
	// The process dies with a, c and d pending; the next one opens the store.
	s.Close()
	s, err := Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	resolved, released, err := s.ResolvePendingIdempotency(ctx)
	if err != nil || resolved != 1 || released != 2 {
		t.Fatalf("ResolvePendingIdempotency = %d, %d, %v; want 1 resolved, 2 released", resolved, released, err)
	}
	for _, k := range []string{"a", "c"} {
		if rec, ok, err := s.ReserveIdempotency(ctx, "k1", k, "fp2"); err != nil || !ok {
			t.Errorf("pending key %s still blocked: %+v, %v", k, rec, err)
		}
	}
	rec, ok, err := s.ReserveIdempotency(ctx, "k1", "b", "fp")
	if err != nil || ok || rec == nil || rec.Status != 201 || rec.SandboxID != "" {
		t.Errorf("completed key b: %+v, %v, %v; want its record kept", rec, ok, err)
	}
	rec, ok, err = s.ReserveIdempotency(ctx, "k1", "d", "fp")
	if err != nil || ok || rec == nil || rec.Status != 200 || rec.SandboxID != "sbx_d" || rec.Body != nil {
		t.Errorf("key d of a create cut short: %+v, %v, %v; want status 200 naming sbx_d", rec, ok, err)
	}
	if resolved, released, err := s.ResolvePendingIdempotency(ctx); err != nil || resolved != 0 || released != 2 {
		t.Errorf("second resolve = %d, %d, %v; want the 2 new reservations released", resolved, released, err)
	}
	// A key of another owner is never linked.
	if _, ok, err := s.ReserveIdempotency(ctx, "k2", "e", "fp"); err != nil || !ok {
		t.Fatal(ok, err)
	}
	other := newSandbox("sbx_e", "k1", base)
	other.State = sandbox.StateStarting
	if err := s.InsertSandbox(ctx, other, "e"); err != nil {
		t.Fatal(err)
	}
	if rec, _, _ := s.ReserveIdempotency(ctx, "k2", "e", "fp"); rec == nil || rec.SandboxID != "" {
		t.Errorf("another owner's key linked: %+v", rec)
	}
}

// TestReserveIdempotencyOnce: of requests that reserve one key at once,
// exactly one runs; the others find its record.
func TestReserveIdempotencyOnce(t *testing.T) {
	s, _ := openTest(t)
	const n = 8
	for round := range 5 {
		key := fmt.Sprintf("req-%d", round)
		var reserved atomic.Int32
		var wg sync.WaitGroup
		for range n {
			wg.Go(func() {
				existing, ok, err := s.ReserveIdempotency(t.Context(), "key_1", key, "POST /v1/sandboxes")
				switch {
				case err != nil:
					t.Error(err)
				case ok:
					reserved.Add(1)
				case existing == nil:
					t.Error("not reserved, and no record returned")
				}
			})
		}
		wg.Wait()
		if got := reserved.Load(); got != 1 {
			t.Fatalf("round %d: %d of %d concurrent reserves of one key ran, want 1", round, got, n)
		}
	}
}
