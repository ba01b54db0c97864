package admission

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/emberbox/emberbox/internal/errdefs"
)

func claim(id, owner string, vcpu int, mem, disk int64) Claim {
	return Claim{ID: id, Owner: owner, Resources: Resources{VCPU: vcpu, MemoryMiB: mem, DiskMiB: disk}, Booting: true}
}

// refusal checks that err is a coded conflict with code and a wait.
func refusal(t *testing.T, err error, code, what string) {
	t.Helper()
	var ce *errdefs.CodedError
	if !errors.As(err, &ce) || ce.Code != code || !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("got %v, want %s", err, code)
	}
	if ce.RetryAfter <= 0 {
		t.Errorf("%s has no RetryAfter", code)
	}
	key := "resource"
	if code == CodeQuotaExceeded {
		key = "quota"
	}
	if got := ce.Details[key]; got != what {
		t.Errorf("%s: details.%s = %v, want %s", code, key, got, what)
	}
}

func TestHostCapacity(t *testing.T) {
	tests := []struct {
		name string
		cfg  Config
		held []Claim
		next Claim
		want string // resource refused, "" admitted
	}{
		{name: "empty ledger admits", cfg: Config{Capacity: Capacity{VCPU: 2, MemoryMiB: 1024, Boots: 1}},
			next: claim("a", "k", 2, 1024, 10)},
		{name: "vcpu", cfg: Config{Capacity: Capacity{VCPU: 3}},
			held: []Claim{claim("a", "k", 2, 1, 1)}, next: claim("b", "k", 2, 1, 1), want: "vcpu"},
		{name: "memory", cfg: Config{Capacity: Capacity{MemoryMiB: 2048}},
			held: []Claim{claim("a", "k", 1, 1024, 1)}, next: claim("b", "k", 1, 1025, 1), want: "memoryMiB"},
		{name: "memory fits exactly", cfg: Config{Capacity: Capacity{MemoryMiB: 2048}},
			held: []Claim{claim("a", "k", 1, 1024, 1)}, next: claim("b", "k", 1, 1024, 1)},
		{name: "overhead per vm", cfg: Config{Capacity: Capacity{MemoryMiB: 2048}, VMOverheadMiB: 1},
			held: []Claim{claim("a", "k", 1, 1024, 1)}, next: claim("b", "k", 1, 1024, 1), want: "memoryMiB"},
		{name: "boots", cfg: Config{Capacity: Capacity{Boots: 1}},
			held: []Claim{claim("a", "k", 1, 1, 1)}, next: claim("b", "k", 1, 1, 1), want: "boots"},
		{name: "host memory available", cfg: Config{MemAvailableMiB: func() (int64, error) { return 3000, nil }, MemReserveMiB: 2048},
			next: claim("a", "k", 1, 1024, 1), want: "memoryMiB"},
		{name: "host memory available fits", cfg: Config{MemAvailableMiB: func() (int64, error) { return 3072, nil }, MemReserveMiB: 2048},
			next: claim("a", "k", 1, 1024, 1)},
		{name: "disk counts live disks at full size", cfg: Config{DiskFreeMiB: func() (int64, error) { return 10000, nil }, DiskReserveMiB: 2000},
			held: []Claim{claim("a", "k", 1, 1, 4000)}, next: claim("b", "k", 1, 1, 4001), want: "diskMiB"},
		{name: "disk fits", cfg: Config{DiskFreeMiB: func() (int64, error) { return 10000, nil }, DiskReserveMiB: 2000},
			held: []Claim{claim("a", "k", 1, 1, 4000)}, next: claim("b", "k", 1, 1, 4000)},
		{name: "disk overcommitted fits", cfg: Config{DiskFreeMiB: func() (int64, error) { return 10000, nil }, DiskReserveMiB: 2000, DiskOvercommit: 4},
			held: []Claim{claim("a", "k", 1, 1, 16000)}, next: claim("b", "k", 1, 1, 16000)},
		{name: "disk overcommitted full", cfg: Config{DiskFreeMiB: func() (int64, error) { return 10000, nil }, DiskReserveMiB: 2000, DiskOvercommit: 4},
			held: []Claim{claim("a", "k", 1, 1, 16000)}, next: claim("b", "k", 1, 1, 16004), want: "diskMiB"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l := New(tt.cfg)
			for _, c := range tt.held {
				l.Restore(c)
			}
			err := l.Reserve(tt.next)
			if tt.want == "" {
				if err != nil {
					t.Fatalf("Reserve: %v", err)
				}
				return
			}
			refusal(t, err, CodeNoCapacity, tt.want)
			if l.Held(tt.next.ID) {
				t.Error("a refused claim is held")
			}
		})
	}
}

