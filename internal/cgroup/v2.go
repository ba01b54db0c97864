package cgroup

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// V2 is a Manager over the unified hierarchy.
type V2 struct {
	parent      string
	controllers []string // of memory, cpu, pids, io: those the parent delegates
}

// wantV2 are the controllers a VM's group gets.
var wantV2 = []string{"memory", "cpu", "pids", "io"}

// NewV2 returns a manager making groups in parent, which must exist and
// delegate memory, cpu and pids to its children (cgroup.subtree_control).
func NewV2(parent string) (*V2, error) {
	b, err := os.ReadFile(filepath.Join(parent, "cgroup.subtree_control"))
	if err != nil {
		return nil, fmt.Errorf("cgroup v2: %w", err)
	}
	var on []string // what the kernel reads back; "+c" is what a fake holds
	for _, c := range strings.Fields(string(b)) {
		on = append(on, strings.TrimPrefix(c, "+"))
	}
	m := &V2{parent: parent}
	for _, c := range wantV2 {
		if slices.Contains(on, c) {
			m.controllers = append(m.controllers, c)
		} else if c != "io" {
			return nil, fmt.Errorf("cgroup v2: %s does not delegate the %s controller", parent, c)
		}
	}
	return m, nil
}

// Delegate prepares parent for NewV2: it makes the directory and enables
// the controllers for its children, level by level from root, the
// hierarchy's mount point, which must be an ancestor. A level that holds
// processes cannot delegate (the "no internal processes" rule), so this
// process moves itself into a leaf "<level>/server" first when it is the
// only one there, as a delegated service is expected to.
func Delegate(root, parent string) error {
	rel, err := filepath.Rel(root, parent)
	if err != nil || strings.HasPrefix(rel, "..") {
		return fmt.Errorf("cgroup v2: %s is not under %s", parent, root)
	}
	dir := root
	levels := []string{root}
	if rel != "." {
		for _, el := range strings.Split(rel, string(filepath.Separator)) {
			dir = filepath.Join(dir, el)
			levels = append(levels, dir)
		}
	}
	for _, d := range levels {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return fmt.Errorf("cgroup v2: %w", err)
		}
		if err := enable(d); err != nil {
			return err
		}
	}
	return nil
}

// enable turns on, for dir's children, the wanted controllers dir has.
func enable(dir string) error {
	b, err := os.ReadFile(filepath.Join(dir, "cgroup.controllers"))
	if err != nil {
		return fmt.Errorf("cgroup v2: %w", err)
	}
	var add []string
	for _, c := range strings.Fields(string(b)) {
		if slices.Contains(wantV2, c) {
			add = append(add, "+"+c)
		}
	}
	if len(add) == 0 {
		return nil
	}
	err = write(dir, "cgroup.subtree_control", strings.Join(add, " "))
	if err == nil {
		return nil
	}
	procs, rerr := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
	self := strconv.Itoa(os.Getpid())
	if rerr != nil || strings.TrimSpace(string(procs)) != self {
		return fmt.Errorf("%w (processes in %s keep it from delegating; run the server in a cgroup of its own, e.g. a systemd unit with Delegate=yes, or pass a parent)", err, dir)
	}
	leaf := filepath.Join(dir, "server")
	if err := os.MkdirAll(leaf, 0o755); err != nil {
		return fmt.Errorf("cgroup v2: %w", err)
	}
	if err := write(leaf, "cgroup.procs", self); err != nil {
		return err
	}
	return write(dir, "cgroup.subtree_control", strings.Join(add, " "))
}

// Version implements Manager.
func (m *V2) Version() int { return 2 }

// Controllers implements Manager.
func (m *V2) Controllers() []string { return slices.Clone(m.controllers) }

// Parents implements Manager.
func (m *V2) Parents() []string { return []string{m.parent} }

// Open implements Manager.
func (m *V2) Open(name string) *Group { return m.group(name) }

func (m *V2) group(name string) *Group {
	d := filepath.Join(m.parent, name)
	g := &Group{Name: name, Version: 2, Dirs: map[string]string{}}
	for _, c := range m.controllers {
		g.Dirs[c] = d
	}
	return g
}

// Create implements Manager.
func (m *V2) Create(name string, l Limits) (*Group, error) {
	if !ValidName(name) {
		return nil, fmt.Errorf("cgroup: bad group name %q", name)
	}
	g := m.group(name)
	d := filepath.Join(m.parent, name)
	if err := os.MkdirAll(d, 0o755); err != nil {
		return nil, fmt.Errorf("cgroup: %w", err)
	}
	if err := m.limit(d, l); err != nil {
		_ = m.Remove(name)
		return nil, err
	}
	return g, nil
}

func (m *V2) limit(d string, l Limits) error {
	if l.MemoryBytes > 0 {
		if err := write(d, "memory.max", strconv.FormatInt(l.MemoryBytes, 10)); err != nil {
			return err
		}
	}
	if l.MilliCPUs > 0 {
		if err := write(d, "cpu.max", fmt.Sprintf("%d %d", l.MilliCPUs*cfsPeriod/1000, cfsPeriod)); err != nil {
			return err
		}
	}
	if l.Pids > 0 {
		if err := write(d, "pids.max", strconv.Itoa(l.Pids)); err != nil {
			return err
		}
	}
	if l.IOWeight > 0 && slices.Contains(m.controllers, "io") {
		// io.weight exists only with an IO scheduler that honours it.
		if _, err := writeIfPresent(d, "io.weight", "default "+strconv.Itoa(min(max(l.IOWeight, 1), 10000))); err != nil {
			return err
		}
	}
	return nil
}

// Remove implements Manager.
func (m *V2) Remove(name string) error {
	if !ValidName(name) {
		return fmt.Errorf("cgroup: bad group name %q", name)
	}
	return removeDir(filepath.Join(m.parent, name))
}
