package vmmtest

import (
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/emberbox/emberbox/internal/agentproto"
	"github.com/emberbox/emberbox/internal/guest"
	"github.com/emberbox/emberbox/internal/vmm"
)

// Timeouts of TestDriver. A real VM may boot under TCG on a small, shared
// machine.
const (
	bootTimeout  = 3 * time.Minute // Start until the agent answers
	stepTimeout  = time.Minute     // any other step, e.g. a Stop that needs SIGKILL
	reconnectTry = 5 * time.Second // one handshake attempt with a guest already up
)

// TestDriver checks that d meets the contract of vmm.Driver and
// vmm.Machine. newSpec returns the Spec of a VM to start for the test it is
// given: a fresh ID and Dir on each call, and whatever d needs to boot a
// guest that runs the agent. Every VM a subtest starts is stopped by its
// cleanup.
func TestDriver(t *testing.T, d vmm.Driver, newSpec func(t *testing.T) vmm.Spec) {
	t.Run("Names", func(t *testing.T) {
		if d.Name() == "" {
			t.Error("Name() is empty")
		}
		checkAccel(t, "Driver.Accel", d.Accel())
	})
	t.Run("Lifecycle", func(t *testing.T) { testLifecycle(t, d, newSpec(t)) })
	t.Run("StopBeforeGuestIsUp", func(t *testing.T) { testEarlyStop(t, d, newSpec(t)) })
	t.Run("PauseResumeSnapshotClone", func(t *testing.T) { testPause(t, d, newSpec) })
}

// testPause boots a VM, leaves a file and a running process in its guest,
// pauses and resumes it twice, snapshots it and resumes a copy: the file and
// the process are there each time, and the copy's disk and memory are its own.
func testPause(t *testing.T, d vmm.Driver, newSpec func(t *testing.T) vmm.Spec) {
	if d.Name() == "fake" {
		t.Skip("the fake's guests share the host's files and processes: nothing of their own to save (its own tests cover its pause)")
	}
	spec := newSpec(t)
	m := start(t, d, spec)
	c := connectGuest(t, m, bootTimeout, reconnectTry)
	run(t, c, "echo kept > /tmp/file && setsid -f sh -c 'echo $$ > /tmp/pid; exec sleep 100000' </dev/null >/dev/null 2>&1 && sleep 0.2")
	pid := run(t, c, "cat /tmp/pid; kill -0 $(cat /tmp/pid)")
	detach(t, c)
	if d.Saved(spec) {
		t.Fatal("Saved before any pause")
	}
	for i := range 2 {
		ctx, cancel := context.WithTimeout(t.Context(), stepTimeout)
		if err := vmm.Pause(ctx, m); err != nil {
			cancel()
			t.Fatalf("Pause %d: %v", i, err)
		}
		cancel()
		waitClosed(t, m.Done(), "Done after Pause")
		if !d.Saved(spec) {
			t.Fatalf("Saved is false after Pause %d", i)
		}
		m = resume(t, d, spec)
		if d.Saved(spec) {
			t.Fatal("Saved is still true after Resume")
		}
		c = connectGuest(t, m, bootTimeout, reconnectTry)
		if got := run(t, c, "cat /tmp/file; kill -0 $(cat /tmp/pid) && echo alive"); got != "kept\nalive" {
			t.Fatalf("after resume %d: %q, want the file and the process", i, got)
		}
		detach(t, c)
	}

	snap := t.TempDir()
	ctx, cancel := context.WithTimeout(t.Context(), stepTimeout)
	info, err := vmm.Snapshot(ctx, m, snap, true)
	cancel()
	if err != nil {
		t.Fatalf("Snapshot: %v", err)
	}
	if !info.Memory || info.SizeBytes <= 0 {
		t.Errorf("Snapshot info %+v", info)
	}
	c = connectGuest(t, m, bootTimeout, reconnectTry)
	run(t, c, "echo parent > /tmp/file")
	c.Close()

	cspec := newSpec(t)
	ctx, cancel = context.WithTimeout(t.Context(), stepTimeout)
	err = d.Clone(ctx, snap, cspec)
	cancel()
	if err != nil {
		t.Fatalf("Clone: %v", err)
	}
	if !d.Saved(cspec) {
		t.Fatal("Saved is false for a copy of a memory snapshot")
	}
	cm := resume(t, d, cspec)
	cc := connectGuest(t, cm, bootTimeout, reconnectTry)
	defer cc.Close()
	if got := run(t, cc, "cat /tmp/file; cat /tmp/pid; kill -0 $(cat /tmp/pid) && echo alive"); got != "kept\n"+pid+"\nalive" {
		t.Fatalf("copy: %q, want the snapshot's file and process", got)
	}
	run(t, cc, "echo copy > /tmp/file")
	c = connectGuest(t, m, bootTimeout, reconnectTry)
	defer c.Close()
	if got := run(t, c, "cat /tmp/file"); got != "parent" {
		t.Errorf("parent's file after the copy wrote its own: %q", got)
	}
	if mv, ok := d.(vmm.Mover); ok {
		detach(t, cc)
		testMove(t, d, mv, cm, cspec, snap, pid)
	}
}