func TestQuota(t *testing.T) {
	q := Quota{Sandboxes: 2, VCPU: 3, MemoryMiB: 3000, DiskMiB: 9000, Boots: 1}
	tests := []struct {
		name string
		held []Claim
		next Claim
		want string
	}{
		{name: "sandboxes", held: []Claim{claim("a", "k", 1, 1, 1), claim("b", "k", 1, 1, 1)}, next: claim("c", "k", 1, 1, 1), want: "sandboxes"},
		{name: "vcpu", held: []Claim{claim("a", "k", 2, 1, 1)}, next: claim("b", "k", 2, 1, 1), want: "vcpu"},
		{name: "memory", held: []Claim{claim("a", "k", 1, 2000, 1)}, next: claim("b", "k", 1, 1001, 1), want: "memoryMiB"},
		{name: "disk", held: []Claim{claim("a", "k", 1, 1, 5000)}, next: claim("b", "k", 1, 1, 4001), want: "diskMiB"},
		{name: "boots", held: []Claim{claim("a", "k", 1, 1, 1)}, next: claim("b", "k", 1, 1, 1), want: "boots"},
		{name: "another key is not counted", held: []Claim{claim("a", "other", 3, 3000, 9000), claim("b", "other", 1, 1, 1)}, next: claim("c", "k", 3, 3000, 9000)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l := New(Config{Quota: q})
			for _, c := range tt.held {
				l.Restore(c)
			}
			err := l.Reserve(tt.next)
			if tt.want == "" {
				if err != nil {
					t.Fatalf("Reserve: %v", err)
				}
				return
			}
			refusal(t, err, CodeQuotaExceeded, tt.want)
		})
	}
}

func TestBootedFreesOnlyTheBootSlot(t *testing.T) {
	l := New(Config{Capacity: Capacity{Boots: 1, VCPU: 4}, Quota: Quota{Boots: 1}})
	if err := l.Reserve(claim("a", "k", 2, 1, 1)); err != nil {
		t.Fatal(err)
	}
	refusal(t, l.Reserve(claim("b", "k", 2, 1, 1)), CodeQuotaExceeded, "boots")
	l.Booted("a")
	l.Booted("a") // twice is once
	if err := l.Reserve(claim("b", "k", 2, 1, 1)); err != nil {
		t.Fatalf("after a booted: %v", err)
	}
	if got := l.Total(); got.Boots != 1 || got.VCPU != 4 || got.Sandboxes != 2 {
		t.Errorf("total %+v, want 1 boot, 4 vCPUs, 2 sandboxes", got)
	}
	refusal(t, l.Reserve(Claim{ID: "c", Owner: "k2", Resources: Resources{VCPU: 1}}), CodeNoCapacity, "vcpu")
}

func TestReleaseExactlyOnce(t *testing.T) {
	l := New(Config{Capacity: Capacity{VCPU: 4}})
	l.Restore(claim("a", "k", 2, 100, 10))
	l.Restore(claim("b", "k", 2, 100, 10))
	var released atomic.Int32
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			if l.Release("a") {
				released.Add(1)
			}
		})
	}
	wg.Wait()
	if n := released.Load(); n != 1 {
		t.Fatalf("Release reported true %d times, want once", n)
	}
	if got := l.Total(); got != (Usage{Sandboxes: 1, VCPU: 2, MemoryMiB: 100, DiskMiB: 10, Boots: 1}) {
		t.Errorf("total after release %+v", got)
	}
	if l.Release("never") {
		t.Error("releasing an unknown id reported true")
	}
	if err := l.Reserve(claim("b", "k", 1, 1, 1)); !errors.Is(err, errdefs.ErrInternal) {
		t.Errorf("reserving a held id: %v, want internal", err)
	}
}

// TestConcurrentReserveRelease races many reservers against a small
// capacity: the ledger must never hold more than it may, and must end
// empty once everything is released.
func TestConcurrentReserveRelease(t *testing.T) {
	const capVCPU = 5
	l := New(Config{Capacity: Capacity{VCPU: capVCPU, MemoryMiB: 5 * 1024, Boots: 3}, Quota: Quota{Sandboxes: 4}})
	var held, peak atomic.Int32
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Go(func() {
			for i := range 200 {
				id := fmt.Sprintf("w%d-%d", w, i)
				err := l.Reserve(claim(id, fmt.Sprintf("key%d", w%3), 1, 1024, 1))
				if err != nil {
					if c := errdefs.Code(err); c != CodeNoCapacity && c != CodeQuotaExceeded {
						t.Errorf("Reserve: %v", err)
					}
					continue
				}
				n := held.Add(1)
				for {
					p := peak.Load()
					if n <= p || peak.CompareAndSwap(p, n) {
						break
					}
				}
				if u := l.Total(); u.VCPU > capVCPU || u.Boots > 3 {
					t.Errorf("ledger holds %+v, over capacity", u)
				}
				if i%2 == 0 {
					l.Booted(id)
				}
				held.Add(-1)
				if !l.Release(id) {
					t.Errorf("release of %s found nothing", id)
				}
			}
		})
	}
	wg.Wait()
	if got := l.Total(); got != (Usage{}) {
		t.Errorf("total after all releases %+v, want zero", got)
	}
	if n := len(l.byOwner); n != 0 {
		t.Errorf("%d owners left in the ledger, want none", n)
	}
	if peak.Load() == 0 {
		t.Error("no reservation ever succeeded")
	}
}

