package sandbox

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io/fs"
	"log/slog"
	"path/filepath"
	"syscall"
	"time"

	"github.com/emberbox/emberbox/internal/admission"
	"github.com/emberbox/emberbox/internal/metering"
	"github.com/emberbox/emberbox/internal/pricing"
	"github.com/emberbox/emberbox/internal/vmm"
)

// Metering (docs/ARCHITECTURE.md "Metering"). A sandbox is charged from
// the moment its guest is ready (or woken) until its VM has ended or been
// paused: boot and restore are free. Its VMM's CPU comes from the host
// kernel's accounting (vmm.Machine.Usage), so the guest cannot change it.
// The store keeps, per sandbox, the counters the last settle ended at
// (its open interval), and every settle moves them in the same transaction
// as it adds the usage: a crash or restart neither loses an interval whose
// counters still exist nor counts one twice.

// Meter charges sandboxes for what they use and answers the usage
// queries. It observes the manager's transitions: the manager tells it
// when a charge begins (vmRunning), when the guest is about to go
// (guestClosing), when a VM has ended or been paused (vmEnded) and when a
// kept disk stops being kept (accrueKept); between them it reads the
// running sandboxes on its own clock (Run).
type Meter struct {
	host     meterHost
	files    sandboxFiles
	store    MeterStore
	records  Store
	rates    pricing.Rates
	interval time.Duration // 0: DefaultMeterInterval
	ledger   *admission.Ledger
	log      *slog.Logger
	ctx      context.Context // ends when the manager closes
}

// meterHost is what the meter reads of the manager: its records as an
// owner sees them, its live VMs, its clock.
type meterHost interface {
	Get(ctx context.Context, owner, id string) (*Sandbox, error)
	instances() []*instance
	now() time.Time
}

func newMeter(m *Manager) *Meter {
	return &Meter{host: m, store: m.cfg.Meter, records: m.cfg.Store, rates: m.cfg.Rates,
		interval: m.cfg.MeterInterval, ledger: m.cfg.Admission, log: m.log, ctx: m.ctx, files: m.files}
}

// DefaultMeterInterval is how often running sandboxes are read when the
// configuration names no interval.
const DefaultMeterInterval = 15 * time.Second

// meterPointsKept is how long each settled interval is kept for a
// sandbox's metrics; the hourly usage rows are kept for good.
const meterPointsKept = 24 * time.Hour

// MeterStore is what metering needs from durable storage.
type MeterStore interface {
	BeginMeter(ctx context.Context, id, owner string, r metering.Reading) error
	SettleMeter(ctx context.Context, id, owner string, shape metering.Shape, r metering.Reading, final bool) (bool, error)
	DropMeter(ctx context.Context, id string) error
	OldestOpenMeter(ctx context.Context) (time.Time, bool, error)
	AccrueStorage(ctx context.Context, id, kind, owner string, bytes int64, since, now time.Time) error
	EachUsageRow(ctx context.Context, q metering.Query, fn func(metering.Row) error) error
	MeterPoints(ctx context.Context, id string, from, to time.Time) ([]metering.Point, error)
	PruneMeterPoints(ctx context.Context, before time.Time) (int64, error)
}

// vmKey names the VM process of mach: the CPU count of one VM only
// continues that VM's.
func vmKey(mach vmm.Machine) string {
	h := sha256.Sum256(mach.Record())
	return hex.EncodeToString(h[:8])
}

// reading reads in's counters now: the VMM's from the host, the guest's
// busy time as last reported, the egress gate's totals.
func (mt *Meter) reading(in *instance, mach vmm.Machine) (metering.Reading, bool, error) {
	u, err := mach.Usage()
	if err != nil {
		return metering.Reading{}, false, err
	}
	r := metering.Reading{At: mt.host.now(), VM: vmKey(mach), CPUNs: int64(u.CPU), RSSBytes: u.RSSBytes,
		GuestCPUNs: in.guestCPU.Load()}
	if !u.Final && u.RSSBytes > 0 && mt.ledger != nil {
		// Admission on measured use charges the VM by this reading.
		mt.ledger.Measured(in.id, u.RSSBytes>>20)
	}
	r.EgressBytes, r.IngressBytes = in.traffic()
	return r, u.Final, nil
}

// traffic is what the sandbox's egress gate has carried in this run: the
// gate's counters while it is open, the totals it closed with after.
func (in *instance) traffic() (out, in_ int64) {
	in.mu.Lock()
	g := in.gate
	in.mu.Unlock()
	if g != nil {
		c := g.Counters()
		return c.BytesOut, c.BytesIn
	}
	return in.egressOut.Load(), in.egressIn.Load()
}

