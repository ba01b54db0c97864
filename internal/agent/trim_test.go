package agent

import (
	"testing"
	"time"
)

// TestCacheTrimmer: the cache is trimmed once the host has sent no work for
// the set time, once per quiet spell, never while a call is in flight.
func TestCacheTrimmer(t *testing.T) {
	drops := 0
	tr := &cacheTrimmer{after: time.Minute, drop: func() error { drops++; return nil }}
	t0 := time.Unix(1_000_000, 0)
	tr.last.Store(t0.UnixNano())
	if tr.tick(t0.Add(59 * time.Second)) {
		t.Fatal("trimmed before a minute of quiet")
	}
	if !tr.tick(t0.Add(61*time.Second)) || drops != 1 {
		t.Fatalf("not trimmed after a minute of quiet (%d drops)", drops)
	}
	if tr.tick(t0.Add(10*time.Minute)) || drops != 1 {
		t.Fatalf("trimmed again in the same quiet spell (%d drops)", drops)
	}
	// A long call: no trim while it runs, however long.
	tr.begin()
	if tr.tick(t0.Add(time.Hour)) {
		t.Fatal("trimmed with a call in flight")
	}
	end := t0.Add(time.Hour)
	tr.end(end)
	if tr.tick(end.Add(30 * time.Second)) {
		t.Fatal("trimmed 30 s after the call ended")
	}
	if !tr.tick(end.Add(2*time.Minute)) || drops != 2 {
		t.Fatalf("not trimmed after the next quiet minute (%d drops)", drops)
	}
	if working("info") || !working("exec") {
		t.Error("the host's info calls must not count as work, and execs must")
	}
}