// TestRebuild: a new ledger restored from the live records of the last
// one holds the same, booting sandboxes included, and refuses alike.
func TestRebuild(t *testing.T) {
	cfg := Config{Capacity: Capacity{VCPU: 4, MemoryMiB: 4096, Boots: 2}, Quota: Quota{Sandboxes: 3}}
	before := New(cfg)
	live := []Claim{claim("a", "k", 2, 1024, 100), claim("b", "k", 1, 1024, 100), claim("c", "j", 1, 1024, 100)}
	for _, c := range live {
		if err := before.Reserve(c); err != nil {
			t.Fatal(err)
		}
		if c.ID == "a" {
			before.Booted("a")
		}
	}
	// Restart: the store's live records come back, each booting or not.
	after := New(cfg)
	for _, c := range live {
		c.Booting = c.ID != "a"
		after.Restore(c)
	}
	if b, a := before.Total(), after.Total(); a != b {
		t.Errorf("rebuilt total %+v, want %+v", a, b)
	}
	if b, a := before.Owner("k"), after.Owner("k"); a != b {
		t.Errorf("rebuilt usage of k %+v, want %+v", a, b)
	}
	refusal(t, after.Reserve(claim("d", "x", 1, 1, 1)), CodeNoCapacity, "boots")
	after.Restore(claim("a", "k", 2, 1024, 100)) // restoring again replaces
	if got := after.Total(); got.Sandboxes != 3 || got.VCPU != 4 {
		t.Errorf("restoring a held id twice: total %+v", got)
	}
}

func TestReplaceKeepsOldClaimWhenRefused(t *testing.T) {
	l := New(Config{Capacity: Capacity{VCPU: 4, MemoryMiB: 8192}})
	paused := Claim{ID: "a", Owner: "k", Resources: Resources{DiskMiB: 4096}}
	l.Restore(paused)
	if err := l.Reserve(Claim{ID: "b", Owner: "k", Resources: Resources{VCPU: 4, MemoryMiB: 4096}}); err != nil {
		t.Fatal(err)
	}
	whole := Claim{ID: "a", Owner: "k", Booting: true, Resources: Resources{VCPU: 2, MemoryMiB: 4096, DiskMiB: 4096}}
	if err := l.Replace(whole); errdefs.Code(err) != CodeNoCapacity {
		t.Fatalf("Replace with no vCPU left: %v, want no_capacity", err)
	}
	if got := l.Total(); got.VCPU != 4 || got.DiskMiB != 4096 || got.Sandboxes != 2 {
		t.Errorf("after a refused Replace the ledger holds %+v, want the old claims", got)
	}
	l.Release("b")
	if err := l.Replace(whole); err != nil {
		t.Fatalf("Replace with room: %v", err)
	}
	if got := l.Total(); got.VCPU != 2 || got.MemoryMiB != 4096 || got.DiskMiB != 4096 || got.Sandboxes != 1 || got.Boots != 1 {
		t.Errorf("after Replace the ledger holds %+v, want the whole claim once", got)
	}
}

func volume(id, owner string, mib int64) Claim {
	return Claim{ID: id, Owner: owner, Resources: Resources{DiskMiB: mib}, Volume: true}
}