// vmRunning opens the sandbox's metering interval at its VM's counters
// now, as its watch begins; a reattached server keeps the interval the VM
// already has.
func (mt *Meter) vmRunning(in *instance, mach vmm.Machine, sb *Sandbox) {
	mt.refreshGuestCPU(in)
	r, _, err := mt.reading(in, mach)
	if err == nil {
		err = mt.store.BeginMeter(context.Background(), in.id, sb.OwnerKeyID, r)
	}
	if err != nil {
		mt.log.Error("opening the meter", "sandbox_id", in.id, "err", err)
	}
}

// vmEnded charges the sandbox's usage up to the final counters of its
// VM, which has ended or been paused, and closes the interval.
func (mt *Meter) vmEnded(in *instance, mach vmm.Machine) { mt.settle(in, mach, true) }

// settle charges the sandbox's usage up to its VM's counters now; with
// final (its VM has ended or been paused) it closes the interval.
func (mt *Meter) settle(in *instance, mach vmm.Machine, final bool) {
	if mach == nil {
		return
	}
	sb, err := mt.records.GetSandbox(context.Background(), in.id)
	if err != nil {
		mt.log.Error("settling the meter", "sandbox_id", in.id, "err", err)
		return
	}
	r, ended, err := mt.reading(in, mach)
	if err == nil {
		_, err = mt.store.SettleMeter(context.Background(), in.id, sb.OwnerKeyID,
			metering.Shape{VCPU: sb.VCPU, MemoryMiB: sb.MemoryMiB}, r, final || ended)
	}
	if err != nil {
		mt.log.Error("settling the meter", "sandbox_id", in.id, "final", final, "err", err)
	}
}

// guestCPUWait bounds one read of the guest's busy time: long enough for a
// guest on a loaded host, short enough not to hold a stop for long.
const guestCPUWait = 5 * time.Second

// guestClosing takes the guest's last word on its busy time before its
// connection closes (a stop or a pause).
func (mt *Meter) guestClosing(in *instance) { mt.refreshGuestCPU(in) }

// refreshGuestCPU asks the guest for its busy time. It is the guest's own
// claim: never negative, never charged.
func (mt *Meter) refreshGuestCPU(in *instance) {
	c := in.guest()
	if c == nil {
		return
	}
	ctx, cancel := context.WithTimeout(mt.ctx, guestCPUWait)
	defer cancel()
	info, err := c.Info(ctx)
	if err != nil {
		return
	}
	if info.CPUBusyMs > 0 && info.CPUBusyMs < 1<<40 {
		in.guestCPU.Store(info.CPUBusyMs * int64(time.Millisecond))
	}
	if info.OOMKills >= 0 && info.OOMKills < 1<<40 {
		mt.oomKills(in, info.OOMKills)
	}
}

// oomKills records an out_of_memory event when the guest's count of OOM
// kills has risen since its last reading: a program in the guest used
// more memory than the sandbox has, and the guest's kernel ended it (the
// VM and the host are untouched). The first reading of an instance (as
// its VM starts, wakes or is reattached) is the baseline; the count is
// the guest's claim, so it only ever names a sandbox's own trouble.
func (mt *Meter) oomKills(in *instance, total int64) {
	prev := in.oomSeen.Swap(total + 1)
	if prev == 0 || total+1 <= prev {
		return
	}
	kills := total + 1 - prev
	data := map[string]any{"kills": kills, "total": total}
	if sb, err := mt.records.GetSandbox(context.Background(), in.id); err == nil {
		data["memoryMiB"] = sb.MemoryMiB
	}
	msg := fmt.Sprintf("the guest ran out of memory: its kernel ended %d process(es)", kills)
	if err := mt.records.AppendEvent(context.Background(), in.id, "out_of_memory", msg, data); err != nil {
		mt.log.Warn("recording event", "sandbox_id", in.id, "err", err)
	}
	mt.log.Info("guest out of memory", "sandbox_id", in.id, "kills", kills)
}

