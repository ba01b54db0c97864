package store

import (
	"slices"
	"testing"
	"time"

	"github.com/emberbox/emberbox/internal/sandbox"
)

// TestCheckpointRows: checkpoints are snapshots listed under their
// sandbox only, summed per key (files not yet removed) for the quota, and
// captures still under way are found for the start's cleanup.
func TestCheckpointRows(t *testing.T) {
	s, _ := openTest(t)
	ctx := t.Context()
	now := time.Date(2026, 12, 7, 1, 0, 0, 0, time.UTC)
	ins := func(id, owner, of, state string, size int64, at time.Duration) {
		t.Helper()
		sn := &sandbox.Snapshot{ID: id, OwnerKeyID: owner, SourceSandboxID: "sbx_1", CheckpointOf: of, Mode: sandbox.SnapshotModeMemory,
			State: state, SizeBytes: size, CreatedAt: now.Add(at)}
		if err := s.InsertSnapshot(ctx, sn); err != nil {
			t.Fatal(err)
		}
	}
	ins("snap_1", "k", "", sandbox.SnapshotReady, 1<<30, 0)
	ins("ckpt_1", "k", "sbx_1", sandbox.SnapshotReady, 3<<30, time.Second)
	ins("ckpt_2", "k", "sbx_1", sandbox.SnapshotCapturing, 0, 2*time.Second)
	ins("ckpt_3", "other", "sbx_9", sandbox.SnapshotReady, 5<<30, 3*time.Second)

	got, err := s.GetSnapshot(ctx, "ckpt_1")
	if err != nil || got.CheckpointOf != "sbx_1" {
		t.Fatalf("GetSnapshot: %+v, %v", got, err)
	}
	ids := func(opts sandbox.SnapshotListOptions) []string {
		t.Helper()
		list, _, err := s.ListSnapshots(ctx, opts)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, sn := range list {
			out = append(out, sn.ID)
		}
		return out
	}
	if got := ids(sandbox.SnapshotListOptions{OwnerKeyID: "k"}); !slices.Equal(got, []string{"snap_1"}) {
		t.Errorf("the key's snapshots: %v, want no checkpoints among them", got)
	}
	if got := ids(sandbox.SnapshotListOptions{OwnerKeyID: "k", CheckpointOf: "sbx_1"}); !slices.Equal(got, []string{"ckpt_2", "ckpt_1"}) {
		t.Errorf("the sandbox's checkpoints: %v, newest first", got)
	}
	// The meter lists both kinds, to charge what they keep.
	if got := ids(sandbox.SnapshotListOptions{State: sandbox.SnapshotReady, AllKinds: true}); !slices.Equal(got, []string{"ckpt_3", "ckpt_1", "snap_1"}) {
		t.Errorf("ready snapshots of all kinds: %v", got)
	}
	if n, err := s.CheckpointBytes(ctx, "k"); err != nil || n != 3<<30 {
		t.Errorf("CheckpointBytes: %d, %v; want %d", n, err, int64(3<<30))
	}
	// A deleted checkpoint counts until its files are removed.
	gone := now
	if _, err := s.UpdateSnapshot(ctx, "ckpt_1", func(sn *sandbox.Snapshot) bool {
		sn.State, sn.DeletedAt = sandbox.SnapshotDeleted, &gone
		return true
	}); err != nil {
		t.Fatal(err)
	}
	if n, _ := s.CheckpointBytes(ctx, "k"); n != 3<<30 {
		t.Errorf("CheckpointBytes of a deleted checkpoint with its files: %d", n)
	}
	if _, err := s.UpdateSnapshot(ctx, "ckpt_1", func(sn *sandbox.Snapshot) bool {
		sn.FilesRemovedAt = &gone
		return true
	}); err != nil {
		t.Fatal(err)
	}
	if n, _ := s.CheckpointBytes(ctx, "k"); n != 0 {
		t.Errorf("CheckpointBytes once the files are removed: %d, want 0", n)
	}
	if got, err := s.CapturingSnapshots(ctx); err != nil || !slices.Equal(got, []string{"ckpt_2"}) {
		t.Errorf("CapturingSnapshots: %v, %v", got, err)
	}

	// A deleted snapshot's files stay while one with files is a
	// difference over it (base_id), and go once that one's are removed.
	ins("ckpt_base", "k", "sbx_1", sandbox.SnapshotReady, 1, 4*time.Second)
	ins("ckpt_delta", "k", "sbx_1", sandbox.SnapshotReady, 1, 5*time.Second)
	setBase := func(sn *sandbox.Snapshot) bool { sn.BaseID = "ckpt_base"; return true }
	if got, err := s.UpdateSnapshot(ctx, "ckpt_delta", setBase); err != nil || got.BaseID != "ckpt_base" {
		t.Fatalf("base_id round trip: %+v, %v", got, err)
	}
	del := func(sn *sandbox.Snapshot) bool { sn.State, sn.DeletedAt = sandbox.SnapshotDeleted, &gone; return true }
	if _, err := s.UpdateSnapshot(ctx, "ckpt_base", del); err != nil {
		t.Fatal(err)
	}
	unused := func() []string {
		t.Helper()
		ids, err := s.UnusedDeletedSnapshots(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return ids
	}
	if slices.Contains(unused(), "ckpt_base") {
		t.Errorf("a base's files are unused while a difference over it has files")
	}
	if _, err := s.UpdateSnapshot(ctx, "ckpt_delta", del); err != nil {
		t.Fatal(err)
	}
	if got := unused(); !slices.Contains(got, "ckpt_delta") || slices.Contains(got, "ckpt_base") {
		t.Errorf("unused with the delta deleted, its files there: %v", got)
	}
	if _, err := s.UpdateSnapshot(ctx, "ckpt_delta", func(sn *sandbox.Snapshot) bool { sn.FilesRemovedAt = &gone; return true }); err != nil {
		t.Fatal(err)
	}
	if got := unused(); !slices.Contains(got, "ckpt_base") {
		t.Errorf("the base's files are kept after the delta's went: %v", got)
	}
}
