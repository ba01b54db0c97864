package integration

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestConfine reads, from the host's /proc, how a running sandbox's QEMU is
// confined: not root, no capabilities, seccomp filtering, its own cgroup
// with a memory ceiling, its own network (and other) namespaces, a jail for
// a root directory, a clean environment. The sandbox still works, and after
// the server is killed with SIGKILL a new server reattaches to the confined
// VM and stops it, removing its cgroup.
func TestConfine(t *testing.T) {
	needVMs(t)
	if os.Geteuid() != 0 {
		t.Skip("confinement needs the server to run as root")
	}
	dataDir := t.TempDir()
	s1 := startServer(t, dataDir)
	c := s1.client(s1.AdminKey)

	var health struct {
		Confinement struct {
			Confined bool
			Seccomp  string
			UIDMode  string
			Cgroup   struct {
				Version     int
				Controllers []string
			}
		}
	}
	if r := c.raw(t, "GET", "/healthz", nil, nil, requestTimeout); r.Status != http.StatusOK || json.Unmarshal(r.Body, &health) != nil {
		t.Fatalf("/healthz: %v", r)
	}
	hc := health.Confinement
	if !hc.Confined || !strings.HasPrefix(hc.Seccomp, "on,") || hc.UIDMode != "per-vm" || hc.Cgroup.Version == 0 {
		t.Errorf("/healthz confinement: %+v", hc)
	}

	const memMiB = 1024
	sb := c.createRunning(t, map[string]any{"vcpu": 1, "memoryMiB": memMiB, "labels": map[string]string{"test": "confine"}})
	pid := vmPID(sb.ID)
	if pid == 0 {
		t.Fatalf("no QEMU process for %s", sb.ID)
	}
	t.Logf("sandbox %s: QEMU pid %d", sb.ID, pid)

	status := procStatus(t, pid)
	for _, k := range []string{"Uid", "Gid"} {
		ids := strings.Fields(status[k])
		if len(ids) != 4 {
			t.Fatalf("%s: %q", k, status[k])
		}
		for _, id := range ids {
			if n, _ := strconv.Atoi(id); n < 1000 || id != ids[0] {
				t.Errorf("QEMU %s is %q, want one unprivileged id", k, status[k])
				break
			}
		}
	}
	if g := strings.TrimSpace(status["Groups"]); g != "" {
		t.Errorf("QEMU has supplementary groups %q", g)
	}
	for _, k := range []string{"CapEff", "CapPrm", "CapBnd", "CapInh", "CapAmb"} {
		if v, err := strconv.ParseUint(status[k], 16, 64); err != nil || v != 0 {
			t.Errorf("QEMU %s = %q, want 0", k, status[k])
		}
	}
	if status["Seccomp"] != "2" || status["NoNewPrivs"] != "1" {
		t.Errorf("QEMU Seccomp = %q, NoNewPrivs = %q; want 2 and 1", status["Seccomp"], status["NoNewPrivs"])
	}
	t.Logf("QEMU runs as uid %s, CapEff %s, CapBnd %s, Seccomp %s", strings.Fields(status["Uid"])[0], status["CapEff"], status["CapBnd"], status["Seccomp"])

	for _, ns := range []string{"net", "pid", "ipc", "uts", "mnt"} {
		mine, err1 := os.Readlink("/proc/self/ns/" + ns)
		its, err2 := os.Readlink(fmt.Sprintf("/proc/%d/ns/%s", pid, ns))
		if err1 != nil || err2 != nil || mine == its {
			t.Errorf("%s namespace: QEMU's %q (%v), the test's %q (%v); want different", ns, its, err2, mine, err1)
		}
	}
	// The namespace QEMU's pid namespace made it its init.
	if nspid := strings.Fields(status["NSpid"]); len(nspid) != 2 || nspid[1] != "1" {
		t.Errorf("QEMU NSpid = %q, want its host pid and 1", status["NSpid"])
	}

	memDir := memoryCgroup(t, pid)
	if filepath.Base(memDir) != sb.ID {
		t.Errorf("QEMU's memory cgroup %s is not the sandbox's own", memDir)
	}
	ceiling := readCgroupInt(t, memDir, "memory.limit_in_bytes", "memory.max")
	usage := readCgroupInt(t, memDir, "memory.usage_in_bytes", "memory.current")
	if ceiling < memMiB<<20 || ceiling > 2*memMiB<<20 || usage >= ceiling {
		t.Errorf("memory ceiling %d MiB (usage %d MiB), want a little above the guest's %d MiB", ceiling>>20, usage>>20, memMiB)
	}
	t.Logf("cgroup %s: memory ceiling %d MiB, usage %d MiB", memDir, ceiling>>20, usage>>20)

	// Its root is the jail: its own files, /usr and the devices it needs,
	// nothing of the host's such as /etc/passwd, /home, /root or /proc.
	root := fmt.Sprintf("/proc/%d/root", pid)
	for _, p := range []string{"disk.qcow2", "vmlinuz", "usr/bin"} {
		if _, err := os.Stat(filepath.Join(root, p)); err != nil {
			t.Errorf("jail lacks %s: %v", p, err)
		}
	}
	for _, p := range []string{"etc/passwd", "home", "root", "proc", "sys", "tmp", "var"} {
		if _, err := os.Lstat(filepath.Join(root, p)); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("jail has the host's %s (%v)", p, err)
		}
	}
	if env, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid)); err != nil || len(env) != 0 {
		t.Errorf("QEMU's environment: %q, %v; want empty", env, err)
	}
	if lim, err := os.ReadFile(fmt.Sprintf("/proc/%d/limits", pid)); err != nil || !strings.Contains(string(lim), "Max open files            1024 ") {
		t.Errorf("QEMU's limits (%v):\n%s", err, lim)
	}

	// The sandbox works.
	if out := c.sh(t, sb.ID, "echo confined-$((6*7))"); out != "confined-42\n" {
		t.Errorf("exec printed %q", out)
	}
	c.writeFile(t, sb.ID, "/workspace/confined.txt", []byte("written through the jail\n"))
	if got, _ := c.readFile(t, sb.ID, "/workspace/confined.txt"); string(got) != "written through the jail\n" {
		t.Errorf("file read back as %q", got)
	}

	// A new server reattaches to the confined VM after a SIGKILL, and
	// stopping the sandbox ends it and removes its cgroup.
	s1.kill9(t)
	if !processAlive(pid) {
		t.Fatalf("VM pid %d died with the server", pid)
	}
	s2 := startServer(t, dataDir)
	c = s2.client(s2.AdminKey)
	waitAgent(t, c, sb.ID)
	if got := vmPID(sb.ID); got != pid {
		t.Errorf("VM is pid %d after the restart, was %d", got, pid)
	}
	if r := c.raw(t, "POST", "/v1/sandboxes/"+sb.ID+":stop", nil, http.Header{"Prefer": {"wait=60"}}, requestTimeout); r.Status != http.StatusOK {
		t.Fatalf("stop after the restart: %v", r)
	}
	c.waitState(t, sb.ID, "stopped")
	if !waitUntil(30*time.Second, 50*time.Millisecond, func() bool { return !processAlive(pid) }) {
		t.Errorf("VM pid %d still runs after the stop", pid)
	}
	if !waitUntil(10*time.Second, 50*time.Millisecond, func() bool {
		_, err := os.Stat(memDir)
		return errors.Is(err, fs.ErrNotExist)
	}) {
		t.Errorf("cgroup %s left after the VM ended", memDir)
	}
}

