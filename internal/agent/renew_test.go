package agent

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/emberbox/emberbox/internal/agentproto"
	"github.com/emberbox/emberbox/internal/errdefs"
	"github.com/emberbox/emberbox/internal/guest"
)

// fakeSystem records what renew asks of the kernel and imitates it, so no
// test changes the entropy pool, clock, hostname or mounts of the host it
// runs on. A bind copies the file's bytes onto its target (under a test's
// temporary root) and an unmount puts back what was there before.
type fakeSystem struct {
	mu       sync.Mutex
	calls    []string
	seeds    [][]byte
	now      time.Time // zero: the real clock
	clock    time.Time // the last SetClock
	hostname string
	binds    map[string][]string // target → bound files, the last on top
	under    map[string][]byte   // target → its bytes before the first bind
	fail     map[string]error    // call name → its error
}

func newFakeSystem() *fakeSystem {
	return &fakeSystem{binds: map[string][]string{}, under: map[string][]byte{}, fail: map[string]error{}}
}

func (s *fakeSystem) record(call string) error {
	s.calls = append(s.calls, call)
	return s.fail[call]
}

func (s *fakeSystem) Reseed(seed []byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.seeds = append(s.seeds, bytes.Clone(seed))
	return s.record("reseed")
}

func (s *fakeSystem) Now() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.now.IsZero() {
		return time.Now()
	}
	return s.now
}

func (s *fakeSystem) SetClock(t time.Time) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.record("clock"); err != nil {
		return err
	}
	s.clock = t
	if !s.now.IsZero() {
		s.now = t
	}
	return nil
}

func (s *fakeSystem) SetHostname(name string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.record("hostname"); err != nil {
		return err
	}
	s.hostname = name
	return nil
}

func (s *fakeSystem) Unmount(target string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.record("unmount"); err != nil {
		return err
	}
	stack := s.binds[target]
	if len(stack) == 0 {
		return unix.EINVAL
	}
	stack = stack[:len(stack)-1]
	s.binds[target] = stack
	data := s.under[target]
	if len(stack) > 0 {
		data, _ = os.ReadFile(stack[len(stack)-1])
	}
	return os.WriteFile(target, data, 0o444)
}

func (s *fakeSystem) BindReadOnly(file, target string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.record("bind"); err != nil {
		return err
	}
	data, err := os.ReadFile(file)
	if err != nil {
		return err
	}
	if len(s.binds[target]) == 0 {
		under, err := os.ReadFile(target)
		if err != nil {
			return err // a mount needs its target to exist
		}
		s.under[target] = under
	}
	s.binds[target] = append(s.binds[target], file)
	fi, err := os.Stat(file)
	if err != nil {
		return err
	}
	if err := os.WriteFile(target, data, 0o444); err != nil {
		return err
	}
	return os.Chmod(target, fi.Mode().Perm())
}

func (s *fakeSystem) snapshot() (calls []string, hostname string, depth int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, st := range s.binds {
		depth = max(depth, len(st))
	}
	return append([]string(nil), s.calls...), s.hostname, depth
}

// The image's /etc/hosts (internal/guestimage/recipe.go).
const imageHosts = "127.0.0.1\tlocalhost\n127.0.1.1\temberbox\n::1\t\tlocalhost ip6-localhost ip6-loopback\n"

const kernelBootID = "0f5e0f36-0000-4000-8000-000000000000\n"

