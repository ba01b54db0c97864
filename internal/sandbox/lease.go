package sandbox

import (
	"context"
	"log/slog"
	"slices"
	"time"
)

// Reaper ends, pauses and removes what has run out: leases, idle time,
// host memory (pressure.go), the data dir's space (diskpressure.go), the
// retention of stopped disks and of snapshots (retention.go). It drives
// the manager's transitions through reaperHost; Manager.Reaper returns the
// manager's.
type Reaper struct {
	host      reaperHost
	files     sandboxFiles
	meter     *Meter
	snapshots *Snapshots
	records   Store
	observer  Observer
	// memoryFloorMiB, memAvailable, diskFloorMiB, diskFree and
	// diskRetention are Config's MemoryFloorMiB, MemAvailable,
	// DiskFloorMiB, DiskFree and StoppedDiskRetention.
	memoryFloorMiB int64
	memAvailable   func() (int64, error)
	diskFloorMiB   int64
	diskFree       func() (int64, error)
	disk           diskPressure
	diskRetention  time.Duration
	// warned holds, for each sandbox told its lease is ending, the end it
	// was told of (warnLeases).
	warned map[string]time.Time
	log    *slog.Logger
	ctx    context.Context // ends when the manager closes
}

// reaperHost is what the reaper needs of the manager: its transitions,
// a sandbox's VM lock and instance, events and the clock.
type reaperHost interface {
	stop(ctx context.Context, id, reason string, wait bool) (*Sandbox, error)
	pause(ctx context.Context, id, why string) (*Sandbox, error)
	delete(ctx context.Context, id, reason string) (*Sandbox, error)
	spawn(f func()) bool
	lockOp(id string) (unlock func())
	liveInstance(id string) *instance
	event(id, typ, msg string, data map[string]any)
	now() time.Time
}

func newReaper(m *Manager) *Reaper {
	return &Reaper{host: m, meter: m.Meter, snapshots: m.Snapshots, records: m.cfg.Store, observer: m.cfg.Observer,
		memoryFloorMiB: m.cfg.MemoryFloorMiB, memAvailable: m.cfg.MemAvailable,
		diskFloorMiB: m.cfg.DiskFloorMiB, diskFree: m.cfg.DiskFree, diskRetention: m.cfg.StoppedDiskRetention,
		log: m.log, ctx: m.ctx, files: m.files}
}

// leaseWarning is how long before a lease ends the sandbox's owner is
// told (event lease_ending, sandbox.lease_ending in the feed), for leases
// longer than twice that.
const leaseWarning = time.Minute

// leaseTick is how often the lease clock looks for expired leases; a lease
// ends at most this late.
const leaseTick = time.Second

// Run enforces leases until ctx ends: a sandbox whose lease has ended is
// stopped or deleted as its onLeaseEnd says, with stopReason lease_expired.
func (rp *Reaper) Run(ctx context.Context) error {
	t := time.NewTicker(leaseTick)
	defer t.Stop()
	for {
		rp.ExpireLeases(ctx)
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// ExpireLeases ends every live sandbox whose lease is over at m's clock,
// and pauses every one idle for its idlePauseSeconds, and returns their
// ids.
func (rp *Reaper) ExpireLeases(ctx context.Context) []string {
	live, err := rp.records.ListLive(ctx)
	if err != nil {
		rp.log.Error("listing live sandboxes", "err", err)
		return nil
	}
	now := rp.host.now()
	var ended []string
	rp.rankForOOM(live)
	if paused := rp.relieveDiskPressure(ctx, live); len(paused) > 0 {
		ended = append(ended, paused...)
		live = slices.DeleteFunc(live, func(sb *Sandbox) bool { return slices.Contains(paused, sb.ID) })
	}
	if id := rp.relievePressure(ctx, live); id != "" {
		ended = append(ended, id)
	}
	rp.warnLeases(live, now)
	for _, sb := range live {
		if sb.State != StateRunning {
			continue
		}
		if sb.ExpiresAt == nil || sb.ExpiresAt.After(now) {
			if rp.idle(sb, now) {
				rp.log.Info("idle; pausing", "sandbox_id", sb.ID, "idle_pause_seconds", sb.IdlePauseSeconds)
				ended = append(ended, sb.ID)
				if _, err := rp.host.pause(ctx, sb.ID, PauseIdle); err != nil {
					rp.log.Error("pausing an idle sandbox", "sandbox_id", sb.ID, "err", err)
				}
			}
			continue
		}
		rp.log.Info("lease expired", "sandbox_id", sb.ID, "on_lease_end", sb.OnLeaseEnd)
		rp.observer.LeaseExpired(sb.OnLeaseEnd)
		ended = append(ended, sb.ID)
		if sb.OnLeaseEnd == LeaseEndDelete {
			rp.host.spawn(func() {
				if _, err := rp.host.delete(rp.ctx, sb.ID, ReasonLeaseExpired); err != nil {
					rp.log.Error("deleting at lease end", "sandbox_id", sb.ID, "err", err)
				}
			})
			continue
		}
		if sb.OnLeaseEnd == LeaseEndPause {
			if _, err := rp.host.pause(ctx, sb.ID, PauseLeaseEnd); err != nil {
				rp.log.Error("pausing at lease end", "sandbox_id", sb.ID, "err", err)
			}
			continue
		}
		if _, err := rp.host.stop(ctx, sb.ID, ReasonLeaseExpired, false); err != nil {
			rp.log.Error("stopping at lease end", "sandbox_id", sb.ID, "err", err)
		}
	}
	return ended
}

// warnLeases records lease_ending for each running sandbox whose lease
// ends within leaseWarning, once per end: an extended lease is told again
// when its new end nears. What was told is kept in memory, so a restart
// of the server may tell it twice.
func (rp *Reaper) warnLeases(live []*Sandbox, now time.Time) {
	next := make(map[string]time.Time, len(rp.warned))
	for _, sb := range live {
		if sb.State != StateRunning || sb.ExpiresAt == nil || sb.TimeoutSeconds <= 2*int(leaseWarning/time.Second) {
			continue
		}
		left := sb.ExpiresAt.Sub(now)
		if left <= 0 || left > leaseWarning {
			continue
		}
		next[sb.ID] = *sb.ExpiresAt
		if at, ok := rp.warned[sb.ID]; ok && at.Equal(*sb.ExpiresAt) {
			continue
		}
		rp.host.event(sb.ID, "lease_ending", "the lease ends in "+left.Round(time.Second).String(), map[string]any{
			"expiresAt": sb.ExpiresAt.UTC().Format(time.RFC3339Nano), "onLeaseEnd": sb.OnLeaseEnd,
			"secondsLeft": int(left.Seconds())})
	}
	rp.warned = next
}

// idle reports whether a running sandbox has had no API activity for its
// idlePauseSeconds: no call into its guest in flight, and none ended
// within that time. A persistent sandbox is never idle; activity is kept
// in memory, so after a restart of the server the clock starts again.
func (rp *Reaper) idle(sb *Sandbox, now time.Time) bool {
	if sb.Persistent || sb.IdlePauseSeconds <= 0 {
		return false
	}
	in := rp.host.liveInstance(sb.ID)
	if in == nil {
		return false
	}
	if in.working() {
		return false
	}
	last := in.active.Load()
	if last == 0 {
		in.touch(now) // reattached: counted from now
		return false
	}
	return now.Sub(time.Unix(0, last)) >= time.Duration(sb.IdlePauseSeconds)*time.Second
}
