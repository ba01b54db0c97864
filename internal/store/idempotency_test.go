package store

import "testing"

// After a crash, pending records are released at startup while completed
// ones stay for replay.
func TestReleasePendingIdempotency(t *testing.T) {
	s, path := openTest(t)
	ctx := t.Context()
	for _, k := range []string{"a", "b", "c"} {
		if _, ok, err := s.ReserveIdempotency(ctx, "k1", k, "fp"); err != nil || !ok {
			t.Fatalf("reserve %s: %v, %v", k, ok, err)
		}
	}
	if err := s.CompleteIdempotency(ctx, "k1", "b", 201, "application/json", []byte("{}")); err != nil {
		t.Fatal(err)
	}
	// The process dies with a and c pending; the next one opens the store.
	s.Close()
	s, err := Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	n, err := s.ReleasePendingIdempotency(ctx)
	if err != nil || n != 2 {
		t.Fatalf("ReleasePendingIdempotency = %d, %v; want 2", n, err)
	}
	for _, k := range []string{"a", "c"} {
		if rec, ok, err := s.ReserveIdempotency(ctx, "k1", k, "fp2"); err != nil || !ok {
			t.Errorf("pending key %s still blocked: %+v, %v", k, rec, err)
		}
	}
	rec, ok, err := s.ReserveIdempotency(ctx, "k1", "b", "fp")
	if err != nil || ok || rec == nil || rec.Status != 201 {
		t.Errorf("completed key b: %+v, %v, %v; want its record kept", rec, ok, err)
	}
	if n, err := s.ReleasePendingIdempotency(ctx); err != nil || n != 2 {
		t.Errorf("second release = %d, %v; want the 2 new reservations", n, err)
	}
}
