package sandbox_test

import (
	"bufio"
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/emberbox/emberbox/internal/admission"
	"github.com/emberbox/emberbox/internal/agentproto"
	"github.com/emberbox/emberbox/internal/errdefs"
	"github.com/emberbox/emberbox/internal/sandbox"
	"github.com/emberbox/emberbox/internal/vmm"
)

// node is one of two "nodes" of a move test: a manager on a data dir of
// its own with its own ledger, beside the other on the same store and the
// same fake driver (whose guest world is one, as a real guest's memory
// moves with it).
type node struct {
	m      *sandbox.Manager
	dir    string
	ledger *admission.Ledger
}

func (e *env) node(edit func(*sandbox.Config)) node {
	n := node{dir: e.t.TempDir(), ledger: admission.New(admission.Config{})}
	n.m = e.managerWith(func(cfg *sandbox.Config) {
		cfg.DataDir, cfg.Admission = n.dir, n.ledger
		if edit != nil {
			edit(cfg)
		}
	})
	return n
}

func (n node) sandboxDir(id string) string { return filepath.Join(n.dir, "sandboxes", id) }

// copyFiles is a receive that copies the files a MoveOut named into the
// staging directory, as the cluster's transfer does.
func copyFiles(files map[string]string) func(ctx context.Context, dir string) error {
	return func(ctx context.Context, dir string) error {
		for name, src := range files {
			b, err := os.ReadFile(src)
			if err != nil {
				return err
			}
			if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
				return err
			}
		}
		return nil
	}
}

// moveTo is a send that moves the sandbox into dst, its checkpoints
// staged first as the cluster's transfer does; commit, if not nil, is
// MoveIn's commit.
func moveTo(dst node, commit func(ctx context.Context) error) func(ctx context.Context, out *sandbox.Outgoing) error {
	return func(ctx context.Context, out *sandbox.Outgoing) error {
		if commit == nil {
			commit = func(context.Context) error { return nil }
		}
		var staged []string
		for _, cp := range out.Checkpoints {
			if err := dst.m.Moves.StageCheckpoint(ctx, out.Sandbox.ID, cp.ID, copyFiles(cp.Files)); err != nil {
				return err
			}
			staged = append(staged, cp.ID)
		}
		return dst.m.Moves.MoveIn(ctx, sandbox.Incoming{Sandbox: out.Sandbox, Checkpoints: staged,
			Receive: copyFiles(out.Files),
			Commit: func(ctx context.Context, cps []string) error {
				if err := commit(ctx); err != nil {
					return err
				}
				out.Taken = cps
				return nil
			}})
	}
}

func cat(t *testing.T, m *sandbox.Manager, id, file string) string {
	t.Helper()
	res, err := exec(context.Background(), m, "k", id, agentproto.ExecRequest{Command: "cat " + file})
	if err != nil {
		t.Fatal(err)
	}
	return string(res.Stdout)
}

