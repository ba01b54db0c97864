package admission

import (
	"bufio"
	"bytes"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// HostCPUs returns the CPUs this process may use: runtime.NumCPU (the
// affinity mask), lowered by a CFS quota on its cgroup (v2 cpu.max or v1
// cpu.cfs_quota_us), rounded up.
func HostCPUs() int {
	n := runtime.NumCPU()
	if q := cgroupCPUs(); q > 0 && q < n {
		n = q
	}
	return n
}

// HostMemoryMiB returns the memory this process's VMs may use: MemTotal of
// /proc/meminfo, lowered by a memory limit on its cgroup.
func HostMemoryMiB() (int64, error) {
	total, err := meminfo("MemTotal")
	if err != nil {
		return 0, err
	}
	if lim := cgroupMemoryMiB(); lim > 0 && lim < total {
		total = lim
	}
	return total, nil
}

// MemAvailableMiB returns MemAvailable of /proc/meminfo: what the host
// could give without swapping.
func MemAvailableMiB() (int64, error) { return meminfo("MemAvailable") }

// Swap returns SwapTotal and SwapFree of /proc/meminfo.
func Swap() (total, free int64, err error) {
	if total, err = meminfo("SwapTotal"); err != nil {
		return 0, 0, err
	}
	free, err = meminfo("SwapFree")
	return total, free, err
}

// DiskFreeMiB returns the space an unprivileged user may still write on
// the filesystem holding dir.
func DiskFreeMiB(dir string) (int64, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return 0, fmt.Errorf("statfs %s: %w", dir, err)
	}
	return int64(st.Bavail) * int64(st.Bsize) >> 20, nil
}

// meminfo returns one field of /proc/meminfo in MiB.
func meminfo(field string) (int64, error) {
	data, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0, err
	}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		name, rest, ok := strings.Cut(sc.Text(), ":")
		if !ok || name != field {
			continue
		}
		kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
		if err != nil {
			return 0, fmt.Errorf("/proc/meminfo %s: %w", field, err)
		}
		return kb >> 10, nil
	}
	return 0, fmt.Errorf("/proc/meminfo has no %s", field)
}

// cgroupPaths returns, per controller ("" for the v2 hierarchy), the
// directory of this process's cgroup.
func cgroupPaths() map[string]string {
	data, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return nil
	}
	out := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		if parts[1] == "" {
			out[""] = filepath.Join("/sys/fs/cgroup", parts[2])
			continue
		}
		for _, c := range strings.Split(parts[1], ",") {
			out[c] = filepath.Join("/sys/fs/cgroup", parts[1], parts[2])
		}
	}
	return out
}

func readTrim(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// cgroupCPUs returns the CPU quota of this process's cgroup in whole CPUs
// (rounded up), or 0 for none.
func cgroupCPUs() int {
	paths := cgroupPaths()
	var quota, period float64
	if dir, ok := paths[""]; ok {
		if f := strings.Fields(readTrim(filepath.Join(dir, "cpu.max"))); len(f) == 2 && f[0] != "max" {
			quota, _ = strconv.ParseFloat(f[0], 64)
			period, _ = strconv.ParseFloat(f[1], 64)
		}
	}
	if dir, ok := paths["cpu"]; ok && quota <= 0 {
		quota, _ = strconv.ParseFloat(readTrim(filepath.Join(dir, "cpu.cfs_quota_us")), 64)
		period, _ = strconv.ParseFloat(readTrim(filepath.Join(dir, "cpu.cfs_period_us")), 64)
	}
	if quota <= 0 || period <= 0 {
		return 0
	}
	return int(math.Ceil(quota / period))
}

// cgroupMemoryMiB returns the memory limit of this process's cgroup in
// MiB, or 0 for none.
func cgroupMemoryMiB() int64 {
	paths := cgroupPaths()
	v := ""
	if dir, ok := paths[""]; ok {
		v = readTrim(filepath.Join(dir, "memory.max"))
	}
	if dir, ok := paths["memory"]; ok && (v == "" || v == "max") {
		v = readTrim(filepath.Join(dir, "memory.limit_in_bytes"))
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n <= 0 || n >= 1<<60 { // v1 says "no limit" with a huge number
		return 0
	}
	return n >> 20
}
