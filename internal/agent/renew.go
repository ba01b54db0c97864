package agent

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/emberbox/emberbox/internal/agentproto"
)

// System is what renew changes outside the agent's root: the kernel's
// entropy pool, wall clock and hostname, and mounts. The agent of a guest
// (PID 1) uses the running kernel's; tests give an agent one of their own,
// so that nothing they do reaches the host they run on.
type System interface {
	// Reseed mixes seed into the kernel's entropy pool, crediting all of
	// its bits (RNDADDENTROPY), then has the kernel reseed its CRNG from
	// the pool at once (RNDRESEEDCRNG).
	Reseed(seed []byte) error
	// Now reads the wall clock; SetClock steps it.
	Now() time.Time
	SetClock(t time.Time) error
	SetHostname(name string) error
	// Unmount detaches the mount on top of target. It fails with EINVAL
	// when target is not a mount point.
	Unmount(target string) error
	// BindReadOnly bind-mounts file over target, read-only.
	BindReadOnly(file, target string) error
}

// Bounds and places of renew.
const (
	maxRenewSeed = 512 // bytes
	// clockTolerance is how far the guest's clock may be from the host's
	// before renew steps it; the request's own transit is in the gap.
	clockTolerance = 100 * time.Millisecond
	// maxBootIDBinds bounds the mounts renew takes off the boot id
	// before binding its own: one is the most it leaves.
	maxBootIDBinds = 16

	bootIDPath    = "/proc/sys/kernel/random/boot_id"
	bootIDFile    = "/run/emberbox/boot_id" // tmpfs (SetupSystem mounts /run)
	hostnamePath  = "/etc/hostname"
	hostsPath     = "/etc/hosts"
	machineIDPath = "/etc/machine-id"
	dbusIDPath    = "/var/lib/dbus/machine-id"
	hostsAddr     = "127.0.1.1" // Debian's address of the host's own name
)

// minRenewClock is the earliest wall clock renew accepts.
var minRenewClock = time.Date(2020, 1, 1, 0, 0, 0, 0, time.UTC)

// renew renews what a guest restored from saved memory shares with its past
// or with other copies of one snapshot (see agentproto.RenewRequest). The
// seed goes first, before anything in the request can draw randomness, and
// even when the rest of the request is invalid: mixing host entropy into
// the pool never hurts. The rest is checked as a whole before any of it is
// applied, then applied in order: clock, hostname, machine-id, boot id.
// Every step is safe to repeat.
func (a *Agent) renew(req *agentproto.RenewRequest) error {
	if len(req.Seed) > maxRenewSeed {
		return invalid(fmt.Sprintf("renew: seed of %d bytes, at most %d", len(req.Seed), maxRenewSeed))
	}
	if a.sys == nil {
		return &agentproto.Error{Code: agentproto.CodeInternal, Message: "renew: this agent is not a guest's init and changes no system"}
	}
	a.renewMu.Lock()
	defer a.renewMu.Unlock()
	if len(req.Seed) > 0 {
		if err := a.sys.Reseed(req.Seed); err != nil {
			return internal(fmt.Errorf("renew: reseeding the kernel's random pool: %w", err))
		}
	}
	bootID, err := checkRenew(req)
	if err != nil {
		return err
	}
	if req.UnixNano != 0 {
		want := time.Unix(0, req.UnixNano)
		if d := a.sys.Now().Sub(want); d > clockTolerance || d < -clockTolerance {
			if err := a.sys.SetClock(want); err != nil {
				return internal(fmt.Errorf("renew: setting the clock: %w", err))
			}
			a.log.Info("renew: clock stepped", "by", (-d).Round(time.Millisecond))
		}
	}
	if req.Hostname != "" {
		if err := a.renewHostname(req.Hostname); err != nil {
			return err
		}
	}
	if req.MachineID != "" {
		if err := a.renewMachineID(req.MachineID); err != nil {
			return err
		}
	}
	if bootID != "" {
		if err := a.renewBootID(bootID); err != nil {
			return err
		}
	}
	return nil
}

// checkRenew checks the fields of req other than the seed and returns its
// boot id in the kernel's form (lower case).
func checkRenew(req *agentproto.RenewRequest) (bootID string, err error) {
	if req.UnixNano != 0 && time.Unix(0, req.UnixNano).Before(minRenewClock) {
		return "", invalid(fmt.Sprintf("renew: clock %d is before %s", req.UnixNano, minRenewClock.Format(time.DateOnly)))
	}
	if req.Hostname != "" && !validHostname(req.Hostname) {
		return "", invalid(fmt.Sprintf("renew: invalid hostname %q", req.Hostname))
	}
	if req.MachineID != "" && !validMachineID(req.MachineID) {
		return "", invalid(fmt.Sprintf("renew: invalid machine id %q (32 lower-case hex digits, not all 0)", req.MachineID))
	}
	if req.BootID != "" {
		if !validUUID(req.BootID) {
			return "", invalid(fmt.Sprintf("renew: invalid boot id %q (a UUID)", req.BootID))
		}
		bootID = strings.ToLower(req.BootID)
	}
	return bootID, nil
}

// validHostname reports whether name is an RFC 1123 host name the kernel
// takes: dot-separated labels of letters, digits and inner hyphens, each
// at most 63 bytes, at most 64 bytes in all (the kernel's limit).
func validHostname(name string) bool {
	if len(name) == 0 || len(name) > 64 {
		return false
	}
	for _, label := range strings.Split(name, ".") {
		if len(label) == 0 || len(label) > 63 || label[0] == '-' || label[len(label)-1] == '-' {
			return false
		}
		for i := 0; i < len(label); i++ {
			c := label[i]
			if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-') {
				return false
			}
		}
	}
	return true
}

