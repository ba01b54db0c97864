// Package cgroup gives each VM a control group of its own, with a memory
// ceiling, a CPU quota, a limit on tasks and an IO weight: cgroup v2 where the
// host runs the memory controller on the unified hierarchy, the v1 controllers
// where it does not. It only reads and writes files under the cgroup mounts, so
// tests run it against a temporary directory.
//
// `Detect` reads `/proc/self/mountinfo` and `/proc/self/cgroup`: v2 where the
// unified hierarchy has the memory controller (`Delegate` enables controllers
// down to the parent, moving the server into a `server` leaf if it is alone in
// its group), else the v1 controllers. `Manager` (`Create`, `Remove`,
// `Version`, `Controllers`, `Parents`) has the implementations `V1` and `V2`;
// `Group.JoinThread` and `LeaveThread` are for v1.
package cgroup

import (
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Limits are what a group may use.
type Limits struct {
	MemoryBytes int64 // hard ceiling; past it the kernel's OOM killer ends a task of the group
	MilliCPUs   int   // CPU time per period, in thousandths of a CPU; 0 leaves it unlimited
	Pids        int   // most tasks (threads count); 0 leaves it unlimited
	IOWeight    int   // 1–10000 (v2 units; 100 is the default); 0 leaves it alone
}

// Manager makes and removes groups under one parent.
type Manager interface {
	// Version is 1 or 2.
	Version() int
	// Controllers lists the controllers whose limits the groups get.
	Controllers() []string
	// Parents lists the directories the groups are made in.
	Parents() []string
	// Create makes the group name (or reuses an empty one of that name)
	// and writes its limits.
	Create(name string, l Limits) (*Group, error)
	// Remove removes the group name; a group that does not exist is not
	// an error. It waits briefly for tasks that are exiting to leave.
	Remove(name string) error
	// Open returns the group name as Create made it, without touching
	// the file system, to read its accounting.
	Open(name string) *Group
}

// Group is one group: a directory per v1 controller, or one under v2.
type Group struct {
	Name    string
	Version int
	// Dirs maps each controller to its directory; under v2 every
	// controller maps to the same one.
	Dirs map[string]string
}

// Dir returns the directory of controller c.
func (g *Group) Dir(c string) string { return g.Dirs[c] }

// MemoryMax reads back the group's memory ceiling in bytes.
func (g *Group) MemoryMax() (int64, error) {
	file := "memory.limit_in_bytes"
	if g.Version == 2 {
		file = "memory.max"
	}
	b, err := os.ReadFile(filepath.Join(g.Dirs["memory"], file))
	if err != nil {
		return 0, err
	}
	return strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
}

// CPUUsage reads the CPU time, user and system, that the kernel has
// charged to the group's tasks since it was made: cpuacct.usage under v1
// (nanoseconds), usage_usec of cpu.stat under v2. The count stays readable
// after the tasks have exited, until the group is removed, which is what
// lets a VM's last CPU-seconds be read after its VMM has ended.
func (g *Group) CPUUsage() (time.Duration, error) {
	if g.Version == 2 {
		dirs := g.uniqueDirs() // one directory: cpu.stat is in every group
		if len(dirs) == 0 {
			return 0, errors.New("cgroup: group has no directory")
		}
		b, err := os.ReadFile(filepath.Join(dirs[0], "cpu.stat"))
		if err != nil {
			return 0, fmt.Errorf("cgroup: reading cpu.stat: %w", err)
		}
		for line := range strings.Lines(string(b)) {
			if v, ok := strings.CutPrefix(line, "usage_usec "); ok {
				us, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
				if err != nil || us < 0 {
					return 0, fmt.Errorf("cgroup: bad usage_usec %q", strings.TrimSpace(v))
				}
				return time.Duration(us) * time.Microsecond, nil
			}
		}
		return 0, errors.New("cgroup: cpu.stat has no usage_usec")
	}
	dir, ok := g.Dirs["cpuacct"]
	if !ok {
		return 0, errors.New("cgroup: the cpuacct controller is not mounted")
	}
	b, err := os.ReadFile(filepath.Join(dir, "cpuacct.usage"))
	if err != nil {
		return 0, fmt.Errorf("cgroup: reading cpuacct.usage: %w", err)
	}
	ns, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	if err != nil || ns < 0 {
		return 0, fmt.Errorf("cgroup: bad cpuacct.usage %q", strings.TrimSpace(string(b)))
	}
	return time.Duration(ns), nil
}

// uniqueDirs lists g's directories once each, in a stable order.
func (g *Group) uniqueDirs() []string {
	var out []string
	seen := map[string]bool{}
	for _, c := range slices.Sorted(maps.Keys(g.Dirs)) {
		if d := g.Dirs[c]; !seen[d] {
			seen[d] = true
			out = append(out, d)
		}
	}
	return out
}

// ValidName reports whether name can name a group: one path element.
func ValidName(name string) bool {
	return name != "" && name != "." && name != ".." && !strings.ContainsAny(name, "/\x00")
}

// write writes one control file. Control files exist in a group from its
// creation, so a missing one is an error (and in tests the file is made).
func write(dir, file, value string) error {
	if err := os.WriteFile(filepath.Join(dir, file), []byte(value), 0o644); err != nil {
		return fmt.Errorf("cgroup: writing %s: %w", file, err)
	}
	return nil
}

// writeIfPresent writes an optional control file.
func writeIfPresent(dir, file, value string) (bool, error) {
	p := filepath.Join(dir, file)
	if _, err := os.Stat(p); err != nil {
		return false, nil
	}
	return true, write(dir, file, value)
}

func exists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// removeDir removes one group directory. rmdir fails with EBUSY while
// tasks remain; a task that has just exited leaves its group shortly after
// its parent reaps it, so this retries for up to two seconds.
func removeDir(dir string) error {
	deadline := time.Now().Add(2 * time.Second)
	for {
		err := os.Remove(dir)
		if err == nil || errors.Is(err, os.ErrNotExist) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("cgroup: removing %s: %w", dir, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
