package store

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/emberbox/emberbox/internal/metering"
	"github.com/emberbox/emberbox/internal/sandbox"
	"github.com/emberbox/emberbox/internal/webhook"
)

// postgresOnly skips a test of the row-level locking PostgreSQL has: on
// SQLite one writer holds the file, so writes cannot overlap at all.
func postgresOnly(t *testing.T) {
	t.Helper()
	if testEngine != postgresEngine {
		t.Skip("PostgreSQL only: SQLite has one writer per file")
	}
}

// waitingQuery counts the transactions of the test's database that wait
// for an advisory lock.
const waitingQuery = `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted
	AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`

// waitForLockWaiters waits until n transactions of the test's database
// wait for an advisory lock, which is how the store's writes queue.
func waitForLockWaiters(t *testing.T, s *Store, n int) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		var waiting int
		if err := s.db.QueryRowContext(t.Context(), waitingQuery).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		if waiting >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d writes wait for a lock after 30 s, want %d", waiting, n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestWritesOfOtherSandboxesDoNotWait: while a transition of one sandbox
// is open (its fn has not returned), a transition and an event of
// another sandbox commit, on this node and on a second one; a second
// transition of the same sandbox and an ordinary write both wait for it,
// and nothing is lost when it ends.
func TestWritesOfOtherSandboxesDoNotWait(t *testing.T) {
	postgresOnly(t)
	s, dsn := openTest(t)
	other, err := Open(t.Context(), dsn) // a second node's store
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { other.Close() })
	ctx := t.Context()
	mustInsert(t, s, newSandbox("sbx_a", "key_1", base))
	mustInsert(t, s, newSandbox("sbx_b", "key_1", base))
	start := newSandbox("sbx_a", "key_1", base).TimeoutSeconds

	entered, release := make(chan struct{}), make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		if _, err := s.UpdateSandbox(ctx, "sbx_a", func(sb *sandbox.Sandbox) bool {
			close(entered)
			<-release
			sb.TimeoutSeconds++
			return true
		}); err != nil {
			t.Error(err)
		}
	})
	<-entered

	// Bounded well below lock_timeout: a write that queued behind sbx_a's
	// would fail here rather than succeed late.
	bctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	for _, st := range []*Store{s, other} {
		if _, err := st.UpdateSandbox(bctx, "sbx_b", func(sb *sandbox.Sandbox) bool {
			sb.TimeoutSeconds++
			return true
		}); err != nil {
			t.Fatalf("a transition of another sandbox, while sbx_a's is open: %v", err)
		}
		if err := st.AppendEvent(bctx, "sbx_b", "ready", "", nil); err != nil {
			t.Fatalf("an event of another sandbox, while sbx_a's transition is open: %v", err)
		}
	}
	// So does the whole life of a new sandbox, as the manager writes it.
	if err := lifecycle(bctx, other, "sbx_c"); err != nil {
		t.Fatalf("the life of another sandbox, while sbx_a's transition is open: %v", err)
	}

	// The same sandbox, from the other node, and an ordinary write, wait.
	wg.Go(func() {
		if _, err := other.UpdateSandbox(ctx, "sbx_a", func(sb *sandbox.Sandbox) bool {
			sb.TimeoutSeconds++
			return true
		}); err != nil {
			t.Error(err)
		}
	})
	waitForLockWaiters(t, s, 1)
	wg.Go(func() {
		if _, err := other.db.ExecContext(ctx, `UPDATE sandboxes SET labels = '{"k":"v"}' WHERE id = ?`, "sbx_a"); err != nil {
			t.Error(err)
		}
	})
	waitForLockWaiters(t, s, 2)
	close(release)
	wg.Wait()

	got, err := s.GetSandbox(ctx, "sbx_a")
	if err != nil {
		t.Fatal(err)
	}
	if got.TimeoutSeconds != start+2 || got.Labels["k"] != "v" {
		t.Errorf("sbx_a after three overlapping writes: timeout %d, labels %v; want %d and k=v",
			got.TimeoutSeconds, got.Labels, start+2)
	}
	if got, _ := s.GetSandbox(ctx, "sbx_b"); got.TimeoutSeconds != start+2 {
		t.Errorf("sbx_b: timeout %d, want %d", got.TimeoutSeconds, start+2)
	}
}

