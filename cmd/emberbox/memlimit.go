package main

import (
	"fmt"
	"log/slog"
	"math"
	"os"
	"runtime/debug"
	"strconv"
	"strings"

	"github.com/emberbox/emberbox/internal/sandbox"
	"golang.org/x/sys/unix"
)

// The server's own memory is bounded softly by the Go runtime's memory
// limit (GOMEMLIMIT): near it, the collector runs harder instead of letting
// the heap grow. Everything a guest or a tenant can make the server hold is
// bounded too, so the limit is a second line, set well above the server's
// usual tens of MiB.
const (
	defaultMemoryLimitMax = 1 << 30 // 1 GiB
	defaultMemoryLimitMin = 256 << 20
)

// setMemoryLimit applies --memory-limit: "" derives the default (the
// environment's GOMEMLIMIT if set, else a quarter of the host's memory,
// between 256 MiB and 1 GiB), "off" removes the limit, anything else is a
// size such as 512MiB or 2GiB. It returns the limit in force (0: none).
func setMemoryLimit(flag string) (int64, error) {
	switch {
	case flag == "" && os.Getenv("GOMEMLIMIT") != "":
		return debug.SetMemoryLimit(-1), nil // the runtime read it at start
	case flag == "":
		limit := int64(defaultMemoryLimitMax)
		var si unix.Sysinfo_t
		if err := unix.Sysinfo(&si); err == nil {
			total := int64(si.Totalram) * int64(si.Unit)
			limit = max(min(total/4, defaultMemoryLimitMax), defaultMemoryLimitMin)
		}
		debug.SetMemoryLimit(limit)
		return limit, nil
	case flag == "off":
		debug.SetMemoryLimit(math.MaxInt64)
		return 0, nil
	}
	n, err := parseSize(flag)
	if err != nil || n < 64<<20 {
		return 0, fmt.Errorf("--memory-limit %q: want a size of at least 64MiB (such as 512MiB or 2GiB) or \"off\"", flag)
	}
	debug.SetMemoryLimit(n)
	return n, nil
}

// parseSize parses a byte count with an optional KiB, MiB or GiB suffix.
func parseSize(s string) (int64, error) {
	mult := int64(1)
	for _, u := range []struct {
		suffix string
		mult   int64
	}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}} {
		if v, ok := strings.CutSuffix(s, u.suffix); ok {
			s, mult = v, u.mult
			break
		}
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < 0 || n > math.MaxInt64/mult {
		return 0, fmt.Errorf("bad size %q", s)
	}
	return n * mult, nil
}

// protectFromOOM lowers the server's standing with the host kernel's OOM
// killer below every VM's (sandbox.OOMScoreServer; the reaper scores the
// VMs, which start with the server's score, within a second): if the host
// ever runs out of memory, a VM ends, and the server that accounts for it
// stays. Lowering a score needs CAP_SYS_RESOURCE; without it the server
// runs as it is and says so.
func protectFromOOM(log *slog.Logger) {
	adj := strconv.Itoa(sandbox.OOMScoreServer)
	if err := os.WriteFile("/proc/self/oom_score_adj", []byte(adj), 0); err != nil {
		log.Warn("could not lower the server's oom score; under host memory exhaustion the kernel may end it", "err", err)
		return
	}
	log.Debug("oom score", "oom_score_adj", adj)
}