func TestMovePausedSandbox(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	a, b := e.node(nil), e.node(nil)
	sb := running(t, a.m, spec())
	file := filepath.Join(t.TempDir(), "kept")
	if _, err := exec(ctx, a.m, "k", sb.ID, agentproto.ExecRequest{Command: "echo kept > " + file}); err != nil {
		t.Fatal(err)
	}
	if err := a.m.Moves.MoveOut(ctx, sb.ID, moveTo(b, nil)); errdefs.Code(err) != "not_paused" || !errdefs.IsConflict(err) {
		t.Fatalf("moving a running sandbox: %v, want conflict not_paused", err)
	}
	pause(t, a.m, sb.ID)

	committed := false
	commit := func(ctx context.Context) error {
		// Everything is in place when the owner switches.
		if !e.drv.Saved(vmm.Spec{ID: sb.ID, Dir: b.sandboxDir(sb.ID)}) || !b.ledger.Held(sb.ID) {
			t.Error("commit ran before the sandbox was in place on the new node")
		}
		committed = true
		return nil
	}
	if err := a.m.Moves.MoveOut(ctx, sb.ID, moveTo(b, commit)); err != nil {
		t.Fatal(err)
	}
	if !committed {
		t.Error("MoveIn did not commit")
	}
	if _, err := os.Stat(a.sandboxDir(sb.ID)); !os.IsNotExist(err) {
		t.Errorf("the old node kept the moved sandbox's files: %v", err)
	}
	if a.ledger.Held(sb.ID) {
		t.Error("the old node's ledger still holds the moved sandbox")
	}
	if got := b.ledger.Owner("k"); got.DiskMiB != int64(sb.DiskMiB) || got.MemoryMiB != 0 || got.VCPU != 0 {
		t.Errorf("the new node holds %+v for the moved sandbox, want its disk alone", got)
	}
	if left, _ := os.ReadDir(filepath.Join(b.dir, "incoming")); len(left) != 0 {
		t.Errorf("staging left behind: %v", left)
	}

	// The old node refuses to wake it (its state is not there any more):
	// nothing records it stopped.
	if _, err := a.m.Wake(ctx, "k", sb.ID, nil); errdefs.Code(err) != "not_on_node" {
		t.Errorf("wake on the old node: %v, want not_on_node", err)
	}
	if got, err := a.m.Get(ctx, "k", sb.ID); err != nil || got.State != sandbox.StatePaused {
		t.Fatalf("after a wake on the old node: %+v, %v; want paused", got, err)
	}
	w := wake(t, b.m, sb.ID)
	if w.PausedAt != nil || w.ExpiresAt == nil {
		t.Errorf("woken on the new node: %+v", w)
	}
	if got := cat(t, b.m, sb.ID, file); got != "kept\n" {
		t.Errorf("the file after the move: %q", got)
	}
	if got := b.ledger.Owner("k"); got.VCPU != sb.VCPU || got.MemoryMiB != int64(sb.MemoryMiB) {
		t.Errorf("the new node's ledger holds %+v for the woken sandbox, want all of it", got)
	}

	// And back again: a sandbox moved once moves like any other.
	pause(t, b.m, sb.ID)
	if err := b.m.Moves.MoveOut(ctx, sb.ID, moveTo(a, nil)); err != nil {
		t.Fatal(err)
	}
	wake(t, a.m, sb.ID)
	if got := cat(t, a.m, sb.ID, file); got != "kept\n" {
		t.Errorf("the file after moving back: %q", got)
	}
	if e.drv.Resumes() != 2 || e.drv.Starts() != 1 {
		t.Errorf("%d resumes and %d starts, want 2 and 1", e.drv.Resumes(), e.drv.Starts())
	}
}

func TestMoveFailureKeepsSandbox(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	a, b := e.node(nil), e.node(nil)
	sb := running(t, a.m, spec())
	pause(t, a.m, sb.ID)

	refused := errors.New("the other node is gone")
	commitFails := func(context.Context) error { return refused }
	for name, send := range map[string]func(ctx context.Context, out *sandbox.Outgoing) error{
		"send fails": func(context.Context, *sandbox.Outgoing) error { return refused },
		"receive fails": func(ctx context.Context, out *sandbox.Outgoing) error {
			return b.m.Moves.MoveIn(ctx, sandbox.Incoming{Sandbox: out.Sandbox, Receive: func(ctx context.Context, dir string) error {
				if err := copyFiles(out.Files)(ctx, dir); err != nil {
					return err
				}
				return refused // part-way
			}, Commit: func(context.Context, []string) error { return nil }})
		},
		"moved fails": func(ctx context.Context, out *sandbox.Outgoing) error {
			e.drv.FailMoved(1)
			return moveTo(b, nil)(ctx, out)
		},
		"commit fails": moveTo(b, commitFails),
	} {
		err := a.m.Moves.MoveOut(ctx, sb.ID, send)
		if err == nil {
			t.Fatalf("%s: MoveOut succeeded", name)
		}
		if name != "moved fails" && !errors.Is(err, refused) {
			t.Errorf("%s: MoveOut: %v, want the sender's error", name, err)
		}
		if !e.drv.Saved(vmm.Spec{ID: sb.ID, Dir: a.sandboxDir(sb.ID)}) || !a.ledger.Held(sb.ID) {
			t.Errorf("%s: the old node lost the sandbox", name)
		}
		if _, err := os.Stat(b.sandboxDir(sb.ID)); !os.IsNotExist(err) {
			t.Errorf("%s: the new node kept files of a failed move: %v", name, err)
		}
		if left, _ := os.ReadDir(filepath.Join(b.dir, "incoming")); len(left) != 0 {
			t.Errorf("%s: staging left behind: %v", name, left)
		}
		if b.ledger.Held(sb.ID) {
			t.Errorf("%s: the new node's ledger holds the sandbox", name)
		}
	}
	got, err := a.m.Get(ctx, "k", sb.ID)
	if err != nil || got.State != sandbox.StatePaused {
		t.Fatalf("after the failed moves: %+v, %v; want paused", got, err)
	}
	wake(t, a.m, sb.ID)
	if _, err := exec(ctx, a.m, "k", sb.ID, agentproto.ExecRequest{Argv: []string{"true"}}); err != nil {
		t.Errorf("exec after waking where it stayed: %v", err)
	}
}