// newRenewAgent returns an agent whose root is a temporary copy of what
// renew touches in a guest, and the fake system it renews.
func newRenewAgent(t *testing.T) (*Agent, *fakeSystem) {
	t.Helper()
	a := newTestAgent(t, os.Geteuid(), os.Getegid(), t.TempDir())
	for p, data := range map[string]string{
		"etc/hostname": "emberbox\n", "etc/hosts": imageHosts, "etc/machine-id": "",
		"proc/sys/kernel/random/boot_id": kernelBootID,
	} {
		p = filepath.Join(a.root, p)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	sys := newFakeSystem()
	a.sys = sys
	return a, sys
}

func renewReq(r agentproto.RenewRequest) agentproto.Request {
	return agentproto.Request{Method: agentproto.MethodRenew, Renew: &r}
}

func readFile(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

var (
	testSeed  = bytes.Repeat([]byte{0xa5}, 64)
	fullRenew = agentproto.RenewRequest{
		Seed:      testSeed,
		UnixNano:  time.Date(2027, 3, 4, 5, 6, 7, 8, time.UTC).UnixNano(),
		Hostname:  "sbx-copy-2",
		MachineID: "0123456789abcdef0123456789abcdef",
		BootID:    "3F2504E0-4F89-11D3-9A0C-0305E82C3301",
	}
)

func TestRenewValidation(t *testing.T) {
	long := strings.Repeat("a", 63)
	for _, tc := range []struct {
		name    string
		req     agentproto.RenewRequest
		reseeds bool // the seed goes in before the rest is checked
	}{
		{"seed too long", agentproto.RenewRequest{Seed: make([]byte, 513), Hostname: "ok"}, false},
		{"negative clock", agentproto.RenewRequest{Seed: testSeed, UnixNano: -1}, true},
		{"clock before 2020", agentproto.RenewRequest{UnixNano: time.Date(2019, 12, 31, 23, 59, 59, 0, time.UTC).UnixNano()}, false},
		{"hostname leading hyphen", agentproto.RenewRequest{Seed: testSeed, Hostname: "-a"}, true},
		{"hostname trailing hyphen", agentproto.RenewRequest{Hostname: "a-"}, false},
		{"hostname empty label", agentproto.RenewRequest{Hostname: "a..b"}, false},
		{"hostname trailing dot", agentproto.RenewRequest{Hostname: "a."}, false},
		{"hostname space", agentproto.RenewRequest{Hostname: "a b"}, false},
		{"hostname underscore", agentproto.RenewRequest{Hostname: "a_b"}, false},
		{"hostname newline", agentproto.RenewRequest{Hostname: "a\n127.0.0.1 evil"}, false},
		{"hostname non-ASCII", agentproto.RenewRequest{Hostname: "bücher"}, false},
		{"hostname label of 64", agentproto.RenewRequest{Hostname: long + "a"}, false},
		{"hostname of 65", agentproto.RenewRequest{Hostname: long[:32] + "." + long[:32]}, false},
		{"machine id short", agentproto.RenewRequest{MachineID: "0123456789abcdef0123456789abcde"}, false},
		{"machine id long", agentproto.RenewRequest{MachineID: "0123456789abcdef0123456789abcdef0"}, false},
		{"machine id upper case", agentproto.RenewRequest{MachineID: "0123456789ABCDEF0123456789ABCDEF"}, false},
		{"machine id not hex", agentproto.RenewRequest{MachineID: "0123456789abcdef0123456789abcdeg"}, false},
		{"machine id zero", agentproto.RenewRequest{MachineID: strings.Repeat("0", 32)}, false},
		{"boot id without dashes", agentproto.RenewRequest{BootID: "3f2504e04f8911d39a0c0305e82c3301"}, false},
		{"boot id dash moved", agentproto.RenewRequest{BootID: "3f2504e0-4f8911d3-9a0c-0305e82c-3301"}, false},
		{"boot id not hex", agentproto.RenewRequest{Seed: testSeed, BootID: "3f2504e0-4f89-11d3-9a0c-0305e82c330g"}, true},
		{"boot id braces", agentproto.RenewRequest{BootID: "{3f2504e0-4f89-11d3-9a0c-0305e82c33}"}, false},
		// One bad field refuses the whole identity, good fields included.
		{"good hostname, bad boot id", agentproto.RenewRequest{Hostname: "fine", MachineID: fullRenew.MachineID, BootID: "x"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, sys := newRenewAgent(t)
			rep := call(t, a, renewReq(tc.req))
			if rep.Error == nil || rep.Error.Code != agentproto.CodeInvalid || rep.OK {
				t.Fatalf("reply %+v %+v, want %s", rep, rep.Error, agentproto.CodeInvalid)
			}
			calls, _, _ := sys.snapshot()
			want := []string(nil)
			if tc.reseeds {
				want = []string{"reseed"}
			}
			if fmt.Sprint(calls) != fmt.Sprint(want) {
				t.Errorf("system calls %v, want %v", calls, want)
			}
			if got := readFile(t, filepath.Join(a.root, "etc/hosts")); got != imageHosts {
				t.Errorf("/etc/hosts changed to %q", got)
			}
			if got := readFile(t, filepath.Join(a.root, "etc/hostname")); got != "emberbox\n" {
				t.Errorf("/etc/hostname changed to %q", got)
			}
			if got := readFile(t, filepath.Join(a.root, "etc/machine-id")); got != "" {
				t.Errorf("/etc/machine-id changed to %q", got)
			}
		})
	}
	if rep := call(t, &Agent{sys: newFakeSystem()}, agentproto.Request{Method: agentproto.MethodRenew}); rep.Error == nil || rep.Error.Code != agentproto.CodeInvalid {
		t.Errorf("renew without a body: %+v", rep.Error)
	}
}

func TestValidHostname(t *testing.T) {
	long := strings.Repeat("a", 63)
	for _, ok := range []string{"a", "emberbox", "sbx-1", "1sbx", "A-b.C-d", "a.b.c", long, long[:31] + "." + long[:32], "0"} {
		if !validHostname(ok) {
			t.Errorf("%q refused", ok)
		}
	}
}

func TestRenewOrderAndFiles(t *testing.T) {
	a, sys := newRenewAgent(t)
	dbus := filepath.Join(a.root, "var/lib/dbus/machine-id")
	if err := os.MkdirAll(filepath.Dir(dbus), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dbus, []byte("ffffffffffffffffffffffffffffffff\n"), 0o444); err != nil {
		t.Fatal(err)
	}
	if rep := call(t, a, renewReq(fullRenew)); rep.Error != nil || !rep.OK {
		t.Fatalf("renew: %+v %+v", rep, rep.Error)
	}
	calls, hostname, depth := sys.snapshot()
	if want := "[reseed clock hostname unmount bind]"; fmt.Sprint(calls) != want {
		t.Errorf("system calls %v, want %s (the seed first)", calls, want)
	}
	if len(sys.seeds) != 1 || !bytes.Equal(sys.seeds[0], testSeed) {
		t.Errorf("seeds %x, want %x", sys.seeds, testSeed)
	}
	if !sys.clock.Equal(time.Unix(0, fullRenew.UnixNano)) {
		t.Errorf("clock set to %v, want %v", sys.clock, time.Unix(0, fullRenew.UnixNano))
	}
	if hostname != fullRenew.Hostname || depth != 1 {
		t.Errorf("hostname %q, binds %d; want %q, 1", hostname, depth, fullRenew.Hostname)
	}
	wantID := fullRenew.MachineID + "\n"
	wantBoot := strings.ToLower(fullRenew.BootID) + "\n"
	for _, f := range []struct {
		path, data string
		mode       os.FileMode
	}{
		{"etc/hostname", "sbx-copy-2\n", 0o644},
		{"etc/hosts", "127.0.0.1\tlocalhost\n127.0.1.1\tsbx-copy-2\n::1\t\tlocalhost ip6-localhost ip6-loopback\n", 0o644},
		{"etc/machine-id", wantID, 0o444},
		{"var/lib/dbus/machine-id", wantID, 0o444},
		{"run/emberbox/boot_id", wantBoot, 0o444},
		{"proc/sys/kernel/random/boot_id", wantBoot, 0o444}, // through the bind
	} {
		p := filepath.Join(a.root, f.path)
		if got := readFile(t, p); got != f.data {
			t.Errorf("%s = %q, want %q", f.path, got, f.data)
		}
		if fi, err := os.Stat(p); err != nil || fi.Mode().Perm() != f.mode {
			t.Errorf("%s: mode %v %v, want %v", f.path, fi.Mode().Perm(), err, f.mode)
		}
	}
	// A D-Bus id that links to /etc/machine-id is left a link.
	if err := os.Remove(dbus); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/etc/machine-id", dbus); err != nil {
		t.Fatal(err)
	}
	if rep := call(t, a, renewReq(agentproto.RenewRequest{MachineID: "fedcba9876543210fedcba9876543210"})); rep.Error != nil {
		t.Fatal(rep.Error)
	}
	if fi, err := os.Lstat(dbus); err != nil || fi.Mode()&os.ModeSymlink == 0 {
		t.Errorf("D-Bus machine id link replaced: %v %v", fi.Mode(), err)
	}
	if got := readFile(t, filepath.Join(a.root, "etc/machine-id")); got != "fedcba9876543210fedcba9876543210\n" {
		t.Errorf("/etc/machine-id = %q", got)
	}
}

// TestRenewRepeats: renews are safe to repeat, with the same request or
// new identities: one bind, one 127.0.1.1 line, no temporary files left.
func TestRenewRepeats(t *testing.T) {
	a, sys := newRenewAgent(t)
	second := fullRenew
	second.Hostname, second.BootID = "sbx-copy-3", "c0ffee00-0000-4000-8000-0000000000ff"
	var lastFiles map[string]string
	for i, req := range []agentproto.RenewRequest{fullRenew, fullRenew, second, second} {
		if rep := call(t, a, renewReq(req)); rep.Error != nil || !rep.OK {
			t.Fatalf("renew %d: %+v", i, rep.Error)
		}
		_, hostname, depth := sys.snapshot()
		if hostname != req.Hostname || depth != 1 {
			t.Errorf("renew %d: hostname %q, %d binds; want %q, 1", i, hostname, depth, req.Hostname)
		}
		hosts := readFile(t, filepath.Join(a.root, "etc/hosts"))
		if strings.Count(hosts, "127.0.1.1") != 1 || !strings.Contains(hosts, "127.0.1.1\t"+req.Hostname+"\n") || !strings.HasPrefix(hosts, "127.0.0.1\tlocalhost\n") {
			t.Errorf("renew %d: /etc/hosts %q", i, hosts)
		}
		if got, want := readFile(t, filepath.Join(a.root, bootIDPath)), strings.ToLower(req.BootID)+"\n"; got != want {
			t.Errorf("renew %d: boot_id reads %q, want %q", i, got, want)
		}
		files := map[string]string{}
		for _, dir := range []string{"etc", "run/emberbox"} {
			ents, err := os.ReadDir(filepath.Join(a.root, dir))
			if err != nil {
				t.Fatal(err)
			}
			for _, e := range ents {
				if strings.Contains(e.Name(), ".emberbox-") {
					t.Errorf("renew %d: temporary file %s/%s left", i, dir, e.Name())
				}
				files[dir+"/"+e.Name()] = readFile(t, filepath.Join(a.root, dir, e.Name()))
			}
		}
		if i%2 == 1 && fmt.Sprint(files) != fmt.Sprint(lastFiles) {
			t.Errorf("renew %d repeated changed the files:\n%v\n%v", i, lastFiles, files)
		}
		lastFiles = files
	}
	// Taking the last bind off shows the kernel's own id again.
	if err := sys.Unmount(filepath.Join(a.root, bootIDPath)); err != nil {
		t.Fatal(err)
	}
	if got := readFile(t, filepath.Join(a.root, bootIDPath)); got != kernelBootID {
		t.Errorf("under the binds: %q", got)
	}
}

// TestRenewWake is a renew after a pause: seed and clock only.
func TestRenewWake(t *testing.T) {
	now := time.Date(2027, 1, 2, 3, 4, 5, 0, time.UTC)
	for _, tc := range []struct {
		behind time.Duration
		steps  bool
	}{
		{230 * time.Second, true},
		{-5 * time.Second, true}, // ahead
		{clockTolerance + time.Millisecond, true},
		{clockTolerance, false},
		{-clockTolerance / 2, false},
		{0, false},
	} {
		a, sys := newRenewAgent(t)
		sys.now = now.Add(-tc.behind)
		req := agentproto.RenewRequest{Seed: testSeed, UnixNano: now.UnixNano()}
		if rep := call(t, a, renewReq(req)); rep.Error != nil || !rep.OK {
			t.Fatalf("behind %v: %+v", tc.behind, rep.Error)
		}
		calls, hostname, depth := sys.snapshot()
		want := "[reseed]"
		if tc.steps {
			want = "[reseed clock]"
		}
		if fmt.Sprint(calls) != want || hostname != "" || depth != 0 {
			t.Errorf("behind %v: calls %v, hostname %q, binds %d; want %s and nothing else", tc.behind, calls, hostname, depth, want)
		}
		if tc.steps && !sys.clock.Equal(now) {
			t.Errorf("behind %v: clock set to %v, want %v", tc.behind, sys.clock, now)
		}
		if got := readFile(t, filepath.Join(a.root, "etc/hosts")); got != imageHosts {
			t.Errorf("behind %v: /etc/hosts changed to %q", tc.behind, got)
		}
	}
}

func TestRenewSystemErrors(t *testing.T) {
	for _, call1 := range []string{"reseed", "clock", "hostname", "unmount", "bind"} {
		a, sys := newRenewAgent(t)
		sys.fail[call1] = unix.EPERM
		rep := call(t, a, renewReq(fullRenew))
		if rep.Error == nil || rep.Error.Code != agentproto.CodeInternal || !strings.Contains(rep.Error.Message, "operation not permitted") {
			t.Errorf("%s failing: %+v", call1, rep.Error)
		}
		calls, _, _ := sys.snapshot()
		if calls[len(calls)-1] != call1 {
			t.Errorf("%s failing: went on to %v", call1, calls)
		}
	}
	// An unmount that never stops taking mounts off ends.
	a, sys := newRenewAgent(t)
	target := filepath.Join(a.root, bootIDPath)
	sys.binds[target] = make([]string, 100)
	if rep := call(t, a, renewReq(agentproto.RenewRequest{BootID: fullRenew.BootID})); rep.Error == nil || rep.Error.Code != agentproto.CodeInternal {
		t.Errorf("100 binds: %+v", rep.Error)
	}
}

// TestRenewRefusedOffGuest: an agent that is not a guest's init, with no
// System given, changes nothing.
func TestRenewRefusedOffGuest(t *testing.T) {
	if os.Getpid() == 1 {
		t.Skip("running as PID 1")
	}
	a := newTestAgent(t, os.Geteuid(), os.Getegid(), t.TempDir())
	if a.sys != nil {
		t.Fatalf("an agent off a guest has the system %T", a.sys)
	}
	rep := call(t, a, renewReq(fullRenew))
	if rep.Error == nil || rep.Error.Code != agentproto.CodeInternal {
		t.Errorf("renew: %+v", rep.Error)
	}
	if _, err := os.Stat(filepath.Join(a.root, "etc/hostname")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("/etc/hostname written: %v", err)
	}
}

func TestHostsWithName(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"", "127.0.1.1\tn\n"},
		{"127.0.0.1 localhost", "127.0.0.1 localhost\n127.0.1.1\tn\n"},
		{imageHosts, "127.0.0.1\tlocalhost\n127.0.1.1\tn\n::1\t\tlocalhost ip6-localhost ip6-loopback\n"},
		{"# 127.0.1.1 old\n127.0.1.1 old.example old # mine\n10.0.0.1 db\n127.0.1.1 other\n", "# 127.0.1.1 old\n127.0.1.1\tn\n10.0.0.1 db\n127.0.1.1 other\n"},
		{"  127.0.1.1\told\n\n", "127.0.1.1\tn\n\n"},
		{"127.0.1.10 x\n", "127.0.1.10 x\n127.0.1.1\tn\n"},
	} {
		got := string(hostsWithName([]byte(tc.in), "n"))
		if got != tc.want {
			t.Errorf("hostsWithName(%q) = %q, want %q", tc.in, got, tc.want)
		}
		if again := string(hostsWithName([]byte(got), "n")); again != got {
			t.Errorf("hostsWithName twice on %q: %q, then %q", tc.in, got, again)
		}
	}
}

// TestRenewOverConn sends renew the way the host does: guest.Client over a
// handshake and yamux session, in agentproto frames.
func TestRenewOverConn(t *testing.T) {
	a, sys := newRenewAgent(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	hostEnd, guestEnd := net.Pipe()
	served := make(chan error, 1)
	go func() { served <- a.ServeConn(ctx, guestEnd) }()
	c, err := guest.Handshake(ctx, hostEnd)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		c.Close()
		guestEnd.Close()
		<-served
	}()
	if err := c.Renew(ctx, fullRenew); err != nil {
		t.Fatal(err)
	}
	if calls, hostname, _ := sys.snapshot(); fmt.Sprint(calls) != "[reseed clock hostname unmount bind]" || hostname != fullRenew.Hostname {
		t.Errorf("calls %v, hostname %q", calls, hostname)
	}
	if got := readFile(t, filepath.Join(a.root, bootIDPath)); got != strings.ToLower(fullRenew.BootID)+"\n" {
		t.Errorf("boot_id reads %q", got)
	}
	err = c.Renew(ctx, agentproto.RenewRequest{Hostname: "no_underscores"})
	if !errdefs.IsInvalidArgument(err) {
		t.Errorf("invalid hostname: %v, want invalid argument", err)
	}
}
