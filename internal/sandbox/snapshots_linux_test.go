package sandbox_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/emberbox/emberbox/internal/agentproto"
	"github.com/emberbox/emberbox/internal/errdefs"
	"github.com/emberbox/emberbox/internal/sandbox"
)

func (e *env) snapDir(id string) string { return filepath.Join(e.dir, "snapshots", id) }

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

func TestSnapshotAndCopies(t *testing.T) {
	e := newEnv(t)
	m := e.manager()
	ctx := context.Background()
	s := spec()
	s.VCPU, s.MemoryMiB = 1, 2048
	src := running(t, m, s)
	sn, err := m.Snapshots.Snapshot(ctx, "k", src.ID, sandbox.SnapshotSpec{Name: "base", Labels: map[string]string{"a": "b"}})
	if err != nil {
		t.Fatal(err)
	}
	if sn.State != sandbox.SnapshotReady || sn.Mode != sandbox.SnapshotModeMemory || sn.SourceSandboxID != src.ID ||
		sn.VCPU != 1 || sn.MemoryMiB != 2048 || sn.RetentionDays != sandbox.DefaultSnapshotRetentionDays ||
		!sn.ExpiresAt.Equal(e.clock.Now().Add(7*24*time.Hour)) || !exists(e.snapDir(sn.ID)) {
		t.Fatalf("snapshot %+v", sn)
	}
	// Snapshots belong to their key.
	if _, err := m.Snapshots.GetSnapshot(ctx, "other", sn.ID); !errdefs.IsNotFound(err) {
		t.Errorf("another key's Get: %v, want not found", err)
	}
	if _, err := m.Snapshots.Snapshot(ctx, "other", src.ID, sandbox.SnapshotSpec{}); !errdefs.IsNotFound(err) {
		t.Errorf("another key's snapshot of the sandbox: %v, want not found", err)
	}
	if list, _, err := m.Snapshots.ListSnapshots(ctx, sandbox.SnapshotListOptions{OwnerKeyID: "other"}); err != nil || len(list) != 0 {
		t.Errorf("another key's list: %v, %v", list, err)
	}
	if _, err := m.Create(ctx, "other", sandbox.CreateSpec{SnapshotID: sn.ID, OnLeaseEnd: "stop"}); !errdefs.IsNotFound(err) {
		t.Errorf("another key's copy: %v, want not found", err)
	}
	if list, _, err := m.Snapshots.ListSnapshots(ctx, sandbox.SnapshotListOptions{OwnerKeyID: "k", SourceSandboxID: src.ID}); err != nil || len(list) != 1 {
		t.Errorf("list: %v, %v", list, err)
	}
	// The source runs on.
	if got, _ := m.Get(ctx, "k", src.ID); got.State != sandbox.StateRunning {
		t.Errorf("source is %s after the snapshot", got.State)
	}

	resumes := e.drv.Resumes()
	cp, err := m.Create(ctx, "k", sandbox.CreateSpec{SnapshotID: sn.ID, OnLeaseEnd: "stop", TimeoutSeconds: 60})
	if err != nil {
		t.Fatal(err)
	}
	cp = waitState(t, m, "k", cp.ID, sandbox.StateRunning)
	if cp.SnapshotID != sn.ID || cp.VCPU != 1 || cp.MemoryMiB != 2048 || e.drv.Resumes() != resumes+1 {
		t.Errorf("copy %+v (resumes %d → %d)", cp, resumes, e.drv.Resumes())
	}
	if _, err := exec(ctx, m, "k", cp.ID, agentproto.ExecRequest{Argv: []string{"true"}}); err != nil {
		t.Errorf("exec in a copy: %v", err)
	}

	// A disk snapshot's copy boots from its disk.
	disk, err := m.Snapshots.Snapshot(ctx, "k", src.ID, sandbox.SnapshotSpec{Mode: sandbox.SnapshotModeDisk, RetentionDays: 2})
	if err != nil || disk.State != sandbox.SnapshotReady {
		t.Fatalf("disk snapshot: %+v, %v", disk, err)
	}
	starts := e.drv.Starts()
	dc, err := m.Create(ctx, "k", sandbox.CreateSpec{SnapshotID: disk.ID, OnLeaseEnd: "stop"})
	if err != nil {
		t.Fatal(err)
	}
	waitState(t, m, "k", dc.ID, sandbox.StateRunning)
	if e.drv.Starts() != starts+1 {
		t.Errorf("a disk snapshot's copy did not boot")
	}

	// Update, extend, and expiry by the retention loop.
	name := "renamed"
	if _, err := m.Snapshots.UpdateSnapshot(ctx, "k", sn.ID, sandbox.SnapshotUpdate{Name: &name, IfLabels: map[string]string{"x": "y"}}); errdefs.Code(err) != "labels_changed" {
		t.Errorf("update with stale ifLabels: %v, want labels_changed", err)
	}
	if u, err := m.Snapshots.UpdateSnapshot(ctx, "k", sn.ID, sandbox.SnapshotUpdate{Name: &name, IfLabels: map[string]string{"a": "b"}}); err != nil || u.Name != name {
		t.Errorf("update: %+v, %v", u, err)
	}
	if _, err := m.Snapshots.ExtendSnapshot(ctx, "k", disk.ID, 30); err != nil {
		t.Fatal(err)
	}
	e.clock.Advance(8 * 24 * time.Hour)
	if got := m.Snapshots.ExpireSnapshots(ctx); len(got) != 1 || got[0] != sn.ID {
		t.Fatalf("expired %v, want only %s (the other was extended)", got, sn.ID)
	}
	if _, err := m.Snapshots.GetSnapshot(ctx, "k", sn.ID); !errdefs.IsNotFound(err) {
		t.Errorf("an expired snapshot: %v, want not found", err)
	}
	// Its copy still runs on its files.
	if !exists(e.snapDir(sn.ID)) {
		t.Error("the files of an expired snapshot went while a copy uses them")
	}
	if _, err := m.Delete(ctx, "k", cp.ID); err != nil {
		t.Fatal(err)
	}
	if exists(e.snapDir(sn.ID)) {
		t.Error("the files of a deleted snapshot stayed after its last copy was deleted")
	}
}

