package cgroup

import (
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// fakeV1 lays out a v1 host in a temporary directory: one mount per
// controller as on the development machines, the server in a nested
// memory group.
func fakeV1(t *testing.T, extra ...string) (root, mountinfo, self string) {
	t.Helper()
	root = t.TempDir()
	var mi strings.Builder
	mi.WriteString("31 23 0:28 / " + root + " rw,relatime - tmpfs tmpfs rw,mode=755\n")
	for i, c := range []string{"cpu", "cpuacct", "memory", "pids", "blkio", "devices"} {
		if err := os.MkdirAll(filepath.Join(root, c), 0o755); err != nil {
			t.Fatal(err)
		}
		mi.WriteString(strings.Join([]string{itoa(32 + i), "31", "0:1", "/", filepath.Join(root, c), "rw,relatime", "-", "cgroup", "cgroup", "rw," + c}, " ") + "\n")
	}
	mi.WriteString("41 31 0:38 / " + filepath.Join(root, "unified") + " rw,relatime - cgroup2 cgroup2 rw\n")
	if err := os.MkdirAll(filepath.Join(root, "unified"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "unified", "cgroup.controllers"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, f := range extra {
		touch(t, filepath.Join(root, f))
	}
	dir := t.TempDir()
	mountinfo, self = filepath.Join(dir, "mountinfo"), filepath.Join(dir, "cgroup")
	writeFile(t, mountinfo, mi.String())
	writeFile(t, self, "8:pids:/\n7:blkio:/\n4:memory:/jobs/42\n2:cpuacct:/\n1:cpu:/\n0::/\n")
	return root, mountinfo, self
}

func TestV1(t *testing.T) {
	root, mi, self := fakeV1(t, "memory/jobs/42/emberbox/memory.memsw.limit_in_bytes", "blkio/emberbox/blkio.bfq.weight")
	m, err := Detect(mi, self, "")
	if err != nil {
		t.Fatal(err)
	}
	if m.Version() != 1 {
		t.Fatalf("version %d, want 1", m.Version())
	}
	if got := m.Controllers(); !slices.Equal(got, []string{"memory", "cpu", "pids", "blkio"}) {
		t.Errorf("controllers %v", got)
	}
	// The memsw file of a real group exists from its creation; here the
	// test makes it where the group will be.
	touch(t, filepath.Join(root, "memory/jobs/42/emberbox/sbx_1/memory.memsw.limit_in_bytes"))
	g, err := m.Create("sbx_1", Limits{MemoryBytes: 5 << 30, MilliCPUs: 2000, Pids: 256, IOWeight: 100})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"memory/jobs/42/emberbox/sbx_1/memory.limit_in_bytes":       "5368709120",
		"memory/jobs/42/emberbox/sbx_1/memory.memsw.limit_in_bytes": "5368709120",
		"cpu/emberbox/sbx_1/cpu.cfs_period_us":                      "100000",
		"cpu/emberbox/sbx_1/cpu.cfs_quota_us":                       "200000",
		"pids/emberbox/sbx_1/pids.max":                              "256",
		"blkio/emberbox/sbx_1/blkio.bfq.weight":                     "100",
	}
	for f, v := range want {
		if b, err := os.ReadFile(filepath.Join(root, f)); err != nil || string(b) != v {
			t.Errorf("%s = %q, %v; want %q", f, b, err, v)
		}
	}
	if _, err := os.Stat(filepath.Join(root, "cpuacct/emberbox/sbx_1")); err != nil {
		t.Errorf("no cpuacct group: %v", err)
	}
	if n, err := g.MemoryMax(); err != nil || n != 5<<30 {
		t.Errorf("MemoryMax = %d, %v", n, err)
	}
	if err := g.JoinThread(1234); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(filepath.Join(root, "pids/emberbox/sbx_1/tasks")); string(b) != "1234" {
		t.Errorf("tasks = %q", b)
	}
	if err := g.LeaveThread(1234); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(filepath.Join(root, "memory/jobs/42/emberbox/tasks")); string(b) != "1234" {
		t.Errorf("parent's tasks = %q", b)
	}

	// A real group's files vanish with it; clear the fake's, then remove.
	for _, d := range g.uniqueDirs() {
		clearDir(t, d)
	}
	if err := m.Remove("sbx_1"); err != nil {
		t.Fatal(err)
	}
	for _, d := range g.uniqueDirs() {
		if _, err := os.Stat(d); !os.IsNotExist(err) {
			t.Errorf("%s still exists: %v", d, err)
		}
	}
	if err := m.Remove("sbx_1"); err != nil {
		t.Errorf("removing a removed group: %v", err)
	}
	for _, bad := range []string{"", "..", "a/b"} {
		if _, err := m.Create(bad, Limits{}); err == nil {
			t.Errorf("Create(%q) made a group", bad)
		}
	}
}

func TestV1NoIOWeight(t *testing.T) {
	_, mi, self := fakeV1(t)
	m, err := Detect(mi, self, "vms")
	if err != nil {
		t.Fatal(err)
	}
	if got := m.Controllers(); slices.Contains(got, "blkio") {
		t.Errorf("controllers %v include blkio without a weight file", got)
	}
	if p := m.Parents(); !slices.ContainsFunc(p, func(s string) bool { return strings.HasSuffix(s, "/memory/vms") }) {
		t.Errorf("parents %v, want .../memory/vms", p)
	}
}

func TestV2(t *testing.T) {
	root := t.TempDir()
	dir := t.TempDir()
	mi, self := filepath.Join(dir, "mountinfo"), filepath.Join(dir, "cgroup")
	writeFile(t, mi, "30 23 0:26 / "+root+" rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n")
	writeFile(t, self, "0::/system.slice/emberbox.service\n")
	svc := filepath.Join(root, "system.slice", "emberbox.service")
	for _, d := range []string{root, filepath.Join(root, "system.slice"), svc, filepath.Join(svc, "emberbox")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		writeFile(t, filepath.Join(d, "cgroup.controllers"), "cpuset cpu io memory hugetlb pids rdma misc\n")
	}
	m, err := Detect(mi, self, "")
	if err != nil {
		t.Fatal(err)
	}
	if m.Version() != 2 || !slices.Equal(m.Controllers(), []string{"memory", "cpu", "pids", "io"}) {
		t.Fatalf("v%d %v", m.Version(), m.Controllers())
	}
	// Each level was told to delegate the controllers.
	if b, _ := os.ReadFile(filepath.Join(svc, "emberbox", "cgroup.subtree_control")); string(b) != "+cpu +io +memory +pids" {
		t.Errorf("subtree_control = %q", b)
	}
	touch(t, filepath.Join(svc, "emberbox", "sbx_2", "io.weight"))
	g, err := m.Create("sbx_2", Limits{MemoryBytes: 1 << 30, MilliCPUs: 1000, Pids: 64, IOWeight: 50})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"memory.max": "1073741824", "cpu.max": "100000 100000", "pids.max": "64", "io.weight": "default 50"}
	for f, v := range want {
		if b, err := os.ReadFile(filepath.Join(g.Dir("memory"), f)); err != nil || string(b) != v {
			t.Errorf("%s = %q, %v; want %q", f, b, err, v)
		}
	}
	if err := g.JoinThread(1); err == nil {
		t.Error("JoinThread under v2 succeeded")
	}
}

func TestV2Hybrid(t *testing.T) {
	// A hybrid host's unified mount has no controllers: v1 is used.
	_, mi, self := fakeV1(t)
	m, err := Detect(mi, self, "")
	if err != nil || m.Version() != 1 {
		t.Fatalf("Detect = %v, %v; want v1", m, err)
	}
}

func TestUnescape(t *testing.T) {
	if got := unescape(`/a\040b\\c`); got != `/a b\\c` {
		t.Errorf("unescape = %q", got)
	}
}

func touch(t *testing.T, p string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	writeFile(t, p, "")
}

func writeFile(t *testing.T, p, s string) {
	t.Helper()
	if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
}

func clearDir(t *testing.T, dir string) {
	t.Helper()
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		if err := os.Remove(filepath.Join(dir, e.Name())); err != nil {
			t.Fatal(err)
		}
	}
}