// Run reads every running sandbox each interval until ctx ends, and
// charges the kept disks of paused and stopped sandboxes.
func (mt *Meter) Run(ctx context.Context) {
	t := time.NewTicker(mt.every())
	defer t.Stop()
	disks := time.NewTicker(storageInterval)
	defer disks.Stop()
	prune := time.NewTicker(time.Hour)
	defer prune.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-prune.C:
			if _, err := mt.store.PruneMeterPoints(ctx, mt.host.now().Add(-meterPointsKept)); err != nil {
				mt.log.Warn("pruning metrics", "err", err)
			}
		case <-disks.C:
			mt.chargeStorage(ctx)
		case <-t.C:
			mt.settleLive()
		}
	}
}

// storageInterval is how often kept disks are charged: they change
// slowly, and each is a walk of its directory.
const storageInterval = 5 * time.Minute

func (mt *Meter) every() time.Duration {
	if mt.interval > 0 {
		return mt.interval
	}
	return DefaultMeterInterval
}

// SettleAll settles every running sandbox's usage so far and charges kept
// disks up to now.
func (mt *Meter) SettleAll(ctx context.Context) {
	mt.settleLive()
	mt.chargeStorage(ctx)
}

// settleLive settles every running sandbox's usage so far.
func (mt *Meter) settleLive() {
	for _, in := range mt.host.instances() {
		mach := in.vm()
		if mach == nil || in.ctx.Err() != nil {
			continue // booting, or being stopped or paused: that path settles
		}
		mt.refreshGuestCPU(in)
		mt.settle(in, mach, false)
	}
}

// chargeStorage charges the disks paused and stopped sandboxes keep, and
// the snapshots', from when they were kept until now.
func (mt *Meter) chargeStorage(ctx context.Context) {
	now := mt.host.now()
	opts := ListOptions{AllOwners: true, States: []State{StatePaused, StateStopped}, IncludeStopped: true, Limit: 100, Local: true}
	for {
		page, next, err := mt.records.ListSandboxes(ctx, opts)
		if err != nil {
			mt.log.Warn("listing kept disks", "err", err)
			return
		}
		for _, sb := range page {
			mt.accrueKept(ctx, sb, now)
		}
		if next == "" {
			break
		}
		opts.Cursor = next
	}
	snaps, err := mt.liveSnapshots(ctx)
	if err != nil {
		mt.log.Warn("listing snapshots", "err", err)
		return
	}
	for _, sn := range snaps {
		if err := mt.store.AccrueStorage(ctx, sn.ID, metering.KindSnapshot, sn.OwnerKeyID, sn.SizeBytes, sn.CreatedAt, now); err != nil {
			mt.log.Warn("charging a snapshot", "snapshot_id", sn.ID, "err", err)
		}
	}
}

// accrueKept charges the disk a paused or stopped sandbox keeps, from when
// it was kept (or last charged) until now. It is also called as the disk
// stops being kept (a wake, a restart, a delete, the retention, a move),
// so the time since the last periodic charge is not lost.
func (mt *Meter) accrueKept(ctx context.Context, sb *Sandbox, now time.Time) {
	since := sb.EndedAt
	if sb.State == StatePaused {
		since = sb.PausedAt
	}
	if (sb.State != StatePaused && sb.State != StateStopped) || since == nil || sb.DiskRemovedAt != nil {
		return
	}
	if err := mt.store.AccrueStorage(ctx, sb.ID, metering.KindSandbox, sb.OwnerKeyID, allocated(mt.files.dir(sb.ID)), *since, now); err != nil {
		mt.log.Warn("charging a kept disk", "sandbox_id", sb.ID, "err", err)
	}
}

// allocated is the disk space the files under dir take on the host: what
// a kept disk really costs, holes excluded.
func allocated(dir string) int64 {
	var n int64
	_ = filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return nil
		}
		if fi, err := d.Info(); err == nil {
			if st, ok := fi.Sys().(*syscall.Stat_t); ok {
				n += st.Blocks * 512
			}
		}
		return nil
	})
	return n
}

// liveSnapshots lists every snapshot that keeps files: the ready ones,
// checkpoints included (charged as snapshots are).
func (mt *Meter) liveSnapshots(ctx context.Context) ([]*Snapshot, error) {
	ss, ok := mt.records.(SnapshotStore)
	if !ok {
		return nil, nil // a store without snapshots keeps none
	}
	var out []*Snapshot
	opts := SnapshotListOptions{State: SnapshotReady, Limit: 100, AllKinds: true}
	for {
		page, next, err := ss.ListSnapshots(ctx, opts)
		if err != nil {
			return out, err
		}
		out = append(out, page...)
		if next == "" {
			return out, nil
		}
		opts.Cursor = next
	}
}