// TestFanOutMissesNoLateSeq: two sandboxes' events append to the feed
// at once, and the one that took the lower seq commits last. The webhook
// fan-out, which pages the feed by seq, waits for it and delivers both;
// a reader that did not hold the whole write lock would have moved its
// cursor past the later seq and lost the earlier one.
func TestFanOutMissesNoLateSeq(t *testing.T) {
	postgresOnly(t)
	s, _ := openTest(t)
	ctx := t.Context()
	mustInsert(t, s, newSandbox("sbx_a", "key_1", base))
	mustInsert(t, s, newSandbox("sbx_b", "key_1", base))
	newWebhook(t, s, "wh_1", "key_1", nil)

	first, err := s.db.beginScoped(ctx, "sandbox:sbx_a")
	if err != nil {
		t.Fatal(err)
	}
	defer first.Rollback()
	e1 := &webhook.Event{Owner: "key_1", Type: webhook.SandboxRunning, ResourceType: webhook.ResourceSandbox, ResourceID: "sbx_a", At: base}
	if err := publish(ctx, first, e1); err != nil {
		t.Fatal(err)
	}
	// The second takes a greater seq and commits while the first is open.
	bctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	if err := s.AppendEvent(bctx, "sbx_b", "ready", "", nil); err != nil {
		t.Fatalf("an event of another sandbox, while one is being appended: %v", err)
	}
	fanned := make(chan error, 1)
	go func() {
		_, err := s.FanOut(ctx, 100, 100)
		fanned <- err
	}()
	// The fan-out waits for the open append, or (were it to read without
	// the whole lock) ends at once.
	deadline := time.Now().Add(30 * time.Second)
	for waiting := 0; waiting == 0 && len(fanned) == 0; {
		if err := s.db.QueryRowContext(ctx, waitingQuery).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		if time.Now().After(deadline) {
			t.Fatal("the fan-out neither waited nor ended in 30 s")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := first.Commit(); err != nil {
		t.Fatal(err)
	}
	if err := <-fanned; err != nil {
		t.Fatal(err)
	}
	if _, err := s.FanOut(ctx, 100, 100); err != nil { // a later round finds nothing it missed
		t.Fatal(err)
	}
	ds, err := s.ListDeliveries(ctx, webhook.DeliveryQuery{Owner: "key_1", WebhookID: "wh_1", Limit: 10})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, d := range ds {
		got = append(got, d.ResourceID)
	}
	slices.Sort(got)
	if !slices.Equal(got, []string{"sbx_a", "sbx_b"}) {
		t.Errorf("the fan-out delivered the events of %v, want sbx_a's (the lower seq, committed last) and sbx_b's", got)
	}
}

// lifecycle writes what a create with an idempotency key, a pause and a
// stop write to the store, in the manager's order.
func lifecycle(ctx context.Context, s *Store, id string) error {
	const key = "key_2"
	at := time.Now()
	r := metering.Reading{At: at, VM: "vm-" + id}
	shape := metering.Shape{VCPU: 1, MemoryMiB: 512}
	steps := []func() error{
		func() error { _, _, err := s.ReserveIdempotency(ctx, key, "req-"+id, "POST"); return err },
		func() error { return s.InsertSandbox(ctx, newSandbox(id, key, base), "req-"+id) },
		func() error { return s.PutNetwork(ctx, id, &sandbox.Network{Version: 1}) },
		func() error { return s.AppendEvent(ctx, id, "created", "", nil) },
		func() error { return s.BeginMeter(ctx, id, key, r) },
		func() error {
			_, err := s.UpdateSandbox(ctx, id, func(sb *sandbox.Sandbox) bool { sb.State = sandbox.StateRunning; return true })
			return err
		},
		func() error { return s.AppendEvent(ctx, id, "ready", "", nil) },
		func() error { return s.CompleteIdempotency(ctx, key, "req-"+id, 201, "application/json", []byte("{}")) },
		func() error {
			r.At, r.CPUNs = at.Add(time.Second), 1e9
			_, err := s.SettleMeter(ctx, id, key, shape, r, true)
			return err
		},
		func() error {
			_, err := s.UpdateSandbox(ctx, id, func(sb *sandbox.Sandbox) bool { sb.State = sandbox.StatePaused; return true })
			return err
		},
		func() error { return s.AppendEvent(ctx, id, "paused", "", nil) },
		func() error {
			return s.AccrueStorage(ctx, id, metering.KindSandbox, key, 1<<30, at, at.Add(time.Minute))
		},
		func() error { return s.ReleaseIdempotency(ctx, key, "req-none") },
		func() error { return s.DropMeter(ctx, id) },
	}
	for i, step := range steps {
		if err := step(); err != nil {
			return fmt.Errorf("step %d: %w", i+1, err)
		}
	}
	return nil
}