func TestMoveRefusals(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	vols := &holdingVolumes{}
	a, b := e.node(func(cfg *sandbox.Config) { cfg.Volumes = vols }), e.node(nil)
	sb := running(t, a.m, spec())
	pause(t, a.m, sb.ID)
	noSend := func(context.Context, *sandbox.Outgoing) error {
		t.Error("send called for a move that is refused")
		return nil
	}

	vols.set(sb.ID)
	if err := a.m.Moves.MoveOut(ctx, sb.ID, noSend); errdefs.Code(err) != "volumes_attached" || !errdefs.IsConflict(err) {
		t.Errorf("moving a sandbox with volumes: %v, want conflict volumes_attached", err)
	}
	vols.set("")
	if err := b.m.Moves.MoveOut(ctx, sb.ID, noSend); errdefs.Code(err) != "not_on_node" {
		t.Errorf("moving out a sandbox of another node: %v, want not_on_node", err)
	}
	rec, err := e.st.GetSandbox(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	receive := func(context.Context, string) error {
		t.Error("receive called for a move that is refused")
		return nil
	}
	commit := func(context.Context, []string) error { return nil }
	incoming := func(sb *sandbox.Sandbox) sandbox.Incoming {
		return sandbox.Incoming{Sandbox: sb, Receive: receive, Commit: commit}
	}
	if err := a.m.Moves.MoveIn(ctx, incoming(rec)); errdefs.Code(err) != "already_on_node" {
		t.Errorf("moving in a sandbox already here: %v, want already_on_node", err)
	}
	bad := *rec
	bad.ID = "../" + rec.ID
	if err := b.m.Moves.MoveIn(ctx, incoming(&bad)); !errdefs.IsInvalidArgument(err) {
		t.Errorf("moving in a sandbox named %q: %v, want invalid", bad.ID, err)
	}
	live := *rec
	live.State = sandbox.StateRunning
	if err := b.m.Moves.MoveIn(ctx, incoming(&live)); errdefs.Code(err) != "not_paused" {
		t.Errorf("moving in a running sandbox: %v, want not_paused", err)
	}
	full := e.node(func(cfg *sandbox.Config) {
		cfg.Admission = admission.New(admission.Config{DiskFreeMiB: func() (int64, error) { return 1024, nil }})
	})
	if err := full.m.Moves.MoveIn(ctx, incoming(rec)); errdefs.Code(err) != admission.CodeNoCapacity {
		t.Errorf("moving into a node without room: %v, want no_capacity", err)
	}

	plain := e.node(func(cfg *sandbox.Config) { cfg.Driver = noMover{e.drv} })
	if err := plain.m.Moves.MoveOut(ctx, sb.ID, noSend); errdefs.Code(err) != "move_unsupported" {
		t.Errorf("MoveOut with a driver that cannot move: %v, want move_unsupported", err)
	}
	if err := plain.m.Moves.MoveIn(ctx, incoming(rec)); errdefs.Code(err) != "move_unsupported" {
		t.Errorf("MoveIn with a driver that cannot move: %v, want move_unsupported", err)
	}
	wake(t, a.m, sb.ID) // still a's, and whole
}

// noMover is a driver without vmm.Mover.
type noMover struct{ vmm.Driver }

// holdingVolumes is a volume service by which one sandbox holds volumes.
type holdingVolumes struct {
	mu    sync.Mutex
	holds string
}

func (v *holdingVolumes) set(id string) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.holds = id
}

func (v *holdingVolumes) Claim(context.Context, *sandbox.Sandbox, []sandbox.VolumeMount) error {
	return nil
}
func (v *holdingVolumes) Release(context.Context, string) {}
func (v *holdingVolumes) Holds(_ context.Context, id string) bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	return id == v.holds
}
func (v *holdingVolumes) ServeVolume(_ context.Context, _, _ string, c net.Conn, _ *bufio.Reader, accept func(error) error) {
	_ = accept(errors.New("no volumes"))
	c.Close()
}

