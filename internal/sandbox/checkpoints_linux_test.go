package sandbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/emberbox/emberbox/internal/errdefs"
	"github.com/emberbox/emberbox/internal/metering"
	"github.com/emberbox/emberbox/internal/sandbox"
)

// TestCheckpoints covers the bookkeeping of checkpoints on the fake
// driver (whose guest keeps its state whatever happens; the real VM's
// state coming back is internal/integration's TestCheckpoints): they are
// the sandbox's alone, the oldest go past the cap, restore resumes the
// same sandbox, branch makes new ones, and they go with the sandbox.
func TestCheckpoints(t *testing.T) {
	e := newEnv(t)
	m := e.managerWith(func(cfg *sandbox.Config) { cfg.Checkpoints.PerSandbox = 3 })
	ctx := context.Background()
	src := running(t, m, spec())

	var ids []string
	for i, label := range []string{"step-1", "step-2", "step-3", "step-4"} {
		e.clock.Advance(time.Second) // listed in the order taken
		cp, err := m.Checkpoints.Checkpoint(ctx, "k", src.ID, label, true)
		if err != nil {
			t.Fatal(err)
		}
		if cp.State != sandbox.SnapshotReady || cp.CheckpointOf != src.ID || cp.Name != label || cp.ExpiresAt != nil ||
			!exists(e.snapDir(cp.ID)) {
			t.Fatalf("checkpoint %d: %+v", i, cp)
		}
		ids = append(ids, cp.ID)
	}
	// The cap of 3 deleted the oldest, files and all.
	list, err := m.Checkpoints.ListCheckpoints(ctx, "k", src.ID)
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 3 || list[0].ID != ids[1] || list[2].ID != ids[3] {
		t.Fatalf("checkpoints after a fourth: %v, want %v oldest first", checkpointIDs(list), ids[1:])
	}
	// The first was whole; the later ones are differences over it, so
	// its files stay, pruned, while theirs do.
	for _, c := range list {
		if c.BaseID != ids[0] {
			t.Errorf("checkpoint %s has base %q, want %s", c.Name, c.BaseID, ids[0])
		}
	}
	if !exists(e.snapDir(ids[0])) {
		t.Errorf("the pruned checkpoint's files are gone while checkpoints over it remain")
	}
	// Checkpoints are not among the key's snapshots, and not another key's.
	if snaps, _, err := m.Snapshots.ListSnapshots(ctx, sandbox.SnapshotListOptions{OwnerKeyID: "k"}); err != nil || len(snaps) != 0 {
		t.Errorf("snapshots listed: %d, %v; want none", len(snaps), err)
	}
	if _, err := m.Checkpoints.ListCheckpoints(ctx, "other", src.ID); !errdefs.IsNotFound(err) {
		t.Errorf("another key's list: %v, want not found", err)
	}
	if _, err := m.Checkpoints.GetCheckpoint(ctx, "k", src.ID, ids[0]); errdefs.Code(err) != "checkpoint_not_found" {
		t.Errorf("a pruned checkpoint: %v, want checkpoint_not_found", err)
	}

	// Restore: the same sandbox resumes from the checkpoint's state.
	resumes := e.drv.Resumes()
	e.clock.Advance(time.Second)
	sb, err := m.Checkpoints.RestoreCheckpoint(ctx, "k", src.ID, ids[1], true)
	if err != nil {
		t.Fatal(err)
	}
	if sb.ID != src.ID || sb.State != sandbox.StateRunning || e.drv.Resumes() != resumes+1 {
		t.Fatalf("restored: %+v (resumes %d → %d)", sb, resumes, e.drv.Resumes())
	}
	// keep took a checkpoint of the present first; the cap still holds.
	list, _ = m.Checkpoints.ListCheckpoints(ctx, "k", src.ID)
	if len(list) != 3 || list[2].Name != "before-restore" {
		t.Errorf("after a kept restore: %v", checkpointIDs(list))
	}
	// A paused sandbox is restored too, and runs after.
	if _, err := m.Pause(ctx, "k", src.ID); err != nil {
		t.Fatal(err)
	}
	waitState(t, m, "k", src.ID, sandbox.StatePaused)
	if sb, err = m.Checkpoints.RestoreCheckpoint(ctx, "k", src.ID, list[0].ID, false); err != nil || sb.State != sandbox.StateRunning {
		t.Fatalf("restore of a paused sandbox: %+v, %v", sb, err)
	}

	// Branch: new sandboxes from the checkpoint.
	branches, err := m.Checkpoints.BranchCheckpoint(ctx, "k", src.ID, list[0].ID, sandbox.ForkSpec{Count: 2, Name: "try"})
	if err != nil {
		t.Fatal(err)
	}
	if len(branches) != 2 || branches[0].SnapshotID != list[0].ID || branches[1].Name != "try-2" {
		t.Fatalf("branches: %+v", branches)
	}

	// Deleting the sandbox deletes its checkpoints; the one its branches
	// were made from keeps its files while they exist.
	if _, err := m.Delete(ctx, "k", src.ID); err != nil {
		t.Fatal(err)
	}
	for _, c := range list {
		if _, err := m.Snapshots.GetSnapshot(ctx, "k", c.ID); !errdefs.IsNotFound(err) {
			t.Errorf("checkpoint %s after its sandbox's delete: %v", c.ID, err)
		}
	}
	if !exists(e.snapDir(list[0].ID)) || exists(e.snapDir(list[1].ID)) {
		t.Errorf("files after the delete: branched-from kept %v, other removed %v", exists(e.snapDir(list[0].ID)), !exists(e.snapDir(list[1].ID)))
	}
	for _, b := range branches {
		if _, err := m.Delete(ctx, "k", b.ID); err != nil {
			t.Fatal(err)
		}
	}
	if exists(e.snapDir(list[0].ID)) || exists(e.snapDir(ids[0])) {
		t.Errorf("the checkpoint's files (or its base's) outlived its last branch")
	}
}