// TestVolumeClaims: a volume holds disk alone, against the host's free
// space (with the sandboxes' disks), the key's disk quota and the volume
// quotas, and is never a sandbox (no slot, no memory overhead).
func TestVolumeClaims(t *testing.T) {
	free := func() (int64, error) { return 10000, nil }
	tests := []struct {
		name string
		cfg  Config
		held []Claim
		next Claim
		code string // "" admitted
		what string
	}{
		{name: "fits beside a sandbox's disk", cfg: Config{DiskFreeMiB: free, DiskReserveMiB: 2000},
			held: []Claim{claim("s", "k", 1, 1, 4000)}, next: volume("v", "k", 4000)},
		{name: "host disk counts sandboxes and volumes", cfg: Config{DiskFreeMiB: free, DiskReserveMiB: 2000},
			held: []Claim{claim("s", "k", 1, 1, 4000), volume("v", "j", 3000)}, next: volume("w", "k", 1001),
			code: CodeNoCapacity, what: "diskMiB"},
		{name: "overcommit applies to volumes", cfg: Config{DiskFreeMiB: free, DiskReserveMiB: 2000, DiskOvercommit: 4},
			held: []Claim{volume("v", "j", 16000)}, next: volume("w", "k", 16000)},
		{name: "a 1 TiB volume on a small disk", cfg: Config{DiskFreeMiB: free, DiskReserveMiB: 2000},
			next: volume("v", "k", 1<<20), code: CodeNoCapacity, what: "diskMiB"},
		{name: "no memory overhead, no sandbox slot", cfg: Config{Capacity: Capacity{MemoryMiB: 100, VCPU: 1, Boots: 1}, VMOverheadMiB: 512, Quota: Quota{Sandboxes: 1}},
			held: []Claim{claim("s", "k", 1, 1, 1)}, next: volume("v", "k", 64)},
		{name: "volume count", cfg: Config{Quota: Quota{Volumes: 2}},
			held: []Claim{volume("a", "k", 64), volume("b", "k", 64), volume("c", "j", 64)}, next: volume("d", "k", 64),
			code: CodeQuotaExceeded, what: "volumes"},
		{name: "volume bytes", cfg: Config{Quota: Quota{VolumeMiB: 1000}},
			held: []Claim{volume("a", "k", 600)}, next: volume("b", "k", 401), code: CodeQuotaExceeded, what: "volumeMiB"},
		{name: "disk quota counts the key's sandboxes", cfg: Config{Quota: Quota{DiskMiB: 5000}},
			held: []Claim{claim("s", "k", 1, 1, 4000)}, next: volume("v", "k", 1001), code: CodeQuotaExceeded, what: "diskMiB"},
		{name: "a sandbox meets the disk its key's volumes hold", cfg: Config{Quota: Quota{DiskMiB: 5000}},
			held: []Claim{volume("v", "k", 4000)}, next: claim("s", "k", 1, 1, 1001), code: CodeQuotaExceeded, what: "diskMiB"},
		{name: "volumes do not count as sandboxes", cfg: Config{Quota: Quota{Sandboxes: 1}},
			held: []Claim{volume("v", "k", 64), volume("w", "k", 64)}, next: claim("s", "k", 1, 1, 1)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l := New(tt.cfg)
			for _, c := range tt.held {
				l.Restore(c)
			}
			err := l.Reserve(tt.next)
			if tt.code == "" {
				if err != nil {
					t.Fatalf("Reserve: %v", err)
				}
				return
			}
			refusal(t, err, tt.code, tt.what)
		})
	}
}

// TestVolumeQuotaMessage: the refusal names the quota and the flag that
// raises it.
func TestVolumeQuotaMessage(t *testing.T) {
	l := New(Config{Quota: Quota{VolumeMiB: 100}})
	var ce *errdefs.CodedError
	if !errors.As(l.Reserve(volume("v", "k", 128)), &ce) {
		t.Fatal("a volume over the quota was admitted")
	}
	if want := "this key's quota of 100 MiB of volumes is reached (0 in use, 128 asked)"; ce.Message != want {
		t.Errorf("message %q, want %q", ce.Message, want)
	}
	if want := "Delete volumes of this key, or ask the operator to raise --quota-volume-mib."; ce.Hint != want {
		t.Errorf("hint %q, want %q", ce.Hint, want)
	}
}

// TestVolumeResizeAndRelease: Replace grows a volume's claim as if the old
// size were given back, refuses over the quota leaving the old size held,
// and Release gives the disk back and forgets the key.
func TestVolumeResizeAndRelease(t *testing.T) {
	l := New(Config{Quota: Quota{VolumeMiB: 1000}})
	if err := l.Reserve(volume("v", "k", 600)); err != nil {
		t.Fatal(err)
	}
	if err := l.Replace(volume("v", "k", 1000)); err != nil {
		t.Fatalf("growing within the quota: %v", err)
	}
	refusal(t, l.Replace(volume("v", "k", 1001)), CodeQuotaExceeded, "volumeMiB")
	if got := l.Owner("k"); got.VolumeMiB != 1000 || got.DiskMiB != 1000 || got.Volumes != 1 || got.Sandboxes != 0 {
		t.Errorf("after a refused grow k holds %+v", got)
	}
	if !l.Release("v") {
		t.Fatal("Release of a held volume released nothing")
	}
	if got := l.Owner("k"); got != (Usage{}) {
		t.Errorf("after Release k holds %+v", got)
	}
	if got := l.Total(); got != (Usage{}) {
		t.Errorf("after Release the ledger holds %+v", got)
	}
}
