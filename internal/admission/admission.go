package admission

import (
	"fmt"
	"sync"
	"time"

	"github.com/emberbox/emberbox/internal/errdefs"
)

// Wire codes of refusals.
const (
	// CodeNoCapacity (class conflict, HTTP 409): the host has no room now.
	CodeNoCapacity = "no_capacity"
	// CodeQuotaExceeded (class conflict, HTTP 429): the key has used up
	// its quota.
	CodeQuotaExceeded = "quota_exceeded"
)

// Suggested waits. A boot slot frees within a boot (a few seconds under
// TCG); other resources free when a sandbox ends, which nobody can predict,
// so the wait is one a client can afford to repeat.
const (
	BootRetryAfter     = 2 * time.Second
	ResourceRetryAfter = 10 * time.Second
)

// Resources is what one sandbox is promised.
type Resources struct {
	VCPU      int
	MemoryMiB int64
	DiskMiB   int64
}

// Claim is one sandbox's or volume's entry in the ledger.
type Claim struct {
	ID    string // the sandbox's or volume's id; a ledger holds at most one claim per id
	Owner string // the API key id whose quota it counts against
	Resources
	// Booting holds a boot slot until Booted or Release.
	Booting bool
	// Volume marks a volume's claim: disk alone (DiskMiB, its full size,
	// as a sandbox's sparse file grows to it while guests write), counted
	// against the volume quotas and the key's disk quota, never as a
	// sandbox.
	Volume bool

	// measured is set by the VM's first reading (Measured), residentMiB
	// holds the newest; pending is what the ledger expects the sandbox to
	// take beyond what the host already shows (Config.Measured).
	measured    bool
	residentMiB int64
	pending     int64
}

// Capacity is what the host may promise in all. A zero field is no limit.
type Capacity struct {
	VCPU      int
	MemoryMiB int64 // after the host reserve and the commitment ratio
	Boots     int   // sandboxes booting at once
}

// Quota is what one key may hold at once. A zero field is no limit.
type Quota struct {
	Sandboxes int
	VCPU      int
	MemoryMiB int64
	DiskMiB   int64 // sandboxes' disks and volumes together
	Boots     int
	Volumes   int   // volumes not deleted
	VolumeMiB int64 // their sizes
}

// Config configures a Ledger. The zero value admits everything.
type Config struct {
	Capacity Capacity
	// VMOverheadMiB is charged to the host's memory per sandbox on top of
	// its own memory: the VMM's code cache, device model and page tables.
	// It is not charged to quotas, which speak of what callers asked for.
	VMOverheadMiB int64
	Quota         Quota

	// DiskFreeMiB reports the free space of the filesystem the disks grow
	// on; nil skips the disk check. A sandbox is admitted only if the
	// space left after every live sandbox's disk has grown to its full
	// size is at least DiskReserveMiB.
	DiskFreeMiB    func() (int64, error)
	DiskReserveMiB int64
	// DiskOvercommit, above 1, promises that many MiB of disk per MiB
	// free: sandboxes' disks are thin overlays that grow only as they are
	// written, and a guest whose disk cannot grow meets I/O errors, so
	// this is the operator's bet on how little they write. 0 means 1.
	DiskOvercommit float64
	// MemAvailableMiB reports the memory the host could give now (Linux
	// MemAvailable); nil skips the check. A sandbox is admitted only if at
	// least MemReserveMiB would be left after it, whatever else runs on
	// the host.
	MemAvailableMiB func() (int64, error)
	MemReserveMiB   int64

	// Measured admits on what sandboxes use rather than on what they
	// could use (nil: on their nominal size, the strict model). See
	// MeasuredConfig.
	Measured *MeasuredConfig
}

// MeasuredConfig configures admission on measured use. The host's
// available memory already shows what every VM holds; what it cannot show
// yet is what each may take next. So each running sandbox is expected to
// take, beyond what the host shows:
//
//   - before its VM's first reading (booting, waking, restored): StartMiB,
//     at most its whole size (memory and VM overhead);
//   - after it: HeadroomMiB, at most what its size leaves above its
//     resident memory (its cgroup stops it there).
//
// A paused sandbox holds no memory. A sandbox is admitted only if the
// host's available memory, less everything expected and its own
// expectation, keeps MemReserveMiB. Memory pressure (the sandbox manager
// pausing the longest idle) covers a sandbox that grows faster than its
// headroom.
type MeasuredConfig struct {
	StartMiB    int64
	HeadroomMiB int64
}

// Measured-model defaults: a copy of the template settles at about
// 120 MiB resident (DESIGN.md), a cold boot below StartMiB; an idle
// sandbox's resident memory moves little between readings.
const (
	DefaultStartMiB    = 512
	DefaultHeadroomMiB = 64
)