func TestSnapshotOfPausedSandboxStaysPaused(t *testing.T) {
	e := newEnv(t)
	m := e.manager()
	ctx := context.Background()
	src := running(t, m, spec())
	pause(t, m, src.ID)
	sn, err := m.Snapshots.Snapshot(ctx, "k", src.ID, sandbox.SnapshotSpec{})
	if err != nil || sn.State != sandbox.SnapshotReady {
		t.Fatalf("snapshot of a paused sandbox: %+v, %v", sn, err)
	}
	waitState(t, m, "k", src.ID, sandbox.StatePaused)
}

func TestForkAndDeleteInUse(t *testing.T) {
	e := newEnv(t)
	m := e.manager()
	ctx := context.Background()
	src := running(t, m, spec())
	copies, err := m.Fork(ctx, "k", src.ID, sandbox.ForkSpec{Count: 3, Name: "kid", Labels: map[string]string{"f": "1"}})
	if err != nil {
		t.Fatal(err)
	}
	if len(copies) != 3 {
		t.Fatalf("%d copies, want 3", len(copies))
	}
	snapID := copies[0].SnapshotID
	for i, c := range copies {
		if c.State != sandbox.StateRunning || c.SnapshotID != snapID || c.Labels["f"] != "1" || c.Name != []string{"kid-1", "kid-2", "kid-3"}[i] {
			t.Errorf("copy %d: %+v", i, c)
		}
		if _, err := exec(ctx, m, "k", c.ID, agentproto.ExecRequest{Argv: []string{"true"}}); err != nil {
			t.Errorf("exec in copy %d: %v", i, err)
		}
	}
	// The fork's snapshot is gone for its owner, but not its files: the
	// copies' disks are built on them.
	if _, err := m.Snapshots.GetSnapshot(ctx, "k", snapID); !errdefs.IsNotFound(err) {
		t.Errorf("the fork's snapshot: %v, want not found (keepSnapshot false)", err)
	}
	for i, c := range copies {
		if !exists(e.snapDir(snapID)) {
			t.Fatalf("snapshot files removed with %d copies left", 3-i)
		}
		if _, err := m.Delete(ctx, "k", c.ID); err != nil {
			t.Fatal(err)
		}
	}
	if exists(e.snapDir(snapID)) {
		t.Error("snapshot files kept after the last copy was deleted")
	}

	// keepSnapshot keeps it; deleting it while a copy lives keeps its files.
	copies, err = m.Fork(ctx, "k", src.ID, sandbox.ForkSpec{Count: 1, KeepSnapshot: true})
	if err != nil {
		t.Fatal(err)
	}
	snapID = copies[0].SnapshotID
	if _, err := m.Snapshots.GetSnapshot(ctx, "k", snapID); err != nil {
		t.Fatalf("kept snapshot: %v", err)
	}
	if err := m.Snapshots.DeleteSnapshot(ctx, "k", snapID); err != nil {
		t.Fatal(err)
	}
	if !exists(e.snapDir(snapID)) {
		t.Error("deleting a snapshot in use removed its files")
	}
	if _, err := m.Delete(ctx, "k", copies[0].ID); err != nil {
		t.Fatal(err)
	}
	if exists(e.snapDir(snapID)) {
		t.Error("files of a deleted snapshot kept after its copy was deleted")
	}
	if _, err := m.Fork(ctx, "k", src.ID, sandbox.ForkSpec{Count: 11}); !errdefs.IsInvalidArgument(err) {
		t.Errorf("fork of 11: %v, want invalid", err)
	}
}