// TestRemoveMovedAway: at start, a node removes the directories of the
// sandboxes the store gives to another node (a drain committed the move
// and the sender died before removing them), and nothing else.
func TestRemoveMovedAway(t *testing.T) {
	e := newEnv(t)
	n := e.node(nil)
	for _, id := range []string{"sbx_gone", "sbx_mine"} {
		if err := os.MkdirAll(filepath.Join(n.sandboxDir(id), "sub"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	var asked []string
	removed, err := n.m.Moves.RemoveMovedAway(context.Background(), func(_ context.Context, ids []string) ([]string, error) {
		asked = ids
		return []string{"sbx_gone"}, nil
	})
	if err != nil || removed != 1 {
		t.Fatalf("RemoveMovedAway = %d, %v; want 1", removed, err)
	}
	if len(asked) != 2 {
		t.Errorf("asked about %v, want both directories", asked)
	}
	if _, err := os.Stat(n.sandboxDir("sbx_gone")); !os.IsNotExist(err) {
		t.Errorf("the moved sandbox's directory is still there: %v", err)
	}
	if _, err := os.Stat(n.sandboxDir("sbx_mine")); err != nil {
		t.Errorf("the node's own sandbox's directory: %v", err)
	}
	if _, err := n.m.Moves.RemoveMovedAway(context.Background(), func(context.Context, []string) ([]string, error) {
		return nil, errors.New("store down")
	}); err == nil {
		t.Error("an error of the store was not returned")
	}
}

// TestMoveRunningSandbox: a running sandbox moves as a paused one between
// PauseForMove and WakeMoved: calls into it meanwhile get the retryable
// sandbox_moving, and it runs on the new node with the lease it had. A
// move that fails is woken where it was.
func TestMoveRunningSandbox(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	a, b := e.node(nil), e.node(nil)
	s := spec()
	s.TimeoutSeconds = 3600
	sb := running(t, a.m, s)
	if err := a.m.Moves.PauseForMove(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if got, _ := a.m.Get(ctx, "k", sb.ID); got.State != sandbox.StatePaused || got.ExpiresAt == nil || !got.ExpiresAt.Equal(*sb.ExpiresAt) {
		t.Fatalf("after PauseForMove: %s, lease %v; want paused with its lease", got.State, got.ExpiresAt)
	}
	// Time passes during the move: the lease does not start again.
	e.clock.Advance(10 * time.Second)
	_, _, err := a.m.Guest(ctx, "k", sb.ID)
	var ce *errdefs.CodedError
	if errdefs.Code(err) != "sandbox_moving" || !errors.As(err, &ce) || ce.RetryAfter <= 0 || !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("a call during the move: %v, want the retryable sandbox_moving", err)
	}

	// The move fails: it runs here again, its lease as it was.
	if err := a.m.Moves.MoveOut(ctx, sb.ID, func(context.Context, *sandbox.Outgoing) error {
		return errors.New("the other node is gone")
	}); err == nil {
		t.Fatal("MoveOut succeeded")
	}
	a.m.Moves.EndMove(sb.ID)
	if err := a.m.Moves.WakeMoved(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	back, _ := a.m.Get(ctx, "k", sb.ID)
	if back.State != sandbox.StateRunning || !back.ExpiresAt.Equal(*sb.ExpiresAt) {
		t.Fatalf("woken after a failed move: %s, lease %v; want running, lease %v", back.State, back.ExpiresAt, sb.ExpiresAt)
	}

	// The move succeeds: it runs on b.
	if err := a.m.Moves.PauseForMove(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if err := a.m.Moves.MoveOut(ctx, sb.ID, moveTo(b, nil)); err != nil {
		t.Fatal(err)
	}
	a.m.Moves.EndMove(sb.ID)
	if err := b.m.Moves.WakeMoved(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	moved, _ := b.m.Get(ctx, "k", sb.ID)
	if moved.State != sandbox.StateRunning || !moved.ExpiresAt.Equal(*sb.ExpiresAt) {
		t.Errorf("after the move: %s, lease %v; want running, lease %v", moved.State, moved.ExpiresAt, sb.ExpiresAt)
	}
	if _, _, err := b.m.Guest(ctx, "k", sb.ID); err != nil {
		t.Errorf("a call after the move: %v", err)
	}
	// A sandbox not running is not paused for a move.
	if err := b.m.Moves.PauseForMove(ctx, "sbx_00000000000000000000"); err == nil {
		t.Error("PauseForMove of an unknown sandbox succeeded")
	}
}

// TestMoveTakesCheckpoints: a sandbox's checkpoints go with it, with the
// base the later ones are differences over even once it is pruned, and
// restore on the new node; a checkpoint whose files do not check out
// stays behind, and its restore says where it is.
func TestMoveTakesCheckpoints(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	cap2 := func(cfg *sandbox.Config) {
		cfg.Checkpoints.PerSandbox, cfg.Boot.Rootfs = 2, "/images/default.img"
	}
	a, b, c := e.node(cap2), e.node(cap2), e.node(cap2)
	sb := running(t, a.m, spec())
	var ids []string
	for range 3 {
		e.clock.Advance(time.Second)
		cp, err := a.m.Checkpoints.Checkpoint(ctx, "k", sb.ID, "", true)
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, cp.ID)
	}
	// ids[0] is pruned by the cap but stays the base of the other two.
	pause(t, a.m, sb.ID)
	var sent, taken []string
	send := func(dst node, spoil string) func(ctx context.Context, out *sandbox.Outgoing) error {
		return func(ctx context.Context, out *sandbox.Outgoing) error {
			sent = sent[:0]
			for i, cp := range out.Checkpoints {
				sent = append(sent, cp.ID)
				if cp.ID == spoil {
					bad := filepath.Join(t.TempDir(), "spoilt")
					if err := os.WriteFile(bad, []byte(`{"memory":false}`), 0o600); err != nil {
						t.Fatal(err)
					}
					files := map[string]string{}
					for name := range cp.Files {
						files[name] = bad
					}
					out.Checkpoints[i].Files = files
				}
			}
			err := moveTo(dst, nil)(ctx, out)
			taken = out.Taken
			return err
		}
	}
	if err := a.m.Moves.MoveOut(ctx, sb.ID, send(b, "")); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(sent, ids) || !slices.Equal(taken, ids) {
		t.Fatalf("sent %v, taken %v; want %v, the pruned base first", sent, taken, ids)
	}
	for _, id := range ids {
		if !exists(filepath.Join(b.dir, "snapshots", id)) {
			t.Errorf("checkpoint %s's files did not arrive", id)
		}
	}
	if left, _ := os.ReadDir(filepath.Join(b.dir, "incoming")); len(left) != 0 {
		t.Errorf("staging left behind: %v", left)
	}
	if got, err := b.m.Checkpoints.RestoreCheckpoint(ctx, "k", sb.ID, ids[2], false); err != nil || got.State != sandbox.StateRunning {
		t.Fatalf("restore on the new node: %+v, %v", got, err)
	}

	// On to c, ids[2]'s files spoilt on the way: the sandbox and ids[1]
	// move, ids[2] stays on b.
	pause(t, b.m, sb.ID)
	if err := b.m.Moves.MoveOut(ctx, sb.ID, send(c, ids[2])); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(taken, ids[:2]) {
		t.Fatalf("taken %v, want %v", taken, ids[:2])
	}
	if _, err := c.m.Checkpoints.RestoreCheckpoint(ctx, "k", sb.ID, ids[2], false); errdefs.Code(err) != "checkpoint_elsewhere" {
		t.Errorf("restoring the checkpoint that stayed behind: %v, want checkpoint_elsewhere", err)
	}
	if got, err := c.m.Checkpoints.RestoreCheckpoint(ctx, "k", sb.ID, ids[1], false); err != nil || got.State != sandbox.StateRunning {
		t.Fatalf("restore on the third node: %+v, %v", got, err)
	}
	if left, _ := os.ReadDir(filepath.Join(c.dir, "incoming")); len(left) != 0 {
		t.Errorf("staging left behind: %v", left)
	}

	// Only a checkpoint of the moving sandbox is staged.
	noop := func(context.Context, string) error { return nil }
	other := running(t, a.m, spec())
	for _, bad := range []struct{ sandbox, checkpoint string }{{other.ID, ids[1]}, {sb.ID, "../" + ids[1]}, {sb.ID, "snap_0123456789abcdef0123"}} {
		if err := a.m.Moves.StageCheckpoint(ctx, bad.sandbox, bad.checkpoint, noop); err == nil {
			t.Errorf("StageCheckpoint(%s, %s) succeeded", bad.sandbox, bad.checkpoint)
		}
	}

	// Checkpoints staged for a sandbox that never followed them go after
	// an hour, when the next are staged.
	if err := a.m.Moves.StageCheckpoint(ctx, sb.ID, ids[1], noop); err != nil {
		t.Fatal(err)
	}
	stale := filepath.Join(a.dir, "incoming", sb.ID+".checkpoints")
	old := time.Now().Add(-2 * time.Hour)
	if err := os.Chtimes(stale, old, old); err != nil {
		t.Fatal(err)
	}
	ocp, err := a.m.Checkpoints.Checkpoint(ctx, "k", other.ID, "", true)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.m.Moves.StageCheckpoint(ctx, other.ID, ocp.ID, noop); err != nil {
		t.Fatal(err)
	}
	if exists(stale) || !exists(filepath.Join(a.dir, "incoming", other.ID+".checkpoints", ocp.ID)) {
		t.Errorf("after an hour: the stale stage is there %v, the new one %v; want only the new one",
			exists(stale), exists(filepath.Join(a.dir, "incoming", other.ID+".checkpoints", ocp.ID)))
	}
}

// TestCopyFetchesSnapshot: a node asked for a copy of a snapshot it does
// not hold fetches the snapshot's files first (memory and disk
// snapshots), once for creates at once; a fetch that fails is a
// retryable snapshot_unavailable, and leaves nothing behind.
func TestCopyFetchesSnapshot(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	rootfs := func(cfg *sandbox.Config) { cfg.Boot.Rootfs = "/images/default.img" }
	a := e.node(rootfs)
	var fetches atomic.Int32
	failing := atomic.Bool{}
	b := e.node(func(cfg *sandbox.Config) {
		rootfs(cfg)
		cfg.FetchSnapshot = func(ctx context.Context, sn *sandbox.Snapshot, dir string) error {
			fetches.Add(1)
			if failing.Load() {
				return errors.New("the node that holds it is gone")
			}
			files, err := a.m.Snapshots.SnapshotFiles(ctx, sn.ID)
			if err != nil {
				return err
			}
			return copyFiles(files)(ctx, dir)
		}
	})
	src := running(t, a.m, spec())
	mem, err := a.m.Snapshots.Snapshot(ctx, "k", src.ID, sandbox.SnapshotSpec{})
	if err != nil {
		t.Fatal(err)
	}
	disk, err := a.m.Snapshots.Snapshot(ctx, "k", src.ID, sandbox.SnapshotSpec{Mode: sandbox.SnapshotModeDisk})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for range 3 {
		wg.Go(func() {
			cp, err := b.m.Create(ctx, "k", sandbox.CreateSpec{SnapshotID: mem.ID, OnLeaseEnd: "stop", TimeoutSeconds: 60})
			if err != nil {
				t.Error(err)
				return
			}
			waitState(t, b.m, "k", cp.ID, sandbox.StateRunning)
		})
	}
	wg.Wait()
	if n := fetches.Load(); n != 1 {
		t.Errorf("three copies at once fetched %d times, want once", n)
	}
	dc, err := b.m.Create(ctx, "k", sandbox.CreateSpec{SnapshotID: disk.ID, OnLeaseEnd: "stop", TimeoutSeconds: 60})
	if err != nil {
		t.Fatal(err)
	}
	waitState(t, b.m, "k", dc.ID, sandbox.StateRunning)
	for _, id := range []string{mem.ID, disk.ID} {
		if !exists(filepath.Join(b.dir, "snapshots", id)) {
			t.Errorf("snapshot %s was not fetched", id)
		}
	}

	failing.Store(true)
	other, err := a.m.Snapshots.Snapshot(ctx, "k", src.ID, sandbox.SnapshotSpec{})
	if err != nil {
		t.Fatal(err)
	}
	_, err = b.m.Create(ctx, "k", sandbox.CreateSpec{SnapshotID: other.ID, OnLeaseEnd: "stop"})
	var ce *errdefs.CodedError
	if errdefs.Code(err) != "snapshot_unavailable" || !errors.As(err, &ce) || ce.RetryAfter <= 0 {
		t.Errorf("a copy whose snapshot cannot be fetched: %v, want the retryable snapshot_unavailable", err)
	}
	if exists(filepath.Join(b.dir, "snapshots", other.ID)) {
		t.Error("a failed fetch left the snapshot's directory")
	}
	if left, _ := os.ReadDir(filepath.Join(b.dir, "incoming")); len(left) != 0 {
		t.Errorf("a failed fetch left staging behind: %v", left)
	}
}