// Usage is what is held, in all or by one key.
type Usage struct {
	Sandboxes int
	VCPU      int
	MemoryMiB int64 // as asked for, without the overhead
	DiskMiB   int64 // volumes included
	Boots     int
	Volumes   int
	VolumeMiB int64
}

func (u *Usage) add(c *Claim, sign int) {
	if c.Volume {
		u.Volumes += sign
		u.VolumeMiB += int64(sign) * c.DiskMiB
		u.DiskMiB += int64(sign) * c.DiskMiB
		return
	}
	u.Sandboxes += sign
	u.VCPU += sign * c.VCPU
	u.MemoryMiB += int64(sign) * c.MemoryMiB
	u.DiskMiB += int64(sign) * c.DiskMiB
	if c.Booting {
		u.Boots += sign
	}
}

// Ledger is the record of promises. It is safe for concurrent use.
type Ledger struct {
	cfg Config

	mu      sync.Mutex
	claims  map[string]*Claim
	total   Usage
	byOwner map[string]*Usage
	pending int64 // Σ Claim.pending (the measured model)
	vms     int   // claims that hold memory: sandboxes not paused
}

// New returns an empty ledger.
func New(cfg Config) *Ledger {
	return &Ledger{cfg: cfg, claims: map[string]*Claim{}, byOwner: map[string]*Usage{}}
}

