package vmmtest

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/user"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/emberbox/emberbox/internal/agent"
	"github.com/emberbox/emberbox/internal/vmm"
)

// Driver is an in-process fake vmm.Driver. Attach finds the machines this
// Driver started, so a second user of the same Driver (a new manager, say)
// plays a server restarted beside VMs that kept running; a stopped machine
// is gone.
type Driver struct {
	agent *agent.Agent

	mu       sync.Mutex
	hang     int // this many next starts get a guest that never answers
	starts   int
	serial   int                 // numbers machines, so records name one
	machines map[string]*Machine // by sandbox id: the newest one started

	failResumes, failPauses int // FailResumes, FailPauses
	failMoved               int // FailMoved
	resumes, continues      int
}

// NewDriver returns a Driver whose guests run commands as the user running
// the test, with the host's file system as theirs. The test's cleanup stops
// every machine.
//
// The guests' agent reaps every child of the test process, as PID 1 does in
// a guest, so a test using Driver must not wait for child processes of its
// own (exec.Cmd.Wait would lose their exit status).
func NewDriver(t testing.TB) *Driver {
	t.Helper()
	u, err := user.Current()
	if err != nil {
		t.Fatal(err)
	}
	// The agent reads accounts from its root and renew writes /etc/hostname
	// and the like there: a copy of the host's account files, so that a
	// renew never touches the host's, and a System that changes nothing.
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "etc"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"passwd", "group"} {
		b, err := os.ReadFile(filepath.Join("/etc", f))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, "etc", f), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	a, err := agent.New(agent.Config{Root: root, User: u.Username, System: &System{}})
	if err != nil {
		t.Fatal(err)
	}
	d := &Driver{agent: a, machines: map[string]*Machine{}}
	t.Cleanup(d.stopAll)
	return d
}

// System is the guests' system as renew sees it: it records what it was
// asked and changes nothing of the host's.
type System struct {
	mu       sync.Mutex
	Reseeds  int
	Hostname string
}

func (s *System) Reseed(seed []byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.Reseeds++
	return nil
}
func (s *System) Now() time.Time                 { return time.Now() }
func (s *System) SetClock(time.Time) error       { return nil }
func (s *System) Unmount(string) error           { return unix.EINVAL }
func (s *System) BindReadOnly(_, _ string) error { return nil }
func (s *System) SetHostname(name string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.Hostname = name
	return nil
}

// Name implements vmm.Driver.Name.
func (d *Driver) Name() string { return "fake" }

// Accel implements vmm.Driver.Accel.
func (d *Driver) Accel() string { return "tcg" }

// HangStarts makes the next n starts return machines whose guest never
// answers, like a VM whose boot hangs: their DialGuest waits until its
// context ends or the machine stops.
func (d *Driver) HangStarts(n int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.hang = n
}

// Starts reports how many times Start has been called.
func (d *Driver) Starts() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.starts
}

// Machine returns the machine started last for the sandbox id, stopped or
// not, or nil if none was.
func (d *Driver) Machine(id string) *Machine {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.machines[id]
}

// Start implements vmm.Driver.Start. A fresh start makes a disk in
// spec.Dir (when it has one); with KeepDisk that disk must be there.
func (d *Driver) Start(ctx context.Context, spec vmm.Spec) (vmm.Machine, error) {
	if spec.Dir != "" {
		disk := filepath.Join(spec.Dir, diskFile)
		if spec.KeepDisk {
			if _, err := os.Stat(disk); err != nil {
				return nil, fmt.Errorf("fake start from the kept disk: %w", err)
			}
		} else if err := os.MkdirAll(spec.Dir, 0o700); err != nil {
			return nil, err
		} else if err := os.WriteFile(disk, nil, 0o600); err != nil {
			return nil, err
		}
	}
	d.mu.Lock()
	d.starts++
	d.mu.Unlock()
	return d.start(spec), nil
}

// start registers a new machine of spec.
func (d *Driver) start(spec vmm.Spec) *Machine {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.serial++
	m := &Machine{d: d, id: spec.ID, dir: spec.Dir, serial: d.serial, spec: spec, done: make(chan struct{})}
	m.AddCPU(BootCPU) // a booting VM burns CPU before its guest is ready
	if d.hang > 0 {
		d.hang--
		m.hung = true
	}
	d.machines[spec.ID] = m
	return m
}

// Spec is the spec the machine was started with.
func (m *Machine) Spec() vmm.Spec { return m.spec }

// record is what Machine.Record returns.
type record struct {
	ID     string `json:"id"`
	Serial int    `json:"serial"`
}

