package sandbox

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/emberbox/emberbox/internal/errdefs"
	"github.com/emberbox/emberbox/internal/vmm"
)

// Snapshots on every node of a cluster. A snapshot's files are on the node
// that took it (its record's node). A copy placed on another node (the
// snapshot's node had no room, or spreadFrom kept the copy off it) has
// that node fetch the files over the node channel first: they are staged
// under incoming/, checked and repointed at this node's image by the
// driver (vmm.SnapshotMover.SnapshotMoved, as a moved checkpoint is), and
// put in place as snapshots/<id>. The fetched copy is a cache: the record
// stays the other node's, and the copy is removed here once no sandbox of
// this node is a copy of it (removeElsewhere; a create making a copy pins
// it until the copy is recorded), so a snapshot deleted on its node leaves
// nothing behind here either.

// SnapshotFetcher writes the files of snapshot sn, which another node of
// the cluster holds, into the empty directory dir, named as
// vmm.SnapshotMover.SnapshotFiles names them.
type SnapshotFetcher func(ctx context.Context, sn *Snapshot, dir string) error

// fetchTimeout bounds one fetch of a snapshot's files.
const fetchTimeout = 10 * time.Minute

// ensureLocal makes sure the files of snapshot sn are on this node,
// fetching them from the node that holds them if they are not. Creates
// of one snapshot at once share one fetch.
func (sp *Snapshots) ensureLocal(ctx context.Context, sn *Snapshot) error {
	if sp.fetch == nil {
		return nil
	}
	if _, err := os.Lstat(sp.dir(sn.ID)); err == nil {
		return nil
	}
	sm, ok := sp.driver.(vmm.SnapshotMover)
	if !ok {
		return nil
	}
	if sn.BaseID != "" {
		return errdefs.New(errdefs.ErrConflict, "checkpoint_elsewhere",
			"checkpoint %s is a difference over another and is copied only on its sandbox's node", sn.ID)
	}
	ch := sp.fetching.DoChan(sn.ID, func() (any, error) {
		fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), fetchTimeout)
		defer cancel()
		return nil, sp.fetchSnapshot(fctx, sm, sn)
	})
	select {
	case <-ctx.Done():
		return ctx.Err()
	case res := <-ch:
		if res.Err != nil {
			sp.log.Warn("fetching a snapshot from the node that holds it", "snapshot_id", sn.ID, "err", res.Err)
			e := errdefs.New(errdefs.ErrUnavailable, "snapshot_unavailable",
				"snapshot %s is on another node and could not be copied here: %v", sn.ID, res.Err).
				WithHint("retry; the node that holds the snapshot may be busy or restarting")
			e.RetryAfter = 2 * time.Second
			return e
		}
		return nil
	}
}

// fetchSnapshot fetches sn's files into a staging directory, has the
// driver check them, and puts them in place.
func (sp *Snapshots) fetchSnapshot(ctx context.Context, sm vmm.SnapshotMover, sn *Snapshot) (err error) {
	final := sp.dir(sn.ID)
	if _, err := os.Lstat(final); err == nil {
		return nil // another fetch finished first
	}
	incoming := filepath.Join(sp.dataDir, "incoming")
	if err := os.MkdirAll(incoming, 0o700); err != nil {
		return err
	}
	stage, err := os.MkdirTemp(incoming, sn.ID+".fetch-")
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			_ = os.RemoveAll(stage)
		}
	}()
	start := time.Now()
	if err := sp.fetch(ctx, sn, stage); err != nil {
		return err
	}
	mem := sn.MemoryMiB
	if sn.Mode != SnapshotModeMemory {
		mem = 0 // its disk alone
	}
	spec := vmm.Spec{ID: sn.ID, Dir: stage, Rootfs: sp.files.rootfs(&Sandbox{Rootfs: sn.Rootfs}), MemoryMiB: mem}
	if err := sm.SnapshotMoved(ctx, spec, ""); err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(final), 0o755); err != nil {
		return err
	}
	if err := os.Rename(stage, final); err != nil {
		return err
	}
	sp.log.Info("fetched a snapshot from the node that holds it", "snapshot_id", sn.ID,
		"bytes", sn.SizeBytes, "took", time.Since(start).Round(time.Millisecond))
	return nil
}

