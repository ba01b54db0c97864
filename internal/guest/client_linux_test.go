package guest_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"io"
	"net"
	"os"
	"os/user"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/emberbox/emberbox/internal/agent"
	"github.com/emberbox/emberbox/internal/agentproto"
	"github.com/emberbox/emberbox/internal/errdefs"
	"github.com/emberbox/emberbox/internal/guest"
)

// newPair runs a real agent (as the current user, on this host) on one end
// of an in-memory connection and returns a client on the other.
func newPair(t *testing.T) (*guest.Client, string) {
	t.Helper()
	u, err := user.Current()
	if err != nil {
		t.Fatal(err)
	}
	a, err := agent.New(agent.Config{Root: "/", User: u.Username})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	hostEnd, guestEnd := socketPair(t)
	// Stale bytes from an "earlier connection" must be skipped by the handshake.
	go func() {
		_, _ = guestEnd.Write([]byte("garbage from before\n"))
		_ = a.ServeConn(ctx, guestEnd)
	}()
	hctx, hcancel := context.WithTimeout(ctx, 10*time.Second)
	defer hcancel()
	c, err := guest.Handshake(hctx, hostEnd)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(); cancel(); guestEnd.Close() })
	return c, t.TempDir()
}

// socketPair returns two connected sockets with kernel buffers, like the
// virtio-serial port QEMU provides (net.Pipe is unbuffered).
func socketPair(t *testing.T) (net.Conn, net.Conn) {
	t.Helper()
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	conns := make([]net.Conn, 2)
	for i, fd := range fds {
		f := os.NewFile(uintptr(fd), "socketpair")
		c, err := net.FileConn(f)
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		conns[i] = c
	}
	return conns[0], conns[1]
}

