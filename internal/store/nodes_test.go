package store

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/emberbox/emberbox/internal/cluster"
	"github.com/emberbox/emberbox/internal/errdefs"
	"github.com/emberbox/emberbox/internal/sandbox"
)

// Two nodes on one store (two Stores on one database, as a cluster has):
// registration and epochs, what ListNodes adds up, fencing after a node
// is declared lost, a move, and the shared setting the first node decides.
func TestNodesShareOneStore(t *testing.T) {
	dsn := newDSN(t)
	ctx := t.Context()
	open := func() *Store {
		s, err := Open(ctx, dsn)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	}
	a, b := open(), open()
	now := base
	for _, s := range []*Store{a, b} {
		s.now = func() time.Time { return now }
	}
	register := func(s *Store, id string) int64 {
		t.Helper()
		epoch, err := s.RegisterNode(ctx, &cluster.Node{ID: id, Address: id + ":7443", APIURL: "http://" + id,
			MemoryMiB: 4096, OverheadMiB: 64, VCPUs: 4, Accel: "kvm", Images: []string{"sha256:x"}, Version: "t"})
		if err != nil {
			t.Fatal(err)
		}
		s.SetNode(id, epoch)
		return epoch
	}
	if e := register(a, "node-a"); e != 1 {
		t.Fatalf("first epoch %d, want 1", e)
	}
	if e := register(a, "node-a"); e != 2 {
		t.Fatalf("epoch after a restart %d, want 2", e)
	}
	register(b, "node-b")

	sa, sb := newSandbox("sbx_a", "key_1", base), newSandbox("sbx_b", "key_1", base)
	sa.MemoryMiB, sa.VCPU = 512, 2
	mustInsert(t, a, sa)
	mustInsert(t, b, sb)
	nodes, err := a.ListNodes(ctx)
	if err != nil || len(nodes) != 2 {
		t.Fatalf("ListNodes = %v, %v", nodes, err)
	}
	if n := nodes[0]; n.ID != "node-a" || n.Running != 1 || n.CommittedMiB != 512+64 || n.CommittedVCPUs != 2 ||
		n.Epoch != 2 || len(n.Images) != 1 || !n.HeartbeatAt.Equal(base) {
		t.Errorf("node-a = %+v", n)
	}
	if live, err := a.ListLive(ctx); err != nil || len(live) != 1 || live[0].ID != "sbx_a" {
		t.Errorf("node-a's live sandboxes = %v, %v; want its own", ids(live), err)
	}
	if _, err := b.UpdateSandbox(ctx, "sbx_a", func(*sandbox.Sandbox) bool { return true }); errdefs.Code(err) != "node_fenced" {
		t.Errorf("node-b updating node-a's sandbox: %v, want node_fenced", err)
	}

	// node-b falls silent; node-a declares it lost.
	now = base.Add(time.Minute)
	if err := a.Heartbeat(ctx, "node-a", 2); err != nil {
		t.Fatal(err)
	}
	stale, err := a.StaleNodes(ctx, base.Add(30*time.Second))
	if err != nil || len(stale) != 1 || stale[0] != "node-b" {
		t.Fatalf("StaleNodes = %v, %v", stale, err)
	}
	stopped, err := a.DeclareLost(ctx, "node-b", base.Add(30*time.Second), "node-a")
	if err != nil || len(stopped) != 1 || stopped[0] != "sbx_b" {
		t.Fatalf("DeclareLost = %v, %v", stopped, err)
	}
	if again, err := a.DeclareLost(ctx, "node-b", base.Add(30*time.Second), "node-a"); err != nil || len(again) != 0 {
		t.Errorf("second DeclareLost = %v, %v; want nothing", again, err)
	}
	if got, _ := a.GetSandbox(ctx, "sbx_b"); got.State != sandbox.StateStopped || got.StopReason != sandbox.ReasonNodeLost {
		t.Errorf("sbx_b after its node was lost: %s %s", got.State, got.StopReason)
	}
	if err := b.Heartbeat(ctx, "node-b", 1); errdefs.Code(err) != "node_fenced" {
		t.Errorf("heartbeat of a lost node: %v, want node_fenced", err)
	}
	if err := b.InsertSandbox(ctx, newSandbox("sbx_b2", "key_1", base), ""); errdefs.Code(err) != "node_fenced" {
		t.Errorf("insert by a lost node: %v, want node_fenced", err)
	}
	if _, err := a.SetNodeDraining(ctx, "node-b", true); errdefs.Code(err) != "node_down" {
		t.Errorf("draining a down node: %v, want node_down", err)
	}
	if n, err := a.SetNodeDraining(ctx, "node-a", true); err != nil || n.State != cluster.StateDraining {
		t.Errorf("draining node-a: %+v, %v", n, err)
	}

	// A paused sandbox moves to a node that came back.
	register(b, "node-b")
	if _, err := a.UpdateSandbox(ctx, "sbx_a", func(sb *sandbox.Sandbox) bool {
		sb.State = sandbox.StatePaused
		return true
	}); err != nil {
		t.Fatal(err)
	}
	// Two checkpoints of it on node-a; one goes with it (its files
	// arrived), the other stays. A copy of the one that goes runs on
	// node-a.
	for _, id := range []string{"ckpt_1", "ckpt_2"} {
		if err := a.InsertSnapshot(ctx, &sandbox.Snapshot{ID: id, OwnerKeyID: "key_1", SourceSandboxID: "sbx_a",
			CheckpointOf: "sbx_a", Mode: sandbox.SnapshotModeMemory, State: sandbox.SnapshotReady, CreatedAt: base}); err != nil {
			t.Fatal(err)
		}
	}
	branch := newSandbox("sbx_c", "key_1", base)
	branch.SnapshotID = "ckpt_1"
	mustInsert(t, a, branch)
	if err := b.MoveSandbox(ctx, "sbx_a", "node-a", "node-b", []string{"ckpt_1", "snap_other"}); err != nil {
		t.Fatal(err)
	}
	if err := b.MoveSandbox(ctx, "sbx_a", "node-a", "node-b", nil); errdefs.Code(err) != "not_movable" {
		t.Errorf("second move: %v, want not_movable", err)
	}
	if node, err := a.OwnerNode(ctx, "sandboxes", "sbx_a"); err != nil || node != "node-b" {
		t.Errorf("OwnerNode = %q, %v; want node-b", node, err)
	}
	for id, want := range map[string]string{"ckpt_1": "node-b", "ckpt_2": "node-a"} {
		if node, err := a.OwnerNode(ctx, "snapshots", id); err != nil || node != want {
			t.Errorf("OwnerNode(%s) = %q, %v; want %s", id, node, err, want)
		}
	}
	// node-a keeps ckpt_1's files while its copy there has a disk, then
	// removes them; node-b's are its own.
	cps := []string{"ckpt_1", "ckpt_2", "ckpt_unknown"}
	if away, err := a.SnapshotsElsewhere(ctx, cps); err != nil || len(away) != 0 {
		t.Errorf("node-a's SnapshotsElsewhere with a copy there = %v, %v; want none", away, err)
	}
	if _, err := a.UpdateSandbox(ctx, "sbx_c", func(sb *sandbox.Sandbox) bool {
		sb.State = sandbox.StateDeleted
		return true
	}); err != nil {
		t.Fatal(err)
	}
	if away, err := a.SnapshotsElsewhere(ctx, cps); err != nil || !slices.Equal(away, []string{"ckpt_1"}) {
		t.Errorf("node-a's SnapshotsElsewhere = %v, %v; want ckpt_1", away, err)
	}
	if away, err := b.SnapshotsElsewhere(ctx, []string{"ckpt_1"}); err != nil || len(away) != 0 {
		t.Errorf("node-b's SnapshotsElsewhere = %v, %v; want none", away, err)
	}
	// node-a, started again with sbx_a's files still there, finds it moved
	// away; node-b's own sandboxes and unknown ids are not.
	if away, err := a.MovedAway(ctx, []string{"sbx_a", "sbx_unknown"}); err != nil || len(away) != 1 || away[0] != "sbx_a" {
		t.Errorf("node-a's MovedAway = %v, %v; want sbx_a", away, err)
	}
	if away, err := b.MovedAway(ctx, []string{"sbx_a", "sbx_b"}); err != nil || len(away) != 0 {
		t.Errorf("node-b's MovedAway = %v, %v; want none (both are its own)", away, err)
	}

	// Both ask for the CA at once: one decides, both get it.
	var wg sync.WaitGroup
	got := make([]string, 2)
	for i, s := range []*Store{a, b} {
		wg.Go(func() {
			v, err := s.ClusterSetting(ctx, "ca", func() (string, error) { return s.db.engine.String() + string(rune('0'+i)), nil })
			if err != nil {
				t.Error(err)
			}
			got[i] = v
		})
	}
	wg.Wait()
	if got[0] != got[1] || got[0] == "" {
		t.Errorf("the nodes hold different settings: %q", got)
	}

	// A change is made once: the node that read the setting before the
	// other changed it is refused.
	if err := a.SwapClusterSetting(ctx, "ca", got[0], "rotated-by-a"); err != nil {
		t.Fatal(err)
	}
	if err := b.SwapClusterSetting(ctx, "ca", got[0], "rotated-by-b"); !errdefs.IsConflict(err) {
		t.Errorf("a swap over a changed setting: %v, want a conflict", err)
	}
	if v, err := b.ReadClusterSetting(ctx, "ca"); err != nil || v != "rotated-by-a" {
		t.Errorf("ReadClusterSetting = %q, %v; want rotated-by-a", v, err)
	}
	if _, err := b.ReadClusterSetting(ctx, "none"); !errdefs.IsNotFound(err) {
		t.Errorf("reading a missing setting: %v, want not found", err)
	}
	if err := b.SwapClusterSetting(ctx, "none", "", "x"); !errdefs.IsNotFound(err) {
		t.Errorf("swapping a missing setting: %v, want not found", err)
	}
}

