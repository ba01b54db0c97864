package sandbox

import (
	"context"
	"fmt"
	"os"
	"time"
)

// DefaultStoppedDiskRetention is how long a stopped sandbox's disk is kept
// when Config.StoppedDiskRetention is zero.
const DefaultStoppedDiskRetention = 24 * time.Hour

// retentionTick is how often RunDiskRetention looks for disks to remove.
const retentionTick = time.Minute

// DiskStore is what disk retention needs from the store beyond Store;
// store.Store implements it.
type DiskStore interface {
	// StoppedWithDisks lists the stopped sandboxes that ended before
	// endedBefore and still have their files.
	StoppedWithDisks(ctx context.Context, endedBefore time.Time) ([]string, error)
	// MarkDiskRemoved records a stopped sandbox's files gone; false if it
	// is not stopped or was marked already.
	MarkDiskRemoved(ctx context.Context, id string, at time.Time) (bool, error)
	// KeptDisks counts the stopped sandboxes of owner ("" for all) whose
	// disks are kept, and their disks' MiB.
	KeptDisks(ctx context.Context, owner string) (count int, diskMiB int64, err error)
}

func (rp *Reaper) retention() time.Duration {
	if rp.diskRetention == 0 {
		return DefaultStoppedDiskRetention
	}
	return rp.diskRetention
}

// RunDiskRetention removes the files of stopped sandboxes once they have
// been stopped for the retention (never, if it is negative), deletes
// snapshots whose retention has ended, and (in a cluster) removes the
// files of snapshots another node holds that no copy here uses any more,
// every minute until ctx ends.
func (rp *Reaper) RunDiskRetention(ctx context.Context) {
	t := time.NewTicker(retentionTick)
	defer t.Stop()
	for {
		rp.RemoveStoppedDisks(ctx)
		rp.snapshots.ExpireSnapshots(ctx)
		rp.snapshots.removeAllElsewhere(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// RemoveStoppedDisks removes the files (disk, sockets, console logs) of
// every sandbox stopped for longer than the retention, records it with a
// disk_removed event, and returns their ids. The record stays. The files
// go first and the mark after, so a crash in between only repeats the
// (harmless) removal.
func (rp *Reaper) RemoveStoppedDisks(ctx context.Context) []string {
	ds, ok := rp.records.(DiskStore)
	if !ok || rp.retention() < 0 {
		return nil
	}
	now := rp.host.now()
	ids, err := ds.StoppedWithDisks(ctx, now.Add(-rp.retention()))
	if err != nil {
		rp.log.Error("listing stopped sandboxes' disks", "err", err)
		return nil
	}
	var removed []string
	for _, id := range ids {
		ok, err := rp.removeStoppedDisk(ctx, ds, id, now)
		if err != nil {
			rp.log.Error("recording a stopped sandbox's disk removed", "sandbox_id", id, "err", err)
			continue
		}
		if ok {
			rp.log.Info("removed a stopped sandbox's disk after the retention", "sandbox_id", id)
			rp.host.event(id, "disk_removed", "disk removed after the stopped-disk retention",
				map[string]any{"retentionSeconds": int64(rp.retention().Seconds())})
			removed = append(removed, id)
		}
	}
	return removed
}

// removeStoppedDisk removes the files of a sandbox that is still stopped,
// under its VM lock, so that a restart never boots from a disk being
// removed.
func (rp *Reaper) removeStoppedDisk(ctx context.Context, ds DiskStore, id string, now time.Time) (bool, error) {
	unlock := rp.host.lockOp(id)
	defer unlock()
	sb, err := rp.records.GetSandbox(ctx, id)
	if err != nil || sb.State != StateStopped {
		return false, err // restarted meanwhile
	}
	rp.meter.accrueKept(ctx, sb, now)
	if err := os.RemoveAll(rp.files.dir(id)); err != nil {
		return false, fmt.Errorf("removing the files of sandbox %s: %w", id, err)
	}
	return ds.MarkDiskRemoved(ctx, id, now)
}

// KeptDisks counts owner's stopped sandboxes whose disks are still kept
// (they are removed after the retention), and the MiB those disks may
// hold, for quotas: a kept disk takes host disk like a live one.
func (rp *Reaper) KeptDisks(ctx context.Context, owner string) (count int, diskMiB int64, err error) {
	ds, ok := rp.records.(DiskStore)
	if !ok {
		return 0, 0, nil
	}
	return ds.KeptDisks(ctx, owner)
}