// testMove pauses the copy m of the snapshot in snap, moves it into a new
// directory as a drain moves it to another node, removes its old directory
// and the snapshot, and resumes it there: its file and its process are
// there, and it needs nothing it left behind.
func testMove(t *testing.T, d vmm.Driver, mv vmm.Mover, m vmm.Machine, spec vmm.Spec, snap, pid string) {
	ctx, cancel := context.WithTimeout(t.Context(), stepTimeout)
	defer cancel()
	if err := vmm.Pause(ctx, m); err != nil {
		t.Fatalf("Pause before the move: %v", err)
	}
	waitClosed(t, m.Done(), "Done after Pause")
	files, err := mv.MoveFiles(spec)
	if err != nil {
		t.Fatalf("MoveFiles: %v", err)
	}
	moved := spec
	moved.Dir = t.TempDir()
	for name, src := range files {
		if name == "" || strings.ContainsAny(name, "/\x00") || name == "." || name == ".." {
			t.Fatalf("MoveFiles names %q", name)
		}
		if err := copyHoles(src, filepath.Join(moved.Dir, name)); err != nil {
			t.Fatalf("copying %s: %v", name, err)
		}
	}
	for _, dir := range []string{spec.Dir, snap} {
		if err := os.RemoveAll(dir); err != nil {
			t.Fatal(err)
		}
	}
	if err := mv.Moved(ctx, moved); err != nil {
		t.Fatalf("Moved: %v", err)
	}
	if !d.Saved(moved) {
		t.Fatal("Saved is false after Moved")
	}
	mm := resume(t, d, moved)
	c := connectGuest(t, mm, bootTimeout, reconnectTry)
	defer c.Close()
	if got := run(t, c, "cat /tmp/file; cat /tmp/pid; kill -0 $(cat /tmp/pid) && echo alive"); got != "copy\n"+pid+"\nalive" {
		t.Fatalf("moved: %q, want the copy's file and process", got)
	}
	// Its disk is whole: what the snapshot's disk held reads back, and a
	// write goes to its own.
	run(t, c, "cat /etc/os-release >/dev/null && echo moved > /root/moved && sync")
	if got := run(t, c, "cat /root/moved"); got != "moved" {
		t.Errorf("a file written after the move: %q", got)
	}
}

// copyHoles copies src to dst (mode 0600) as a transfer between nodes
// does, leaving a hole where src reads zeros.
func copyHoles(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	buf := make([]byte, 1<<20)
	var off int64
	for {
		n, err := io.ReadFull(in, buf)
		if n > 0 && !allZero(buf[:n]) {
			if _, werr := out.WriteAt(buf[:n], off); werr != nil {
				out.Close()
				return werr
			}
		}
		off += int64(n)
		if err == io.EOF || err == io.ErrUnexpectedEOF {
			break
		}
		if err != nil {
			out.Close()
			return err
		}
	}
	if err := out.Truncate(off); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

func allZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

// detach ends c's session as the manager does before a pause or snapshot.
func detach(t *testing.T, c *guest.Client) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), stepTimeout)
	defer cancel()
	if err := c.Detach(ctx); err != nil {
		t.Fatalf("Detach: %v", err)
	}
}