// validMachineID reports whether id is a machine-id(5): 32 lower-case hex
// digits, not all zero (systemd takes that for "none").
func validMachineID(id string) bool {
	if len(id) != 32 || id == strings.Repeat("0", 32) {
		return false
	}
	for i := 0; i < len(id); i++ {
		if c := id[i]; !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

// validUUID reports whether id is a UUID in its 8-4-4-4-12 hex form.
func validUUID(id string) bool {
	if len(id) != 36 {
		return false
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		switch i {
		case 8, 13, 18, 23:
			if c != '-' {
				return false
			}
		default:
			if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F') {
				return false
			}
		}
	}
	return true
}

// renewHostname sets the kernel's hostname and the files that name it:
// /etc/hostname (guestinit reads it at boot) and the 127.0.1.1 line of
// /etc/hosts, so the name resolves (sudo warns on every call otherwise).
func (a *Agent) renewHostname(name string) error {
	if err := a.sys.SetHostname(name); err != nil {
		return internal(fmt.Errorf("renew: sethostname: %w", err))
	}
	if err := writeFileAtomic(a.path(hostnamePath), []byte(name+"\n"), 0o644); err != nil {
		return internal(fmt.Errorf("renew: %w", err))
	}
	p := a.path(hostsPath)
	old, err := os.ReadFile(p)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return internal(fmt.Errorf("renew: %w", err))
	}
	mode := fs.FileMode(0o644)
	if fi, err := os.Stat(p); err == nil {
		mode = fi.Mode().Perm()
	}
	if err := writeFileAtomic(p, hostsWithName(old, name), mode); err != nil {
		return internal(fmt.Errorf("renew: %w", err))
	}
	return nil
}

// hostsWithName returns the hosts file hosts with its first 127.0.1.1
// line mapping name alone, or with such a line added after the others. All
// other lines stay as they are.
func hostsWithName(hosts []byte, name string) []byte {
	entry := hostsAddr + "\t" + name
	var out bytes.Buffer
	done := false
	lines := strings.SplitAfter(string(hosts), "\n")
	for _, line := range lines {
		if line == "" {
			continue
		}
		body, _, _ := strings.Cut(line, "#")
		if f := strings.Fields(body); !done && len(f) > 0 && f[0] == hostsAddr {
			out.WriteString(entry + "\n")
			done = true
			continue
		}
		out.WriteString(line)
		if !strings.HasSuffix(line, "\n") {
			out.WriteByte('\n')
		}
	}
	if !done {
		out.WriteString(entry + "\n")
	}
	return out.Bytes()
}

// renewMachineID writes /etc/machine-id, and D-Bus's copy if it has one
// of its own (Debian's is often a link to /etc/machine-id).
func (a *Agent) renewMachineID(id string) error {
	data := []byte(id + "\n")
	if err := writeFileAtomic(a.path(machineIDPath), data, 0o444); err != nil {
		return internal(fmt.Errorf("renew: %w", err))
	}
	p := a.path(dbusIDPath)
	if fi, err := os.Lstat(p); err == nil && fi.Mode().IsRegular() {
		if err := writeFileAtomic(p, data, 0o444); err != nil {
			return internal(fmt.Errorf("renew: %w", err))
		}
	}
	return nil
}

// renewBootID makes /proc/sys/kernel/random/boot_id, which the kernel
// fixes at boot, read id: a file on /run holding it is bound over it
// read-only, after every earlier bind is taken off, so repeated renews
// leave one mount.
func (a *Agent) renewBootID(id string) error {
	file := a.path(bootIDFile)
	if err := os.MkdirAll(filepath.Dir(file), 0o755); err != nil {
		return internal(fmt.Errorf("renew: %w", err))
	}
	if err := writeFileAtomic(file, []byte(id+"\n"), 0o444); err != nil {
		return internal(fmt.Errorf("renew: %w", err))
	}
	target := a.path(bootIDPath)
	for i := 0; ; i++ {
		err := a.sys.Unmount(target)
		if errors.Is(err, unix.EINVAL) {
			break // not a mount point: the kernel's own file
		}
		if err != nil {
			return internal(fmt.Errorf("renew: unmounting %s: %w", target, err))
		}
		if i == maxBootIDBinds {
			return internal(fmt.Errorf("renew: %s: more than %d mounts on it", target, maxBootIDBinds))
		}
	}
	if err := a.sys.BindReadOnly(file, target); err != nil {
		return internal(fmt.Errorf("renew: binding %s over %s: %w", file, target, err))
	}
	return nil
}

// path returns the absolute path p under the agent's root.
func (a *Agent) path(p string) string { return filepath.Join(a.root, p) }

// writeFileAtomic replaces the file p with data and mode: readers see the
// old file or the new one, never a part.
func writeFileAtomic(p string, data []byte, mode fs.FileMode) error {
	var rnd [6]byte
	_, _ = rand.Read(rnd[:])
	tmp := filepath.Join(filepath.Dir(p), "."+filepath.Base(p)+".emberbox-"+hex.EncodeToString(rnd[:]))
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	_, err = f.Write(data)
	if err == nil {
		err = f.Chmod(mode)
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, p)
	}
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("writing %s: %w", p, err)
	}
	return nil
}
