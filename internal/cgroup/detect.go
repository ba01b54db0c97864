package cgroup

import (
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
)

// DefaultParent is where groups are made, under the server's own group, when
// no parent is given: the VMs stay within whatever limits the server was
// started with.
const DefaultParent = "emberbox"

// v1Controllers are the v1 controllers a VM's group is made in: cpuacct
// only for accounting.
var v1Controllers = []string{"memory", "cpu", "cpuacct", "pids", "blkio"}

// Detect reads the host's cgroup mounts and this process's own groups
// (normally /proc/self/mountinfo and /proc/self/cgroup) and returns a
// Manager: v2 where the unified hierarchy has the memory controller, else
// v1. Groups are made in parent, a path from each hierarchy's root, or if
// parent is "" in DefaultParent under this process's own group.
func Detect(mountinfo, self, parent string) (Manager, error) {
	mounts, err := readMounts(mountinfo)
	if err != nil {
		return nil, err
	}
	own, err := readOwn(self)
	if err != nil {
		return nil, err
	}
	dirFor := func(m mount, ownPath string) string {
		p := parent
		if p == "" {
			// The mount may show only part of the hierarchy (a cgroup
			// namespace, a container): own paths are from its root.
			rel := strings.TrimPrefix(ownPath, m.root)
			p = path.Join(rel, DefaultParent)
		}
		return filepath.Join(m.point, filepath.FromSlash(path.Clean("/"+p)))
	}
	for _, m := range mounts {
		if m.fstype != "cgroup2" {
			continue
		}
		b, err := os.ReadFile(filepath.Join(m.point, "cgroup.controllers"))
		if err != nil || !slices.Contains(strings.Fields(string(b)), "memory") {
			continue // a hybrid host: the controllers are on v1
		}
		dir := dirFor(m, own[""])
		if err := Delegate(m.point, dir); err != nil {
			return nil, err
		}
		return NewV2(dir)
	}
	parents := map[string]string{}
	for _, m := range mounts {
		if m.fstype != "cgroup" {
			continue
		}
		for _, c := range m.controllers {
			if slices.Contains(v1Controllers, c) && parents[c] == "" {
				parents[c] = dirFor(m, own[c])
			}
		}
	}
	if len(parents) == 0 {
		return nil, errors.New("cgroup: no cgroup v2 memory controller and no v1 controllers are mounted")
	}
	return NewV1(parents)
}

type mount struct {
	point, root, fstype string
	controllers         []string // v1: the controllers of this hierarchy
}

// readMounts lists the cgroup and cgroup2 mounts of a mountinfo file.
func readMounts(file string) ([]mount, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("cgroup: %w", err)
	}
	var out []mount
	for _, line := range strings.Split(string(b), "\n") {
		// id parent maj:min root point opts [optional...] - fstype source superopts
		pre, post, ok := strings.Cut(line, " - ")
		if !ok {
			continue
		}
		f, g := strings.Fields(pre), strings.Fields(post)
		if len(f) < 5 || len(g) < 3 || (g[0] != "cgroup" && g[0] != "cgroup2") {
			continue
		}
		m := mount{point: unescape(f[4]), root: unescape(f[3]), fstype: g[0]}
		if g[0] == "cgroup" {
			for _, o := range strings.Split(g[2], ",") {
				if o != "rw" && o != "ro" && !strings.Contains(o, "=") {
					m.controllers = append(m.controllers, o)
				}
			}
		}
		out = append(out, m)
	}
	return out, nil
}

// readOwn maps each v1 controller of a /proc/PID/cgroup file to the
// process's group in it; "" is the v2 group.
func readOwn(file string) (map[string]string, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("cgroup: %w", err)
	}
	own := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		if parts[1] == "" {
			own[""] = parts[2]
			continue
		}
		for _, c := range strings.Split(parts[1], ",") {
			own[c] = parts[2]
		}
	}
	return own, nil
}

// unescape undoes mountinfo's octal escapes (\040 for a space).
func unescape(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			var v byte
			ok := true
			for _, c := range []byte(s[i+1 : i+4]) {
				if c < '0' || c > '7' {
					ok = false
					break
				}
				v = v*8 + c - '0'
			}
			if ok {
				b.WriteByte(v)
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
