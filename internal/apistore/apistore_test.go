package apistore_test

import (
	"context"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/emberbox/emberbox/internal/apistore"
	"github.com/emberbox/emberbox/internal/sandbox"
	"github.com/emberbox/emberbox/internal/store"
)

func openStore(t *testing.T) *store.Store {
	t.Helper()
	st, err := store.Open(context.Background(), filepath.Join(t.TempDir(), "emberbox.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

func TestKeys(t *testing.T) {
	ctx := context.Background()
	st := openStore(t)
	k, secret, err := st.CreateKey(ctx, "ci")
	if err != nil {
		t.Fatal(err)
	}
	keys := apistore.Keys{Store: st}
	got, err := keys.Authenticate(ctx, secret)
	if err != nil || got.ID != k.ID || got.Role != k.Role || got.Generation != store.SecretGeneration(secret) {
		t.Errorf("Authenticate = %+v, %v; want key %s (%s), generation %q", got, err, k.ID, k.Role, store.SecretGeneration(secret))
	}
	if _, err := keys.Authenticate(ctx, secret+"x"); err == nil {
		t.Error("a wrong secret authenticated")
	}
	gens, err := keys.Generations(ctx, k.ID)
	if err != nil || !slices.Equal(gens, []string{store.SecretGeneration(secret)}) {
		t.Errorf("Generations = %q, %v", gens, err)
	}
	list, err := keys.ListKeys(ctx)
	if err != nil || len(list) != 1 || list[0].ID != k.ID || list[0].Name != "ci" || list[0].Role != k.Role ||
		!list[0].CreatedAt.Equal(k.CreatedAt) || list[0].ExpiresAt != nil || list[0].RevokedAt != nil {
		t.Errorf("ListKeys = %+v, %v; want %+v", list, err, k)
	}
}

func TestIdempotency(t *testing.T) {
	ctx := context.Background()
	idem := apistore.Idempotency{Store: openStore(t)}
	rec, reserved, err := idem.Reserve(ctx, "key_1", "k", "fp")
	if err != nil || !reserved || rec != nil {
		t.Fatalf("first Reserve = %+v, %v, %v; want nil, true", rec, reserved, err)
	}
	if err := idem.Complete(ctx, "key_1", "k", 201, "application/json", []byte(`{}`)); err != nil {
		t.Fatal(err)
	}
	rec, reserved, err = idem.Reserve(ctx, "key_1", "k", "fp")
	if err != nil || reserved || rec == nil || rec.Fingerprint != "fp" || rec.Status != 201 ||
		rec.ContentType != "application/json" || string(rec.Body) != `{}` {
		t.Fatalf("second Reserve = %+v, %v, %v; want the completed answer", rec, reserved, err)
	}
	if _, reserved, err := idem.Reserve(ctx, "key_1", "other", "fp"); err != nil || !reserved {
		t.Fatalf("Reserve of another key = %v, %v", reserved, err)
	}
	if err := idem.Release(ctx, "key_1", "other"); err != nil {
		t.Fatal(err)
	}
	if _, reserved, err := idem.Reserve(ctx, "key_1", "other", "fp"); err != nil || !reserved {
		t.Errorf("Reserve after Release = %v, %v; want it free again", reserved, err)
	}
}

func TestEvents(t *testing.T) {
	ctx := context.Background()
	st := openStore(t)
	sb := &sandbox.Sandbox{ID: "sbx_1", OwnerKeyID: "key_1", VCPU: sandbox.DefaultVCPU, MemoryMiB: sandbox.DefaultMemoryMiB,
		DiskMiB: sandbox.DefaultDiskMiB, State: sandbox.StateRunning, CreatedAt: time.Now()}
	if err := st.InsertSandbox(ctx, sb, ""); err != nil {
		t.Fatal(err)
	}
	for _, typ := range []string{"created", "ready", "stopped"} {
		if err := st.AppendEvent(ctx, "sbx_1", typ, typ+"!", map[string]any{"n": typ}); err != nil {
			t.Fatal(err)
		}
	}
	evs, err := apistore.Events{Store: st}.ListEvents(ctx, "sbx_1", 0, 2)
	if err != nil || len(evs) != 2 {
		t.Fatalf("ListEvents = %+v, %v; want 2", evs, err)
	}
	if evs[0].Type != "ready" || evs[1].Type != "stopped" || evs[1].Message != "stopped!" ||
		evs[1].Data["n"] != "stopped" || evs[1].At.IsZero() || evs[0].ID >= evs[1].ID {
		t.Errorf("ListEvents = %+v; want ready, then stopped, newest last", evs)
	}
	older, err := apistore.Events{Store: st}.ListEvents(ctx, "sbx_1", evs[0].ID, 10)
	if err != nil || len(older) != 1 || older[0].Type != "created" {
		t.Errorf("ListEvents before %d = %+v, %v; want created", evs[0].ID, older, err)
	}
}