// TestHeartbeatDoesNotQueueBehindWrites: on PostgreSQL every write
// transaction of every node holds the cluster's write lock, and a
// heartbeat that waited for it arrived stale: a node whose beat queued
// behind a long write of another looked silent, and was declared lost
// while it ran. A heartbeat now lands while another node's write
// transaction is still open (it would wait forever otherwise: the test
// commits that transaction only after the heartbeat returns).
func TestHeartbeatDoesNotQueueBehindWrites(t *testing.T) {
	if testEngine != postgresEngine {
		t.Skip("PostgreSQL only: SQLite has one writer by design, and one node")
	}
	dsn := newDSN(t)
	ctx := t.Context()
	a, err := Open(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := Open(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	epoch, err := b.RegisterNode(ctx, &cluster.Node{ID: "b", Address: "b:7443", APIURL: "http://b", MemoryMiB: 4096, VCPUs: 2})
	if err != nil {
		t.Fatal(err)
	}
	b.SetNode("b", epoch)

	// Node a's long write: it holds the cluster's write lock until the
	// heartbeat has returned.
	tx, err := a.db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, `INSERT INTO cluster_settings (name, value) VALUES (?, ?)`, "held", "x"); err != nil {
		t.Fatal(err)
	}
	hctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := b.Heartbeat(hctx, "b", epoch); err != nil {
		t.Fatalf("node b's heartbeat while node a holds the write lock: %v", err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	// The fence still holds: a node declared lost cannot beat.
	if _, err := a.DeclareLost(ctx, "b", time.Now().Add(time.Hour), "a"); err != nil {
		t.Fatal(err)
	}
	if err := b.Heartbeat(ctx, "b", epoch); !errdefs.IsConflict(err) {
		t.Errorf("a fenced node's heartbeat: %v, want node_fenced", err)
	}
}