func itoa(i int) string { return strconv.Itoa(i) }

func TestCPUUsage(t *testing.T) {
	root, mi, self := fakeV1(t)
	m, err := Detect(mi, self, "")
	if err != nil {
		t.Fatal(err)
	}
	g, err := m.Create("sbx_cpu", Limits{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := g.CPUUsage(); err == nil {
		t.Error("no cpuacct.usage file: want an error")
	}
	writeFile(t, filepath.Join(root, "cpuacct/emberbox/sbx_cpu/cpuacct.usage"), "1500000123\n")
	if got, err := m.Open("sbx_cpu").CPUUsage(); err != nil || got != 1500000123 {
		t.Errorf("v1 usage %v, %v; want 1.500000123s", got, err)
	}
	writeFile(t, filepath.Join(root, "cpuacct/emberbox/sbx_cpu/cpuacct.usage"), "-5\n")
	if _, err := g.CPUUsage(); err == nil {
		t.Error("negative usage: want an error")
	}

	d := t.TempDir()
	g2 := &Group{Name: "x", Version: 2, Dirs: map[string]string{"memory": d, "pids": d}}
	writeFile(t, filepath.Join(d, "cpu.stat"), "usage_usec 2500001\nuser_usec 2000000\nsystem_usec 500001\n")
	if got, err := g2.CPUUsage(); err != nil || got != 2500001*time.Microsecond {
		t.Errorf("v2 usage %v, %v", got, err)
	}
}