// procStatus reads /proc/PID/status into a map.
func procStatus(t *testing.T, pid int) map[string]string {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, line := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok {
			out[k] = strings.TrimSpace(v)
		}
	}
	return out
}

// memoryCgroup returns the directory of pid's memory cgroup: the v1 memory
// hierarchy's, or the unified one's.
func memoryCgroup(t *testing.T, pid int) string {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		t.Fatal(err)
	}
	var v1, v2 string
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		if parts[1] == "" {
			v2 = parts[2]
		}
		for _, c := range strings.Split(parts[1], ",") {
			if c == "memory" {
				v1 = parts[2]
			}
		}
	}
	mi, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(mi), "\n") {
		pre, post, ok := strings.Cut(line, " - ")
		f, g := strings.Fields(pre), strings.Fields(post)
		if !ok || len(f) < 5 || len(g) < 3 {
			continue
		}
		if v1 != "" && g[0] == "cgroup" && strings.Contains(","+g[2]+",", ",memory,") {
			return filepath.Join(f[4], v1)
		}
		if v1 == "" && g[0] == "cgroup2" {
			return filepath.Join(f[4], v2)
		}
	}
	t.Fatalf("no memory cgroup mount for pid %d (%s)", pid, b)
	return ""
}

// readCgroupInt reads the first of files that dir has, as an integer.
func readCgroupInt(t *testing.T, dir string, files ...string) int64 {
	t.Helper()
	for _, f := range files {
		b, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil {
			continue
		}
		n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
		if err != nil {
			t.Fatalf("%s/%s: %q", dir, f, b)
		}
		return n
	}
	t.Fatalf("%s has none of %v", dir, files)
	return 0
}