// SnapshotFiles names the files of the ready snapshot id on this node, for
// another node that fetches them (vmm.SnapshotMover.SnapshotFiles). A
// checkpoint that is a difference over another is not served: its copies
// are made on its sandbox's node.
func (sp *Snapshots) SnapshotFiles(ctx context.Context, id string) (map[string]string, error) {
	ss, err := sp.store()
	if err != nil {
		return nil, err
	}
	sm, ok := sp.driver.(vmm.SnapshotMover)
	if !ok {
		return nil, errdefs.New(errdefs.ErrUnavailable, "move_unsupported", "the %s driver cannot send snapshots", sp.driver.Name())
	}
	if !strings.HasPrefix(id, "snap_") && !strings.HasPrefix(id, "ckpt_") || strings.ContainsAny(id, "/.") {
		return nil, snapshotNotFound(id)
	}
	sn, err := ss.GetSnapshot(ctx, id)
	if err != nil {
		return nil, err
	}
	if sn.State != SnapshotReady || sn.BaseID != "" {
		return nil, errdefs.New(errdefs.ErrConflict, "snapshot_not_ready", "snapshot %s is %s", id, sn.State)
	}
	return sm.SnapshotFiles(sp.dir(id))
}

// snapshotStoreElsewhere is what the store of a cluster answers about
// snapshots whose files this node has but whose record is another node's.
type snapshotStoreElsewhere interface {
	// SnapshotsElsewhere returns those of ids that another node holds
	// and that no sandbox of this node, not deleted and with its disk,
	// is a copy of.
	SnapshotsElsewhere(ctx context.Context, ids []string) ([]string, error)
}

// pin keeps snapshot id's files here while a create makes a copy of it:
// until the copy is recorded, no sandbox here is a copy of it in the
// store's eyes. unpin ends it.
func (sp *Snapshots) pin(id string) {
	sp.pinMu.Lock()
	defer sp.pinMu.Unlock()
	if sp.pins == nil {
		sp.pins = map[string]int{}
	}
	sp.pins[id]++
}

func (sp *Snapshots) unpin(id string) {
	sp.pinMu.Lock()
	defer sp.pinMu.Unlock()
	if sp.pins[id]--; sp.pins[id] <= 0 {
		delete(sp.pins, id)
	}
}

func (sp *Snapshots) pinned(id string) bool {
	sp.pinMu.Lock()
	defer sp.pinMu.Unlock()
	return sp.pins[id] > 0
}

// removeElsewhere removes this node's files of those of the snapshots ids
// that another node holds and no sandbox here is a copy of (a copy reads
// its snapshot's disk): checkpoints that moved with their sandbox, and
// snapshots fetched for copies that are gone. One a create is making a
// copy of (pinned) stays.
func (sp *Snapshots) removeElsewhere(ctx context.Context, ids []string) int {
	ms, ok := sp.records.(snapshotStoreElsewhere)
	if !ok || len(ids) == 0 {
		return 0
	}
	away, err := ms.SnapshotsElsewhere(ctx, ids)
	if err != nil {
		sp.log.Warn("finding snapshots another node holds", "err", err)
		return 0
	}
	removed := 0
	for _, id := range away {
		if sp.pinned(id) {
			continue
		}
		if err := removeAll(sp.dir(id)); err != nil {
			sp.log.Warn("removing the files of a snapshot another node holds", "snapshot_id", id, "err", err)
			continue
		}
		removed++
	}
	return removed
}

// removeAllElsewhere runs removeElsewhere over every snapshot directory
// here (at start, and every minute). Off a cluster (no fetcher) no
// snapshot is another node's, and the directory is not read.
func (sp *Snapshots) removeAllElsewhere(ctx context.Context) int {
	if sp.fetch == nil {
		return 0
	}
	entries, err := os.ReadDir(filepath.Join(sp.dataDir, "snapshots"))
	if err != nil {
		if !errors.Is(err, os.ErrNotExist) {
			sp.log.Warn("listing snapshot directories", "err", err)
		}
		return 0
	}
	var ids []string
	for _, e := range entries {
		if e.IsDir() && (strings.HasPrefix(e.Name(), "snap_") || strings.HasPrefix(e.Name(), "ckpt_")) {
			ids = append(ids, e.Name())
		}
	}
	return sp.removeElsewhere(ctx, ids)
}