// TestCheckpointQuota: past the key's quota the sandbox's own oldest
// checkpoints make room; with none left to delete, quota_exceeded.
func TestCheckpointQuota(t *testing.T) {
	e := newEnv(t)
	m := e.managerWith(func(cfg *sandbox.Config) { cfg.Checkpoints.QuotaBytes = 1 })
	ctx := context.Background()
	src := running(t, m, spec())
	first, err := m.Checkpoints.Checkpoint(ctx, "k", src.ID, "", true)
	if err != nil {
		t.Fatal(err)
	}
	if first.SizeBytes == 0 {
		t.Skip("the fake driver's checkpoint takes no bytes here; the quota cannot be reached")
	}
	second, err := m.Checkpoints.Checkpoint(ctx, "k", src.ID, "", true)
	if err == nil {
		// It had room only because the first... which cannot be: a single
		// checkpoint already fills a 1-byte quota.
		t.Fatalf("second checkpoint %s taken over the quota", second.ID)
	}
	if errdefs.Code(err) != "quota_exceeded" {
		t.Fatalf("second checkpoint: %v, want quota_exceeded", err)
	}
}

func checkpointIDs(list []*sandbox.Snapshot) []string {
	var ids []string
	for _, sn := range list {
		ids = append(ids, sn.ID+"("+sn.Name+")")
	}
	return ids
}

// TestCheckpointInBackground: without wait a checkpoint answers at once,
// capturing, and is ready soon after; a capture a stop of the server cut
// short is recorded failed at the next start, never left capturing.
func TestCheckpointInBackground(t *testing.T) {
	e := newEnv(t)
	m := e.manager()
	ctx := context.Background()
	src := running(t, m, spec())
	cp, err := m.Checkpoints.Checkpoint(ctx, "k", src.ID, "bg", false)
	if err != nil {
		t.Fatal(err)
	}
	if cp.State != sandbox.SnapshotCapturing {
		t.Fatalf("a checkpoint without wait answered %s, want capturing", cp.State)
	}
	deadline := time.Now().Add(30 * time.Second)
	for cp.State == sandbox.SnapshotCapturing && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
		if cp, err = m.Checkpoints.GetCheckpoint(ctx, "k", src.ID, cp.ID); err != nil {
			t.Fatal(err)
		}
	}
	if cp.State != sandbox.SnapshotReady {
		t.Fatalf("background checkpoint: %s", cp.State)
	}

	cut := &sandbox.Snapshot{ID: "ckpt_cut", OwnerKeyID: "k", SourceSandboxID: src.ID, CheckpointOf: src.ID,
		Mode: sandbox.SnapshotModeMemory, State: sandbox.SnapshotCapturing, CreatedAt: e.clock.Now()}
	if err := e.st.InsertSnapshot(ctx, cut); err != nil {
		t.Fatal(err)
	}
	m.Snapshots.FailInterrupted(ctx)
	got, err := m.Checkpoints.GetCheckpoint(ctx, "k", src.ID, cut.ID)
	if err != nil || got.State != sandbox.SnapshotFailed {
		t.Fatalf("an interrupted capture after the start: %+v, %v; want failed", got, err)
	}
	if _, err := m.Checkpoints.RestoreCheckpoint(ctx, "k", src.ID, cut.ID, false); errdefs.Code(err) != "checkpoint_not_ready" {
		t.Errorf("restoring a failed checkpoint: %v, want checkpoint_not_ready", err)
	}
}

// TestCheckpointsAreMetered: what a checkpoint keeps is charged as a
// snapshot's storage is.
func TestCheckpointsAreMetered(t *testing.T) {
	e := newEnv(t)
	m := e.manager()
	ctx := context.Background()
	src := running(t, m, spec())
	cp, err := m.Checkpoints.Checkpoint(ctx, "k", src.ID, "metered", true)
	if err != nil {
		t.Fatal(err)
	}
	e.clock.Advance(time.Hour)
	m.Meter.SettleAll(ctx)
	rows, err := e.st.UsageRows(ctx, metering.Query{Owner: "k", ResourceIDs: []string{cp.ID}})
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) == 0 || rows[0].Kind != metering.KindSnapshot {
		t.Fatalf("usage of checkpoint %s: %+v, want its storage charged as a snapshot's", cp.ID, rows)
	}
}
