package qemu

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/emberbox/emberbox/internal/vmm"
)

// clockTick is the unit of the CPU times in /proc/PID/stat (USER_HZ),
// which Linux fixes at 100 on every architecture Emberbox runs on.
const clockTick = 10 * time.Millisecond

// meter holds a machine's last CPU reading and, once its VMM has exited,
// its final one.
type meter struct {
	last  time.Duration // the newest CPU count read while it ran
	final *vmm.Usage    // set by ended
}

// Usage implements vmm.Machine.Usage. A confined VM is read from its
// cgroup (nanoseconds, every thread it ever had); an unconfined one from
// /proc. The final count is taken in ended, before the cgroup is removed.
func (m *machine) Usage() (vmm.Usage, error) {
	m.meterMu.Lock()
	defer m.meterMu.Unlock()
	if m.meter.final != nil {
		return *m.meter.final, nil
	}
	cpu, err := m.readCPU()
	if err != nil {
		return vmm.Usage{}, err
	}
	// A count never goes back; a reading that would (the /proc fallback
	// after the process is gone) answers the last one.
	cpu = max(cpu, m.meter.last)
	m.meter.last = cpu
	rss, _ := procRSS(m.pid)
	return vmm.Usage{CPU: cpu, RSSBytes: rss}, nil
}

// readCPU reads the VMM's CPU time so far.
func (m *machine) readCPU() (time.Duration, error) {
	if m.cgroup && m.d.jail != nil {
		return m.d.jail.cgroups.Open(m.id).CPUUsage()
	}
	return procCPU(m.pid)
}

// settleUsage records the final counters of a VMM that has exited. ps is
// its wait status when this process was its parent (nil when reattached):
// its rusage covers every thread. Without a cgroup or a wait status the
// last reading is the final one.
func (m *machine) settleUsage(ps *os.ProcessState) {
	m.meterMu.Lock()
	defer m.meterMu.Unlock()
	cpu := m.meter.last
	switch {
	case m.cgroup && m.d.jail != nil:
		if c, err := m.d.jail.cgroups.Open(m.id).CPUUsage(); err == nil {
			cpu = max(cpu, c)
		} else {
			m.d.log.Warn("reading the final cpu time of a vm", "sandbox_id", m.id, "err", err)
		}
	case ps != nil:
		cpu = max(cpu, ps.UserTime()+ps.SystemTime())
	}
	m.meter.final = &vmm.Usage{CPU: cpu, Final: true}
}

// procCPU reads utime+stime of a process from /proc/PID/stat: every
// thread's, in clock ticks.
func procCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')') // the command name may hold spaces
	if i < 0 {
		return 0, errors.New("malformed stat")
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 13 {
		return 0, errors.New("malformed stat")
	}
	// After the name: state(3) ... utime(14) stime(15), i.e. f[11], f[12].
	ut, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil || ut < 0 || st < 0 {
		return 0, errors.New("malformed stat")
	}
	return time.Duration(ut+st) * clockTick, nil
}

// procRSS reads VmRSS of a process from /proc/PID/status, in bytes.
func procRSS(pid int) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for line := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			if err != nil {
				return 0, fmt.Errorf("malformed VmRSS %q", v)
			}
			return kb << 10, nil
		}
	}
	return 0, nil // a zombie has no VmRSS
}