func TestExec(t *testing.T) {
	c, _ := newPair(t)
	ctx := context.Background()
	res, err := c.Exec(ctx, agentproto.ExecRequest{Command: "echo out; echo err >&2; exit 3"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := string(res.Stdout), "out\n"; got != want {
		t.Errorf("stdout = %q, want %q", got, want)
	}
	if got, want := string(res.Stderr), "err\n"; got != want {
		t.Errorf("stderr = %q, want %q", got, want)
	}
	if res.ExitCode == nil || *res.ExitCode != 3 {
		t.Errorf("exit code = %v, want 3", res.ExitCode)
	}

	res, err = c.Exec(ctx, agentproto.ExecRequest{Argv: []string{"cat"}, Stdin: []byte("hello\x00bin")}, nil)
	if err != nil || string(res.Stdout) != "hello\x00bin" {
		t.Errorf("argv+stdin: got %q, %v", res.Stdout, err)
	}
	res, err = c.Exec(ctx, agentproto.ExecRequest{Argv: []string{"no-such-program-xyz"}}, nil)
	if err != nil || res.ExitCode == nil || *res.ExitCode != 127 {
		t.Errorf("missing program: got %+v, %v; want exit 127", res, err)
	}
}

func TestExecTimeoutKillsGroup(t *testing.T) {
	c, _ := newPair(t)
	start := time.Now()
	res, err := c.Exec(context.Background(), agentproto.ExecRequest{
		Command: "echo before; (sleep 30; echo child) & sleep 30", TimeoutMs: 500,
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !res.TimedOut || res.ExitCode != nil || res.State != agentproto.StateTimedOut {
		t.Errorf("got timedOut=%v exit=%v state=%s, want timed out with nil exit", res.TimedOut, res.ExitCode, res.State)
	}
	if string(res.Stdout) != "before\n" {
		t.Errorf("stdout = %q, want output so far", res.Stdout)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("took %s: the background child kept the call open", d)
	}
}

func TestExecTruncates(t *testing.T) {
	c, _ := newPair(t)
	res, err := c.Exec(context.Background(), agentproto.ExecRequest{
		Command: "head -c 10485760 /dev/zero | tr '\\0' a", MaxOutput: 64 << 10,
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Stdout) != 64<<10 || !res.StdoutTruncated || res.StderrTruncated {
		t.Errorf("got %d bytes, truncated=%v/%v; want 65536, true/false", len(res.Stdout), res.StdoutTruncated, res.StderrTruncated)
	}
	if res.ExitCode == nil || *res.ExitCode != 0 {
		t.Errorf("exit = %v, want 0", res.ExitCode)
	}
}

func TestExecStreamOffsets(t *testing.T) {
	c, _ := newPair(t)
	var events []agentproto.Event
	var got bytes.Buffer
	res, err := c.Exec(context.Background(), agentproto.ExecRequest{
		Command: "for i in $(seq 1 200); do echo line$i; echo e$i >&2; done", Stream: true,
	}, func(ev agentproto.Event) error {
		events = append(events, ev)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if events[0].Type != "start" || events[0].ProcessID == "" {
		t.Fatalf("first event = %+v, want start with a process id", events[0])
	}
	var next int64
	for _, ev := range events[1 : len(events)-1] {
		if ev.Offset != next {
			t.Fatalf("event at offset %d, want %d (gap or reorder)", ev.Offset, next)
		}
		next += int64(len(ev.Data))
		if ev.Type == "stdout" {
			got.Write(ev.Data)
		}
	}
	last := events[len(events)-1]
	if last.Type != "exit" || last.Offset != next || res.ExitCode == nil || *res.ExitCode != 0 {
		t.Errorf("last event %+v (offset %d), want exit at %d with code 0", last, last.Offset, next)
	}
	if !strings.HasPrefix(got.String(), "line1\nline2\n") || !strings.HasSuffix(got.String(), "line200\n") {
		t.Errorf("stdout stream incomplete: %q...", got.String()[:min(40, got.Len())])
	}
}

func TestSpawnAndOutput(t *testing.T) {
	c, _ := newPair(t)
	ctx := context.Background()
	p, err := c.Spawn(ctx, agentproto.ExecRequest{Command: "echo started; sleep 0.3; echo done"})
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	var exit *agentproto.ExecResult
	err = c.ProcessOutput(ctx, agentproto.ProcessRequest{ID: p.ID, Follow: true}, func(ev agentproto.Event) error {
		out.Write(ev.Data)
		if ev.Type == "exit" {
			exit = ev.Exit
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if out.String() != "started\ndone\n" || exit == nil || *exit.ExitCode != 0 {
		t.Errorf("follow got %q, exit %+v", out.String(), exit)
	}
	procs, err := c.Processes(ctx)
	if err != nil || len(procs) != 1 || procs[0].State != agentproto.StateExited {
		t.Errorf("processes = %+v, %v", procs, err)
	}

	p, err = c.Spawn(ctx, agentproto.ExecRequest{Command: "sleep 60"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Signal(ctx, p.ID, "TERM"); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		info, err := c.Process(ctx, p.ID)
		if err != nil {
			t.Fatal(err)
		}
		if info.State == agentproto.StateKilled && info.ExitCode != nil && *info.ExitCode == -15 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after SIGTERM: %+v", info)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if _, err := c.Process(ctx, "proc_999"); !errdefs.IsNotFound(err) {
		t.Errorf("unknown process: got %v, want not found", err)
	}
}

func TestFiles(t *testing.T) {
	c, dir := newPair(t)
	ctx := context.Background()
	data := make([]byte, 300<<10)
	_, _ = rand.Read(data)
	for i := range 256 {
		data[i] = byte(i)
	}
	p := filepath.Join(dir, "a/b/blob.bin")
	e, err := c.WriteFile(ctx, p, 0o600, int64(len(data)), bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	if e.Size != int64(len(data)) || e.Mode != "600" || e.Type != agentproto.TypeFile {
		t.Errorf("entry = %+v", e)
	}
	e, r, err := c.ReadFile(ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(r)
	r.Close()
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("read back %d bytes (err %v), want the %d written", len(got), err, len(data))
	}
	if _, _, err := c.ReadFile(ctx, filepath.Join(dir, "missing")); errdefs.Code(err) != "file_not_found" {
		t.Errorf("missing file: got %v, want file_not_found", err)
	}
	if _, _, err := c.ReadFile(ctx, dir); errdefs.Code(err) != "is_a_directory" {
		t.Errorf("directory: got %v, want is_a_directory", err)
	}
	if _, err := c.WriteFile(ctx, filepath.Join(dir, "a"), 0, 3, strings.NewReader("abc")); errdefs.Code(err) != "is_a_directory" {
		t.Errorf("write over a directory: got %v", err)
	}
	// The connection stays usable after a refused write.
	if _, err := c.Mkdir(ctx, filepath.Join(dir, "x/y"), true); err != nil {
		t.Fatal(err)
	}
	es, err := c.List(ctx, agentproto.FileRequest{Path: dir, Depth: 3})
	if err != nil {
		t.Fatal(err)
	}
	var paths []string
	for _, e := range es {
		paths = append(paths, strings.TrimPrefix(e.Path, dir))
	}
	if got, want := strings.Join(paths, " "), "/a /a/b /a/b/blob.bin /x /x/y"; got != want {
		t.Errorf("list = %s, want %s", got, want)
	}
	removed, err := c.Remove(ctx, filepath.Join(dir, "a"), false)
	if errdefs.Code(err) != "directory_not_empty" {
		t.Errorf("non-recursive remove of a full dir: %v %v", removed, err)
	}
	if removed, err := c.Remove(ctx, filepath.Join(dir, "a"), true); err != nil || !removed {
		t.Errorf("recursive remove: %v %v", removed, err)
	}
	if removed, err := c.Remove(ctx, filepath.Join(dir, "a"), true); err != nil || removed {
		t.Errorf("second remove: %v %v, want false, nil", removed, err)
	}
	if _, err := c.Stat(ctx, filepath.Join(dir, "a")); !errdefs.IsNotFound(err) {
		t.Errorf("stat removed: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "x/y")); err != nil {
		t.Error(err)
	}
}

func TestChmod(t *testing.T) {
	c, dir := newPair(t)
	ctx := context.Background()
	p := filepath.Join(dir, "s.sh")
	if _, err := c.WriteFile(ctx, p, 0o644, 3, strings.NewReader("abc")); err != nil {
		t.Fatal(err)
	}
	e, err := c.Chmod(ctx, p, 0o755)
	if err != nil || e.Mode != "755" || e.Path != p {
		t.Fatalf("chmod: %+v %v", e, err)
	}
	if fi, err := os.Stat(p); err != nil || fi.Mode().Perm() != 0o755 {
		t.Errorf("file mode %v %v, want 0755", fi.Mode(), err)
	}
	if e, err := c.Chmod(ctx, p, 0); err != nil || e.Mode != "0" {
		t.Errorf("chmod 0: %+v %v", e, err)
	}
	for _, tc := range []struct {
		name, path string
		mode       uint32
		code       string
	}{
		{"missing", filepath.Join(dir, "missing"), 0o644, "file_not_found"},
		{"type bits", p, 0o100644, "invalid_request"},
		{"NUL", p + "\x00", 0o644, "invalid_request"},
		{"empty", "", 0o644, "invalid_request"},
	} {
		if _, err := c.Chmod(ctx, tc.path, tc.mode); errdefs.Code(err) != tc.code {
			t.Errorf("%s: got %v (%s), want %s", tc.name, err, errdefs.Code(err), tc.code)
		}
	}
}

func TestCancelledCallReleasesStream(t *testing.T) {
	c, _ := newPair(t)
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	_, err := c.Exec(ctx, agentproto.ExecRequest{Command: "sleep 5", Stream: true}, nil)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("got %v, want deadline exceeded", err)
	}
	if _, err := c.Info(context.Background()); err != nil {
		t.Errorf("session unusable after a cancelled call: %v", err)
	}
}
