package admission

import (
	"sync/atomic"
	"testing"
)

// host is a fake host whose available memory a test moves as VMs would.
type host struct{ avail atomic.Int64 }

func (h *host) MemAvailableMiB() (int64, error) { return h.avail.Load(), nil }

func measuredLedger(h *host) *Ledger {
	return New(Config{
		VMOverheadMiB:   512,
		MemAvailableMiB: h.MemAvailableMiB, MemReserveMiB: 2048,
		Measured: &MeasuredConfig{StartMiB: 512, HeadroomMiB: 64},
	})
}

// A default sandbox (4 GiB) is charged what it uses: a host with 23 GiB
// available, where the strict model stops at four, takes a hundred copies
// that each settle at 120 MiB, and refuses the next with no_capacity once
// what they use and may still take leaves only the reserve.
func TestMeasuredAdmitsWhatFits(t *testing.T) {
	h := &host{}
	h.avail.Store(23 << 10)
	l := measuredLedger(h)
	n := 0
	for ; ; n++ {
		id := string(rune('a'+n/26)) + string(rune('a'+n%26))
		if err := l.Reserve(claim(id, "k", 2, 4096, 1)); err != nil {
			refusal(t, err, CodeNoCapacity, "memoryMiB")
			break
		}
		// The VM starts and settles: the host shows its memory, and the
		// ledger's reading moves it from its start estimate to headroom.
		h.avail.Add(-120)
		l.Booted(id)
		l.Measured(id, 120)
	}
	// 23552 − 2048 reserve = 21504 MiB for n × (120 used + 64 headroom)
	// and the next one's 512 start estimate.
	if want := (21504-512)/(120+64) + 1; n != want {
		t.Errorf("admitted %d sandboxes, want %d", n, want)
	}
	if n < 100 {
		t.Errorf("admitted %d, fewer than the hundred a 24 GiB host must hold", n)
	}
}

// Until its first reading a sandbox is expected to take its start
// estimate (at most its whole size); after it, its headroom, or what its
// size leaves above what it holds; paused, nothing.
func TestMeasuredExpectations(t *testing.T) {
	h := &host{}
	h.avail.Store(100 << 10)
	l := measuredLedger(h)
	l.cfg.Measured.StartMiB = 1024
	pending := func() int64 {
		l.mu.Lock()
		defer l.mu.Unlock()
		return l.pending
	}
	steps := []struct {
		name string
		do   func()
		want int64
	}{
		{"created, unmeasured", func() { mustReserve(t, l, claim("a", "k", 2, 4096, 1)) }, 1024},
		{"small sandbox: its whole size", func() { mustReserve(t, l, claim("b", "k", 1, 128, 1)) }, 1024 + 128 + 512},
		{"measured: headroom", func() { l.Measured("a", 300) }, 64 + 640},
		{"near its ceiling: what is left", func() { l.Measured("b", 600) }, 64 + 40},
		{"at its ceiling: nothing", func() { l.Measured("b", 700) }, 64},
		{"restored while running: keeps its reading", func() { l.Restore(claim("a", "k", 2, 4096, 1)) }, 64},
		{"paused: nothing", func() { l.Restore(Claim{ID: "a", Owner: "k", Resources: Resources{DiskMiB: 1}}) }, 0},
		{"reading of a paused sandbox: ignored", func() { l.Measured("a", 300) }, 0},
		{"woken: unmeasured again", func() { mustReplace(t, l, claim("a", "k", 2, 4096, 1)) }, 1024},
		{"released", func() { l.Release("a"); l.Release("b") }, 0},
		{"reading of a released sandbox: ignored", func() { l.Measured("a", 300) }, 0},
	}
	for _, s := range steps {
		s.do()
		if got := pending(); got != s.want {
			t.Fatalf("%s: expected %d MiB in all, want %d", s.name, got, s.want)
		}
	}
}

// What the host shows counts whatever holds it: memory taken by other
// programs, or by a sandbox growing between readings, refuses a create
// the ledger alone would admit, and it is admitted again once freed.
func TestMeasuredFollowsTheHost(t *testing.T) {
	h := &host{}
	h.avail.Store(4096)
	l := measuredLedger(h)
	mustReserve(t, l, claim("a", "k", 2, 4096, 1)) // 4096 − 512 ≥ 2048
	l.Measured("a", 100)
	h.avail.Add(-1500) // a guest fills its page cache
	refusal(t, l.Reserve(claim("b", "k", 2, 4096, 1)), CodeNoCapacity, "memoryMiB")
	h.avail.Add(1500) // the agent drops it
	mustReserve(t, l, claim("b", "k", 2, 4096, 1))
}

// Paused sandboxes carry no VM overhead against a nominal ceiling, in
// either model.
func TestPausedCarriesNoOverhead(t *testing.T) {
	l := New(Config{Capacity: Capacity{MemoryMiB: 2048}, VMOverheadMiB: 512})
	for _, id := range []string{"p1", "p2", "p3"} {
		l.Restore(Claim{ID: id, Owner: "k", Resources: Resources{DiskMiB: 1}})
	}
	mustReserve(t, l, claim("a", "k", 1, 1536, 1))
}

func mustReserve(t *testing.T, l *Ledger, c Claim) {
	t.Helper()
	if err := l.Reserve(c); err != nil {
		t.Fatalf("Reserve %s: %v", c.ID, err)
	}
}

func mustReplace(t *testing.T, l *Ledger, c Claim) {
	t.Helper()
	if err := l.Replace(c); err != nil {
		t.Fatalf("Replace %s: %v", c.ID, err)
	}
}
