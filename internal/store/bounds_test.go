package store

import (
	"bytes"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"
)

// fileSize is the size of the database and its log.
func fileSize(t *testing.T, path string) int64 {
	t.Helper()
	var n int64
	for _, p := range []string{path, path + "-wal"} {
		if fi, err := os.Stat(p); err == nil {
			n += fi.Size()
		}
	}
	return n
}

// A sandbox's events are a ring of MaxEventsPerSandbox, each stored small,
// however many a loop of maximal events appends.
func TestEventRing(t *testing.T) {
	s, _ := openTest(t)
	ctx := t.Context()
	mustInsert(t, s, newSandbox("sbx_1", "k1", base), newSandbox("sbx_2", "k1", base))
	if err := s.AppendEvent(ctx, "sbx_2", "created", "other", nil); err != nil {
		t.Fatal(err)
	}
	huge := strings.Repeat("é", 10_000)
	n := 2*MaxEventsPerSandbox + 500
	if testing.Short() {
		n = MaxEventsPerSandbox + 200
	}
	for i := range n {
		data := map[string]any{"i": i, "target": huge, "allow": []string{huge, huge}}
		if err := s.AppendEvent(ctx, "sbx_1", "egress_refused", huge, data); err != nil {
			t.Fatal(err)
		}
	}
	var rows, bytes int64
	if err := s.db.QueryRowContext(ctx, `SELECT count(*), sum(length(message) + coalesce(length(data), 0))
		FROM sandbox_events WHERE sandbox_id = 'sbx_1'`).Scan(&rows, &bytes); err != nil {
		t.Fatal(err)
	}
	if rows != MaxEventsPerSandbox {
		t.Errorf("%d events kept, want %d", rows, MaxEventsPerSandbox)
	}
	if max := int64(MaxEventsPerSandbox * (MaxEventMessage + MaxEventData)); bytes > max {
		t.Errorf("%d bytes of events, want at most %d", bytes, max)
	}
	evs, err := s.ListEvents(ctx, "sbx_1", 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(evs) != MaxEventsPerSandbox || evs[len(evs)-1].Data["i"] != float64(n-1) || evs[0].Data["i"] != float64(n-MaxEventsPerSandbox) {
		t.Errorf("kept %d events, first %v, last %v; want the newest", len(evs), evs[0].Data["i"], evs[len(evs)-1].Data["i"])
	}
	if e := evs[0]; len(e.Message) > MaxEventMessage || len(e.Data["target"].(string)) > maxEventString {
		t.Errorf("event not cut: message %d bytes, target %d bytes", len(e.Message), len(e.Data["target"].(string)))
	}
	if e := evs[0]; !strings.HasPrefix(huge, e.Message) {
		t.Errorf("message not cut at a character boundary")
	}
	// Another sandbox's events are not touched by the ring.
	if evs, _ := s.ListEvents(ctx, "sbx_2", 0); len(evs) != 1 {
		t.Errorf("sbx_2 has %d events, want 1", len(evs))
	}
	// Pages going back in time.
	page, err := s.ListEventsBefore(ctx, "sbx_1", evs[10].ID, 5)
	if err != nil || len(page) != 5 || page[4].ID != evs[9].ID || page[0].ID != evs[5].ID {
		t.Errorf("ListEventsBefore = %d events, %v", len(page), err)
	}
}

// The idempotency records of one key stay within their bounds under a loop
// of maximal answers: large ones are not kept, the oldest go, and after
// the prune and Compact the file shrinks back.
func TestIdempotencyBounds(t *testing.T) {
	s, path := openTest(t)
	ctx := t.Context()
	now := base
	s.now = func() time.Time { return now }

	big := bytes.Repeat([]byte("x"), MaxIdempotencyBody+1)
	if _, ok, err := s.ReserveIdempotency(ctx, "k1", "big", "fp"); err != nil || !ok {
		t.Fatal(ok, err)
	}
	if err := s.CompleteIdempotency(ctx, "k1", "big", 200, "application/json", big); err != nil {
		t.Fatal(err)
	}
	rec, ok, err := s.ReserveIdempotency(ctx, "k1", "big", "fp")
	if err != nil || ok || rec.Status != 200 || rec.Body != nil || rec.Omitted != int64(len(big)) {
		t.Fatalf("big answer: reserved %v, %+v, %v; want a record without body, omitted %d", ok, rec, err, len(big))
	}

	answer := bytes.Repeat([]byte("y"), MaxIdempotencyBody)
	n := MaxIdempotencyBytesPerKey/MaxIdempotencyBody + 500
	if testing.Short() {
		n = MaxIdempotencyBytesPerKey/MaxIdempotencyBody + 50
	}
	start := time.Now()
	for i := range n {
		now = now.Add(time.Millisecond)
		k := fmt.Sprint("key-", i)
		if _, ok, err := s.ReserveIdempotency(ctx, "k1", k, "fp"); err != nil || !ok {
			t.Fatal(ok, err)
		}
		if err := s.CompleteIdempotency(ctx, "k1", k, 200, "application/json", answer); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("%d maximal answers in %v", n, time.Since(start))
	var rows, total int64
	if err := s.db.QueryRowContext(ctx, `SELECT count(*), coalesce(sum(length(body)), 0) FROM idempotency WHERE key_id = 'k1'`).
		Scan(&rows, &total); err != nil {
		t.Fatal(err)
	}
	if total > MaxIdempotencyBytesPerKey {
		t.Errorf("%d bytes of answers kept, want at most %d", total, MaxIdempotencyBytesPerKey)
	}
	if want := int64(MaxIdempotencyBytesPerKey / MaxIdempotencyBody); rows > want || rows < want-16 {
		t.Errorf("%d records, want %d (less at most 16)", rows, want)
	}
	// The newest is there, the oldest gone.
	if rec, ok, _ := s.ReserveIdempotency(ctx, "k1", fmt.Sprint("key-", n-1), "fp"); ok || rec == nil || !bytes.Equal(rec.Body, answer) {
		t.Errorf("the newest answer was not kept")
	}
	if _, ok, _ := s.ReserveIdempotency(ctx, "k1", "key-0", "fp"); !ok {
		t.Errorf("the oldest answer was kept")
	}
	grown := fileSize(t, path)

	// Small answers: the count bound.
	if testing.Short() {
		defer func(n int) { maxIdempotencyPerKey = n }(maxIdempotencyPerKey)
		maxIdempotencyPerKey = 1000
	}
	for i := range maxIdempotencyPerKey + 100 {
		now = now.Add(time.Millisecond)
		k := fmt.Sprint("small-", i)
		if _, ok, err := s.ReserveIdempotency(ctx, "k2", k, "fp"); err != nil || !ok {
			t.Fatal(ok, err)
		}
		if err := s.CompleteIdempotency(ctx, "k2", k, 200, "application/json", []byte(`{}`)); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.db.QueryRowContext(ctx, `SELECT count(*) FROM idempotency WHERE key_id = 'k2'`).Scan(&rows); err != nil {
		t.Fatal(err)
	}
	if rows != int64(maxIdempotencyPerKey) {
		t.Errorf("%d records of k2, want %d", rows, maxIdempotencyPerKey)
	}
	// The usage the triggers keep matches the table.
	var recs, used int64
	if err := s.db.QueryRowContext(ctx, `SELECT records, bytes FROM idempotency_usage WHERE key_id = 'k1'`).Scan(&recs, &used); err != nil {
		t.Fatal(err)
	}
	var wantRecs, wantUsed int64
	if err := s.db.QueryRowContext(ctx, `SELECT count(*), coalesce(sum(length(body)), 0) FROM idempotency WHERE key_id = 'k1'`).
		Scan(&wantRecs, &wantUsed); err != nil {
		t.Fatal(err)
	}
	if recs != wantRecs || used != wantUsed {
		t.Errorf("usage of k1 = %d records, %d bytes; the table has %d, %d", recs, used, wantRecs, wantUsed)
	}

	// A day later everything is pruned, and Compact gives the space back.
	if _, err := s.PruneIdempotency(ctx, now.Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	if err := s.Compact(ctx); err != nil {
		t.Fatal(err)
	}
	if s.Engine() != "sqlite" {
		return // PostgreSQL's autovacuum gives space back on its own time
	}
	after := fileSize(t, path)
	t.Logf("file: %d bytes full, %d after prune and compact", grown, after)
	if after > 4<<20 {
		t.Errorf("file is %d bytes after prune and compact, want under 4 MiB", after)
	}
}