func resume(t *testing.T, d vmm.Driver, spec vmm.Spec) vmm.Machine {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), stepTimeout)
	defer cancel()
	m, err := d.Resume(ctx, spec)
	if err != nil {
		t.Fatalf("Resume: %v", err)
	}
	if !d.Saved(spec) {
		t.Error("Resume consumed the saved state before Continue")
	}
	if err := vmm.Continue(ctx, m); err != nil {
		t.Fatalf("Continue: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), stepTimeout)
		defer cancel()
		_ = m.Stop(ctx)
	})
	return m
}

// connectGuest dials m's guest and completes the handshake within timeout,
// trying again on a new connection when an attempt gets no answer within
// perTry (see reachGuest).
func connectGuest(t *testing.T, m vmm.Machine, timeout, perTry time.Duration) *guest.Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), timeout)
	defer cancel()
	for try := 1; ; try++ {
		conn, err := m.DialGuest(ctx)
		if err != nil {
			t.Fatalf("DialGuest: %v", err)
		}
		tctx, tcancel := context.WithTimeout(ctx, perTry)
		c, err := guest.Handshake(tctx, conn)
		tcancel()
		if err == nil {
			return c
		}
		conn.Close()
		if ctx.Err() != nil {
			t.Fatalf("guest handshake (attempt %d): %v", try, err)
		}
		t.Logf("guest handshake, attempt %d: %v; retrying on a new connection", try, err)
	}
}

// run runs command as root in the guest and returns its trimmed stdout.
func run(t *testing.T, c *guest.Client, command string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), stepTimeout)
	defer cancel()
	res, err := c.Exec(ctx, agentproto.ExecRequest{Command: command, User: "root", TimeoutMs: 30000}, nil)
	if err != nil {
		t.Fatalf("exec %q: %v", command, err)
	}
	if res.ExitCode == nil || *res.ExitCode != 0 {
		t.Fatalf("exec %q: %+v: %s", command, res, res.Stderr)
	}
	return strings.TrimSpace(string(res.Stdout))
}

// testLifecycle starts a VM, reaches its agent directly and through Attach,
// stops it and checks that it is gone.
func testLifecycle(t *testing.T, d vmm.Driver, spec vmm.Spec) {
	m := start(t, d, spec)
	running := checkRunning(t, m)

	rec := m.Record()
	if len(rec) == 0 {
		t.Fatal("Record() is empty")
	}
	m2 := checkAttach(t, d, spec, m, rec)

	stop(t, m)
	waitClosed(t, m.Done(), "Done after Stop")
	waitClosed(t, m2.Done(), "Done of the attached Machine after Stop")
	checkStopped(t, d, spec, rec, m, m2, running)
}

// checkRunning checks m right after Start and once its agent answers, and
// returns its usage then.
func checkRunning(t *testing.T, m vmm.Machine) vmm.Usage {
	checkAccel(t, "Machine.Accel", m.Accel())
	if m.PID() <= 0 {
		t.Errorf("PID() = %d, want the VMM's process id", m.PID())
	}
	if isClosed(m.Done()) {
		t.Fatal("Done is closed right after Start")
	}
	info := reachGuest(t, m, bootTimeout, bootTimeout)
	if info.Version != agentproto.Version {
		t.Errorf("agent reports protocol version %d, want %d", info.Version, agentproto.Version)
	}
	running, err := m.Usage()
	if err != nil {
		t.Fatalf("Usage of a running VM: %v", err)
	}
	if running.Final || running.CPU <= 0 {
		t.Errorf("Usage of a VM that booted = %+v, want CPU > 0 and not final", running)
	}
	return running
}

// checkAttach attaches to m, running, by its record rec, reaches its guest
// through the new handle, and checks that Attach refuses a record that is
// not spec's VM's. It returns the attached handle.
func checkAttach(t *testing.T, d vmm.Driver, spec vmm.Spec, m vmm.Machine, rec []byte) vmm.Machine {
	ctx := t.Context()
	m2, err := d.Attach(ctx, spec, rec)
	if err != nil {
		t.Fatalf("Attach to a running VM: %v", err)
	}
	if m2.PID() != m.PID() || m2.Accel() != m.Accel() {
		t.Errorf("Attach found pid %d (%s), want pid %d (%s)", m2.PID(), m2.Accel(), m.PID(), m.Accel())
	}
	// The first connection is closed, so the guest must take a new one.
	// On a loaded machine the agent has taken up to two minutes to let go
	// of a session whose host vanished (the manager retries as long);
	// the wait allows for it rather than fail on it.
	reachGuest(t, m2, bootTimeout, reconnectTry)

	other := spec
	other.ID += "-other"
	if _, err := d.Attach(ctx, other, rec); err == nil {
		t.Error("Attach accepted the record of another sandbox's VM")
	}
	if _, err := d.Attach(ctx, spec, []byte("{")); err == nil {
		t.Error("Attach accepted a malformed record")
	}
	return m2
}