// Reserve admits c and holds it, or refuses it with a coded error:
// no_capacity (errdefs.ErrConflict) when the host has no room,
// quota_exceeded (errdefs.ErrConflict) when c's owner is at its quota, both
// with a RetryAfter. Holding a claim for an id already held is a
// programming error, refused with errdefs.ErrInternal.
func (l *Ledger) Reserve(c Claim) error {
	diskFree, memAvail, err := l.readHost()
	if err != nil {
		return err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := l.claims[c.ID]; ok {
		return errdefs.New(errdefs.ErrInternal, "internal", "%s already holds resources", c.ID)
	}
	own := l.byOwner[c.Owner]
	if own == nil {
		own = &Usage{}
	}
	if err := l.checkQuota(own, &c); err != nil {
		return err
	}
	if err := l.checkHost(&c, diskFree, memAvail); err != nil {
		return err
	}
	l.holdLocked(&c)
	return nil
}

// readHost reads the host's free disk and available memory (-1: not
// checked). It runs before the lock: the figures are a moment old in any
// case, and nothing else waits on a slow read.
func (l *Ledger) readHost() (diskFree, memAvail int64, err error) {
	diskFree, memAvail = -1, -1
	if l.cfg.DiskFreeMiB != nil {
		if diskFree, err = l.cfg.DiskFreeMiB(); err != nil {
			return 0, 0, fmt.Errorf("reading the data dir's free space: %w", err)
		}
	}
	if l.cfg.MemAvailableMiB != nil {
		if memAvail, err = l.cfg.MemAvailableMiB(); err != nil {
			return 0, 0, fmt.Errorf("reading the host's available memory: %w", err)
		}
	}
	return diskFree, memAvail, nil
}

// checkQuota refuses c if its owner would pass a quota.
func (l *Ledger) checkQuota(own *Usage, c *Claim) error {
	q := l.cfg.Quota
	checks := []error{overQuota("diskMiB", own.DiskMiB, c.DiskMiB, q.DiskMiB, c.Volume)}
	if c.Volume {
		checks = append(checks,
			overQuota("volumes", int64(own.Volumes), 1, int64(q.Volumes), true),
			overQuota("volumeMiB", own.VolumeMiB, c.DiskMiB, q.VolumeMiB, true))
	} else {
		boot := int64(0)
		if c.Booting {
			boot = 1
		}
		checks = append(checks,
			overQuota("sandboxes", int64(own.Sandboxes), 1, int64(q.Sandboxes), false),
			overQuota("vcpu", int64(own.VCPU), int64(c.VCPU), int64(q.VCPU), false),
			overQuota("memoryMiB", own.MemoryMiB, c.MemoryMiB, q.MemoryMiB, false),
			overQuota("boots", int64(own.Boots), boot, int64(q.Boots), false))
	}
	for _, err := range checks {
		if err != nil {
			return err
		}
	}
	return nil
}

// overQuota refuses asked more of quota what when used+asked passes limit
// (0: no limit), naming the quota and the flag that raises it.
func overQuota(what string, used, asked, limit int64, volume bool) error {
	if limit <= 0 || used+asked <= limit {
		return nil
	}
	retry := ResourceRetryAfter
	if what == "boots" {
		retry = BootRetryAfter
	}
	n := quotaNames[what]
	free := "Stop or delete sandboxes of this key"
	if volume {
		free = "Delete volumes of this key"
	}
	e := errdefs.New(errdefs.ErrConflict, CodeQuotaExceeded, "this key's quota of %d%s %s is reached (%d in use, %d asked)",
		limit, n.unit, n.noun, used, asked).
		WithHint(free + ", or ask the operator to raise " + n.flag + ".")
	e.Details = map[string]any{"quota": what, "limit": limit, "used": used, "requested": asked}
	e.RetryAfter = retry
	return e
}

// quotaNames say a quota in words and name the flag of `emberbox serve`
// that sets it.
var quotaNames = map[string]struct{ noun, unit, flag string }{
	"sandboxes": {"live sandboxes", "", "--quota-sandboxes"},
	"vcpu":      {"vCPUs", "", "--quota-vcpus"},
	"memoryMiB": {"of memory", " MiB", "--quota-memory-mib"},
	"diskMiB":   {"of disk (sandboxes' disks and volumes)", " MiB", "--quota-disk-mib"},
	"boots":     {"sandboxes booting at once", "", "--quota-boots"},
	"volumes":   {"volumes", "", "--quota-volumes"},
	"volumeMiB": {"of volumes", " MiB", "--quota-volume-mib"},
}

// checkHost refuses c if the host has no room for it. The message names
// the resource but not the host's figures, which are the operator's
// business.
func (l *Ledger) checkHost(c *Claim, diskFree, memAvail int64) error {
	if c.Volume {
		return l.checkVolumeHost(c, diskFree)
	}
	capa, t := l.cfg.Capacity, &l.total
	full := ""
	retry := ResourceRetryAfter
	overhead := l.cfg.VMOverheadMiB
	switch {
	case c.Booting && capa.Boots > 0 && t.Boots+1 > capa.Boots:
		full, retry = "boots", BootRetryAfter
	case capa.VCPU > 0 && t.VCPU+c.VCPU > capa.VCPU:
		full = "vcpu"
	case capa.MemoryMiB > 0 && t.MemoryMiB+int64(l.vms)*overhead+c.MemoryMiB+overhead > capa.MemoryMiB:
		full = "memoryMiB"
	case memAvail >= 0 && memAvail-l.memoryAsked(c) < l.cfg.MemReserveMiB:
		full = "memoryMiB"
	case diskFree >= 0 && diskFree-l.promisedDisk(t.DiskMiB+c.DiskMiB) < l.cfg.DiskReserveMiB:
		// Conservative: a live disk's space already in use is counted
		// both as used and as promised.
		full = "diskMiB"
	}
	if full == "" {
		return nil
	}
	e := errdefs.New(errdefs.ErrConflict, CodeNoCapacity, "the server has no room for this sandbox now (%s)", hostNoun[full]).
		WithHint("Retry later, or ask for a smaller sandbox.")
	e.Details = map[string]any{"resource": full}
	e.RetryAfter = retry
	return e
}

// memoryAsked is the memory that admitting c would take from what the
// host has available now: its whole size in the strict model; in the
// measured model, what c is expected to take plus what every running
// sandbox is expected to take beyond what the host already shows.
func (l *Ledger) memoryAsked(c *Claim) int64 {
	if l.cfg.Measured == nil {
		return c.MemoryMiB + l.cfg.VMOverheadMiB
	}
	return l.pending + l.expect(c)
}

// expect is what claim c is expected to take beyond what the host shows
// (MeasuredConfig).
func (l *Ledger) expect(c *Claim) int64 {
	if c.Volume || c.MemoryMiB == 0 || l.cfg.Measured == nil {
		return 0
	}
	whole := c.MemoryMiB + l.cfg.VMOverheadMiB
	if !c.measured {
		return min(l.cfg.Measured.StartMiB, whole)
	}
	return max(0, min(l.cfg.Measured.HeadroomMiB, whole-c.residentMiB))
}

// Measured records the resident memory of sandbox id's VM at a reading,
// which moves what the ledger expects it to take from its start estimate
// to its headroom. A sandbox not held, or holding no memory, is ignored.
func (l *Ledger) Measured(id string, residentMiB int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	c := l.claims[id]
	if c == nil || c.Volume || c.MemoryMiB == 0 {
		return
	}
	c.measured, c.residentMiB = true, max(0, residentMiB)
	l.pending -= c.pending
	c.pending = l.expect(c)
	l.pending += c.pending
}

// checkVolumeHost refuses volume claim c if the data dir's filesystem,
// after every promised disk (sandboxes' and volumes') has grown to its
// size, would keep less than the reserve.
func (l *Ledger) checkVolumeHost(c *Claim, diskFree int64) error {
	if diskFree < 0 || diskFree-l.promisedDisk(l.total.DiskMiB+c.DiskMiB) >= l.cfg.DiskReserveMiB {
		return nil
	}
	e := errdefs.New(errdefs.ErrConflict, CodeNoCapacity, "the server has no room for a volume of %d MiB now (disk space)", c.DiskMiB).
		WithHint("Ask for a smaller volume, delete volumes or sandboxes you no longer need, or retry later.")
	e.Details = map[string]any{"resource": "diskMiB"}
	e.RetryAfter = ResourceRetryAfter
	return e
}

// promisedDisk is the space mib of promised disks is counted as.
func (l *Ledger) promisedDisk(mib int64) int64 {
	if r := l.cfg.DiskOvercommit; r > 1 {
		return int64(float64(mib) / r)
	}
	return mib
}

var hostNoun = map[string]string{
	"boots": "too many sandboxes are booting", "vcpu": "vCPUs",
	"memoryMiB": "memory", "diskMiB": "disk space",
}

// Restore holds c without checking it: a sandbox the store says is live
// holds what it was promised, whatever the host looks like now. Restoring
// an id already held replaces its claim.
func (l *Ledger) Restore(c Claim) {
	l.mu.Lock()
	defer l.mu.Unlock()
	c.measured = false
	if old, ok := l.claims[c.ID]; ok {
		if old.MemoryMiB != 0 && c.MemoryMiB != 0 {
			c.measured, c.residentMiB = old.measured, old.residentMiB // the same VM, still running
		}
		l.dropLocked(old)
	}
	l.holdLocked(&c)
}

// Replace admits c in place of what sandbox c.ID holds now, checking c as
// if the old claim were given back first, and refuses it as Reserve does,
// leaving the old claim held. A paused sandbox that wakes grows from its
// disk alone to its whole shape this way, with no moment in which another
// create could take its disk.
func (l *Ledger) Replace(c Claim) error {
	diskFree, memAvail, err := l.readHost()
	if err != nil {
		return err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	old := l.claims[c.ID]
	if old != nil {
		l.dropLocked(old)
	}
	own := l.byOwner[c.Owner]
	if own == nil {
		own = &Usage{}
	}
	err = l.checkQuota(own, &c)
	if err == nil {
		err = l.checkHost(&c, diskFree, memAvail)
	}
	if err != nil {
		if old != nil {
			l.holdLocked(old)
		}
		return err
	}
	l.holdLocked(&c)
	return nil
}

// Booted gives back the boot slot of sandbox id, if it holds one.
func (l *Ledger) Booted(id string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	c := l.claims[id]
	if c == nil || !c.Booting {
		return
	}
	l.total.Boots--
	l.byOwner[c.Owner].Boots--
	c.Booting = false
}

// Release gives back everything sandbox id holds and reports whether it
// held anything: whoever calls it first releases, later calls do nothing.
func (l *Ledger) Release(id string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	c := l.claims[id]
	if c == nil {
		return false
	}
	l.dropLocked(c)
	return true
}

// holdLocked holds c. Reserve and Replace pass it unmeasured: its VM has
// yet to start.
func (l *Ledger) holdLocked(c *Claim) {
	c.pending = l.expect(c)
	l.pending += c.pending
	if holdsVM(c) {
		l.vms++
	}
	l.claims[c.ID] = c
	l.total.add(c, 1)
	own := l.byOwner[c.Owner]
	if own == nil {
		own = &Usage{}
		l.byOwner[c.Owner] = own
	}
	own.add(c, 1)
}

func (l *Ledger) dropLocked(c *Claim) {
	l.pending -= c.pending
	if holdsVM(c) {
		l.vms--
	}
	delete(l.claims, c.ID)
	l.total.add(c, -1)
	own := l.byOwner[c.Owner]
	own.add(c, -1)
	if own.Sandboxes == 0 && own.Volumes == 0 {
		delete(l.byOwner, c.Owner) // the map stays as small as the live set
	}
}

// holdsVM reports whether c is a sandbox with a VM (not paused), whose
// VM overhead the host carries.
func holdsVM(c *Claim) bool { return !c.Volume && c.MemoryMiB > 0 }

// Quota is what one key may hold at once.
func (l *Ledger) Quota() Quota { return l.cfg.Quota }

// Total returns what is held in all.
func (l *Ledger) Total() Usage {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.total
}

// Owner returns what one key holds.
func (l *Ledger) Owner(owner string) Usage {
	l.mu.Lock()
	defer l.mu.Unlock()
	if u := l.byOwner[owner]; u != nil {
		return *u
	}
	return Usage{}
}

// Expected returns what the running sandboxes are expected to take beyond
// what the host already shows (MiB; 0 in the strict model).
func (l *Ledger) Expected() int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.pending
}

// Held reports whether sandbox id holds a claim.
func (l *Ledger) Held(id string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	_, ok := l.claims[id]
	return ok
}