// Attach implements vmm.Driver.Attach.
func (d *Driver) Attach(ctx context.Context, spec vmm.Spec, rec []byte) (vmm.Machine, error) {
	var r record
	if err := json.Unmarshal(rec, &r); err != nil {
		return nil, fmt.Errorf("bad vm record: %w", err)
	}
	if r.ID != spec.ID {
		return nil, fmt.Errorf("the record is sandbox %q's, not %q's", r.ID, spec.ID)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	m := d.machines[spec.ID]
	if m == nil || m.serial != r.Serial || m.Stopped() {
		return nil, vmm.ErrGone
	}
	return m, nil
}

func (d *Driver) stopAll() {
	d.mu.Lock()
	ms := make([]*Machine, 0, len(d.machines))
	for _, m := range d.machines {
		ms = append(ms, m)
	}
	d.mu.Unlock()
	for _, m := range ms {
		m.Stop(context.Background())
	}
}

// Machine is a machine of a Driver: a guest agent served in the test
// process.
type Machine struct {
	d      *Driver
	id     string
	dir    string
	serial int
	hung   bool
	spec   vmm.Spec
	once   sync.Once
	done   chan struct{}

	cpu atomic.Int64 // nanoseconds of "VMM" CPU; AddCPU
	rss atomic.Int64
	// oomScore is one more than the score SetOOMScore set, 0 for none.
	oomScore atomic.Int64
}

// BootCPU is the CPU time every fake machine has used when it starts.
const BootCPU = time.Millisecond

// AddCPU adds d to the CPU time the machine's Usage reports, as if its VMM
// had been busy for d.
func (m *Machine) AddCPU(d time.Duration) { m.cpu.Add(int64(d)) }

// SetRSS sets the resident memory its Usage reports while it runs.
func (m *Machine) SetRSS(n int64) { m.rss.Store(n) }

// SetOOMScore implements vmm.OOMScorer: it records adj for OOMScore.
func (m *Machine) SetOOMScore(adj int) error {
	m.oomScore.Store(int64(adj) + 1)
	return nil
}

// OOMScore returns the score SetOOMScore last set, and false if none was.
func (m *Machine) OOMScore() (int, bool) {
	v := m.oomScore.Load()
	return int(v - 1), v != 0
}

// Usage implements vmm.Machine.Usage: the CPU that AddCPU gave it, final
// once it has stopped.
func (m *Machine) Usage() (vmm.Usage, error) {
	u := vmm.Usage{CPU: time.Duration(m.cpu.Load())}
	if m.Stopped() {
		u.Final = true
	} else {
		u.RSSBytes = m.rss.Load()
	}
	return u, nil
}

// Record implements vmm.Machine.Record.
func (m *Machine) Record() []byte {
	b, _ := json.Marshal(record{ID: m.id, Serial: m.serial})
	return b
}

// Accel implements vmm.Machine.Accel.
func (m *Machine) Accel() string { return "tcg" }

// PID implements vmm.Machine.PID: the test process is the "VMM".
func (m *Machine) PID() int { return os.Getpid() }

// Done implements vmm.Machine.Done.
func (m *Machine) Done() <-chan struct{} { return m.done }

// Stopped reports whether the machine has stopped.
func (m *Machine) Stopped() bool {
	select {
	case <-m.done:
		return true
	default:
		return false
	}
}

// Stop implements vmm.Machine.Stop. Open guest connections are closed, as
// when a VM exits; a test calls it to make a machine "exit by itself".
func (m *Machine) Stop(ctx context.Context) error {
	m.once.Do(func() { close(m.done) })
	return nil
}

// errStopped is what dialing a stopped machine returns.
var errStopped = fmt.Errorf("fake vm has stopped: %w", vmm.ErrGone)

// DialGuest implements vmm.Machine.DialGuest. Each connection gets its own
// session with the Driver's agent, which ends when the machine stops or the
// host closes its end.
func (m *Machine) DialGuest(ctx context.Context) (net.Conn, error) {
	if m.hung {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-m.done:
			return nil, errStopped
		}
	}
	if m.Stopped() {
		return nil, errStopped
	}
	host, guest, err := socketpair()
	if err != nil {
		return nil, err
	}
	gctx, cancel := context.WithCancel(context.Background())
	go func() {
		select {
		case <-m.done:
		case <-gctx.Done():
		}
		cancel()
		guest.Close()
	}()
	go func() {
		defer cancel()
		_ = m.d.agent.ServeConn(gctx, guest)
	}()
	return host, nil
}

// socketpair returns the two ends of a connected unix stream socket: unlike
// net.Pipe it buffers, as the socket of a real VM's serial port does.
func socketpair() (host, guest net.Conn, err error) {
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("socketpair: %w", err)
	}
	var conns [2]net.Conn
	for i, fd := range fds {
		f := os.NewFile(uintptr(fd), "fake-vm")
		conns[i], err = net.FileConn(f) // a dup: f is closed either way
		f.Close()
		if err != nil {
			if i == 0 {
				syscall.Close(fds[1])
			} else {
				conns[0].Close()
			}
			return nil, nil, fmt.Errorf("socketpair: %w", err)
		}
	}
	return conns[0], conns[1], nil
}