// checkStopped checks m and m2, handles to one VM that was stopped, and
// that the VM of record rec is gone; running is m's usage while it ran.
func checkStopped(t *testing.T, d vmm.Driver, spec vmm.Spec, rec []byte, m, m2 vmm.Machine, running vmm.Usage) {
	ctx := t.Context()
	// The final count is read after the VMM exited, so it holds everything
	// it used: never less than a reading taken before. (The attached
	// handle, a second one to the same VM in this process, only has to
	// know the VM ended: the first handle to see the end settles it.)
	final, err := m.Usage()
	if err != nil || !final.Final || final.CPU < running.CPU || final.RSSBytes != 0 {
		t.Errorf("Usage after Stop = %+v, %v; want final, CPU >= %v, no RSS", final, err, running.CPU)
	}
	if final2, err := m2.Usage(); err != nil || !final2.Final || final2.RSSBytes != 0 {
		t.Errorf("Usage of the attached Machine after Stop = %+v, %v; want final, no RSS", final2, err)
	}
	if err := m.Stop(ctx); err != nil {
		t.Errorf("second Stop: %v", err)
	}
	if err := m2.Stop(ctx); err != nil {
		t.Errorf("Stop of the attached Machine after the VM ended: %v", err)
	}
	if _, err := d.Attach(ctx, spec, rec); !errors.Is(err, vmm.ErrGone) {
		t.Errorf("Attach after Stop: %v, want vmm.ErrGone", err)
	}
	dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if c, err := m.DialGuest(dctx); err == nil {
		c.Close()
		t.Error("DialGuest after Stop connected")
	}
}

// testEarlyStop stops a VM right after Start, as a manager does with a boot
// that hangs or a sandbox stopped while starting.
func testEarlyStop(t *testing.T, d vmm.Driver, spec vmm.Spec) {
	m := start(t, d, spec)
	rec := m.Record()
	stop(t, m)
	waitClosed(t, m.Done(), "Done after Stop")
	if _, err := d.Attach(t.Context(), spec, rec); !errors.Is(err, vmm.ErrGone) {
		t.Errorf("Attach after Stop: %v, want vmm.ErrGone", err)
	}
}

func start(t *testing.T, d vmm.Driver, spec vmm.Spec) vmm.Machine {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), stepTimeout)
	defer cancel()
	m, err := d.Start(ctx, spec)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), stepTimeout)
		defer cancel()
		_ = m.Stop(ctx)
	})
	return m
}

func stop(t *testing.T, m vmm.Machine) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), stepTimeout)
	defer cancel()
	if err := m.Stop(ctx); err != nil {
		t.Fatalf("Stop: %v", err)
	}
}

// reachGuest dials m's guest, completes the handshake and asks the agent for
// its Info, within timeout; it closes the connection before returning.
//
// A handshake attempt that gets no answer within perTry is retried on a new
// connection. That is for reconnects: a guest that has not yet noticed the
// previous host connection close can swallow the new connection's hello
// (the manager retries too), which is the guest protocol's concern, not the
// driver's.
func reachGuest(t *testing.T, m vmm.Machine, timeout, perTry time.Duration) *agentproto.Info {
	t.Helper()
	c := connectGuest(t, m, timeout, perTry)
	defer c.Close()
	info, err := c.Info(t.Context())
	if err != nil {
		t.Fatalf("Info: %v", err)
	}
	return info
}

func checkAccel(t *testing.T, what, accel string) {
	t.Helper()
	if accel != "kvm" && accel != "tcg" {
		t.Errorf("%s() = %q, want kvm or tcg", what, accel)
	}
}

func isClosed(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

func waitClosed(t *testing.T, c <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-c:
	case <-time.After(stepTimeout):
		t.Fatalf("%s: not closed after %v", what, stepTimeout)
	}
}
