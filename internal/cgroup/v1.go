package cgroup

import (
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
)

// V1 is a Manager over v1 hierarchies, one mount per controller (or per
// set of controllers mounted together).
type V1 struct {
	// parents maps each controller to the directory groups are made in.
	parents map[string]string
	io      string // the blkio weight file this kernel has, or ""
}

// NewV1 returns a manager making groups in parents (controller → parent
// directory). Controllers it does not know are only joined, for
// accounting (cpuacct).
func NewV1(parents map[string]string) (*V1, error) {
	for _, c := range []string{"memory", "cpu", "pids"} {
		if parents[c] == "" {
			return nil, fmt.Errorf("cgroup v1: controller %s is not mounted", c)
		}
	}
	m := &V1{parents: parents}
	for _, d := range m.Parents() {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, fmt.Errorf("cgroup v1: %w", err)
		}
	}
	// A non-root group shows the weight files its kernel has: CFQ had blkio.weight; with BFQ the weight is blkio.bfq.weight; with
	// neither v1 has no IO weight at all. Either counts only on devices
	// whose IO scheduler is that one.
	if d := parents["blkio"]; d != "" {
		for _, f := range []string{"blkio.weight", "blkio.bfq.weight"} {
			if exists(filepath.Join(d, f)) {
				m.io = f
				break
			}
		}
	}
	return m, nil
}

// Version implements Manager.
func (m *V1) Version() int { return 1 }

// Controllers implements Manager.
func (m *V1) Controllers() []string {
	out := []string{"memory", "cpu", "pids"}
	if m.io != "" {
		out = append(out, "blkio")
	}
	return out
}

// Parents implements Manager.
func (m *V1) Parents() []string {
	var out []string
	for _, c := range slices.Sorted(maps.Keys(m.parents)) {
		if !slices.Contains(out, m.parents[c]) {
			out = append(out, m.parents[c])
		}
	}
	return out
}

// Open implements Manager.
func (m *V1) Open(name string) *Group { return m.group(name) }

func (m *V1) group(name string) *Group {
	g := &Group{Name: name, Version: 1, Dirs: map[string]string{}}
	for c, p := range m.parents {
		g.Dirs[c] = filepath.Join(p, name)
	}
	return g
}

// Create implements Manager.
func (m *V1) Create(name string, l Limits) (*Group, error) {
	if !ValidName(name) {
		return nil, fmt.Errorf("cgroup: bad group name %q", name)
	}
	g := m.group(name)
	for _, d := range g.uniqueDirs() {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, fmt.Errorf("cgroup: %w", err)
		}
	}
	if err := m.limit(g, l); err != nil {
		_ = m.Remove(name)
		return nil, err
	}
	return g, nil
}

func (m *V1) limit(g *Group, l Limits) error {
	mem := g.Dir("memory")
	if l.MemoryBytes > 0 {
		v := strconv.FormatInt(l.MemoryBytes, 10)
		if err := write(mem, "memory.limit_in_bytes", v); err != nil {
			return err
		}
		// With swap accounting, memory+swap gets the same ceiling, so
		// swap cannot extend it (memsw must not be below the limit,
		// hence the order).
		if _, err := writeIfPresent(mem, "memory.memsw.limit_in_bytes", v); err != nil {
			return err
		}
	}
	if l.MilliCPUs > 0 {
		cpu := g.Dir("cpu")
		if err := write(cpu, "cpu.cfs_period_us", strconv.Itoa(cfsPeriod)); err != nil {
			return err
		}
		if err := write(cpu, "cpu.cfs_quota_us", strconv.Itoa(l.MilliCPUs*cfsPeriod/1000)); err != nil {
			return err
		}
	}
	if l.Pids > 0 {
		if err := write(g.Dir("pids"), "pids.max", strconv.Itoa(l.Pids)); err != nil {
			return err
		}
	}
	if l.IOWeight > 0 && m.io != "" {
		// v1 weights run 10–1000 (default 500) for CFQ and 1–1000
		// (default 100) for BFQ; scale from v2's 1–10000 (default 100).
		w := l.IOWeight
		if m.io == "blkio.weight" {
			w *= 5
		}
		if err := write(g.Dir("blkio"), m.io, strconv.Itoa(min(max(w, 10), 1000))); err != nil {
			return err
		}
	}
	return nil
}

// JoinThread moves one thread into every controller's group. A process
// forked by that thread is born in the group, so nothing it allocates is
// charged elsewhere; v1 moves single threads (the tasks file), where v2
// would need CLONE_INTO_CGROUP.
func (g *Group) JoinThread(tid int) error {
	if g.Version != 1 {
		return fmt.Errorf("cgroup v%d: threads cannot join a group on their own", g.Version)
	}
	for _, d := range g.uniqueDirs() {
		if err := write(d, "tasks", strconv.Itoa(tid)); err != nil {
			return err
		}
	}
	return nil
}

// LeaveThread moves a thread that joined g into g's parent groups.
func (g *Group) LeaveThread(tid int) error {
	for _, d := range g.uniqueDirs() {
		if err := write(filepath.Dir(d), "tasks", strconv.Itoa(tid)); err != nil {
			return err
		}
	}
	return nil
}

// Remove implements Manager.
func (m *V1) Remove(name string) error {
	if !ValidName(name) {
		return fmt.Errorf("cgroup: bad group name %q", name)
	}
	var first error
	for _, d := range m.group(name).uniqueDirs() {
		if err := removeDir(d); err != nil && first == nil {
			first = err
		}
	}
	return first
}

// cfsPeriod is the CPU quota's period in microseconds (the kernel's default).
const cfsPeriod = 100000
