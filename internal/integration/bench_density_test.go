package integration

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"text/tabwriter"
	"time"

	"github.com/emberbox/emberbox/internal/admission"
)

// densityMax is how many sandboxes BenchmarkDensity creates at most (the
// issue's stretch target); EMBERBOX_BENCH_DENSITY_MAX lowers it.
func densityMax() int {
	if n, err := strconv.Atoi(os.Getenv("EMBERBOX_BENCH_DENSITY_MAX")); err == nil && n > 0 {
		return n
	}
	return 200
}

// BenchmarkDensity: a server started with default flags is filled with
// idle default sandboxes until it answers no_capacity (or the host's
// available memory nears the kernel's own reserve), then 20 of them each
// allocate 3 GiB at once. It reports how many were held, MemAvailable and
// Pss per sandbox, whether any sandbox was lost or any host process killed
// by the kernel, the p99 of GET /v1/sandboxes throughout, which sandboxes
// the server paused and why, and how long until memory came back.
func BenchmarkDensity(b *testing.B) {
	for range b.N {
		s := startServer(b, b.TempDir())
		c := s.client(s.AdminKey)
		waitTemplate(b, s)
		var rows [][2]string
		note := func(k, v string) {
			rows = append(rows, [2]string{k, v})
			fmt.Printf("density: %s: %s\n", k, v) // as it comes, should a later step fail
		}
		availStart, freeStart := memAvailableMiB(), freeMiB(s.DataDir)
		oomStart := hostOOMKills()

		ids, why := fill(b, s, c, densityMax())
		note("idle default sandboxes held, default flags", fmt.Sprintf("%d (%s)", len(ids), why))
		time.Sleep(30 * time.Second) // settle: the measure is of idle sandboxes
		availFull := memAvailableMiB()
		note("MemAvailable before → full", fmt.Sprintf("%d → %d MiB (%.0f MiB per sandbox)", availStart, availFull,
			float64(availStart-availFull)/float64(max(1, len(ids)))))
		// A slow fill outlasts the default idle pause (300 s): the first
		// sandboxes may be paused already, holding no VM.
		var pss []float64
		vms := 0
		for _, id := range ids {
			if pid := vmPID(id); pid != 0 {
				vms++
				if len(pss) < 10 {
					pss = append(pss, pssMiB(b, pid))
				}
			}
		}
		note("of them running (the rest paused by their idle timeout)", strconv.Itoa(vms))
		freeFull := freeMiB(s.DataDir)
		note("data dir free space before → full", fmt.Sprintf("%d → %d MiB (%.0f MiB per sandbox)", freeStart, freeFull,
			float64(freeStart-freeFull)/float64(max(1, len(ids)))))
		note("Pss per idle running sandbox (10 sampled)", fmt.Sprintf("p50 %.0f MiB, max %.0f MiB", percentile(pss, 50), percentile(pss, 100)))

		if len(ids) < 20 {
			b.Fatalf("only %d sandboxes held; the stress needs 20", len(ids))
		}
		hungry := ids[len(ids)-20:]
		lat, outcomes, took := stress(b, c, hungry)
		note("20 × 3 GiB at once: took", took.Round(time.Second).String())
		note("20 × 3 GiB at once: the allocations", outcomeSummary(outcomes))
		note("GET /v1/sandboxes during the stress", fmt.Sprintf("p50 %.0f ms, p99 %.0f ms, max %.0f ms (n=%d)",
			percentile(lat, 50), percentile(lat, 99), percentile(lat, 100), len(lat)))

		note("data dir free space after the stress", fmt.Sprintf("%d MiB", freeMiB(s.DataDir)))
		states, paused := accountFor(b, c, ids)
		note("sandboxes after the stress", fmt.Sprintf("%v", states))
		note("paused by the server, by reason", fmt.Sprintf("%v", paused))
		note("host processes killed by the kernel's OOM killer", strconv.FormatInt(hostOOMKills()-oomStart, 10))
		lost := 0
		for st, n := range states {
			if st != "running" && st != "paused" {
				lost += n
			}
		}
		if lost > 0 {
			b.Errorf("%d sandboxes neither running nor paused after the stress: %v", lost, states)
		}
		availAfter := memAvailableMiB()
		back := waitUntil(3*time.Minute, time.Second, func() bool { return memAvailableMiB() >= availFull-1024 })
		note("memory back to within 1 GiB of before the stress", fmt.Sprintf("%v (MemAvailable %d MiB right after, %d MiB now)",
			back, availAfter, memAvailableMiB()))

		printRows(rows)
		s.cleanup(b)
	}
}

// fill creates idle default sandboxes until no_capacity, max, or the
// host's available memory falls below 1 GiB (the server's own floor),
// and returns their ids and why it stopped.
func fill(b *testing.B, s *server, c *client, max int) ([]string, string) {
	var ids []string
	for len(ids) < max {
		if avail := memAvailableMiB(); avail < 1024 {
			return ids, fmt.Sprintf("host memory available %d MiB", avail)
		}
		r := c.raw(b, "POST", "/v1/sandboxes", map[string]any{"timeoutSeconds": 7200}, http.Header{"Prefer": {"wait=60"}}, requestTimeout)
		if r.Status == http.StatusConflict && r.Err != nil && r.Err.Code == "no_capacity" {
			return ids, "no_capacity: " + r.Err.Message
		}
		var sb sandboxJSON
		if r.Status != http.StatusOK || json.Unmarshal(r.Body, &sb) != nil {
			b.Fatalf("create %d: %v", len(ids)+1, r)
		}
		s.tr.add(sb.ID, s.AdminKey)
		if sb.State != "running" {
			c.waitState(b, sb.ID, "running")
		}
		ids = append(ids, sb.ID)
	}
	return ids, fmt.Sprintf("stopped at %d", max)
}

// allocate3GiB touches 3 GiB in the guest, holds it 10 s, and lets go.
const allocate3GiB = `python3 -c 'import time; b = bytearray(3 << 30); b[::4096] = b"\x01" * ((3 << 30) // 4096); time.sleep(10)'`

// stress runs allocate3GiB in every sandbox of ids at once while it times
// GET /v1/sandboxes every 250 ms; it returns the latencies (ms), how each
// allocation ended, and how long they took together.
func stress(b *testing.B, c *client, ids []string) ([]float64, []string, time.Duration) {
	done := make(chan struct{})
	var lat []float64
	var polls sync.WaitGroup
	polls.Go(func() {
		t := time.NewTicker(250 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
			}
			start := time.Now()
			r := c.raw(b, "GET", "/v1/sandboxes?limit=10", nil, nil, requestTimeout)
			ms := float64(time.Since(start)) / float64(time.Millisecond)
			if r.Status != http.StatusOK {
				ms = float64(requestTimeout / time.Millisecond) // counted as the worst
			}
			lat = append(lat, ms)
		}
	})
	outcomes := make([]string, len(ids))
	start := time.Now()
	var wg sync.WaitGroup
	for i, id := range ids {
		wg.Go(func() {
			r := c.raw(b, "POST", "/v1/sandboxes/"+id+":exec", execReq{Command: allocate3GiB, TimeoutMs: 15 * 60 * 1000}, nil, 20*time.Minute)
			var res execResult
			switch {
			case r.Status != http.StatusOK:
				code := ""
				if r.Err != nil {
					code = r.Err.Code
				}
				outcomes[i] = fmt.Sprintf("HTTP %d %s", r.Status, code)
			case json.Unmarshal(r.Body, &res) != nil || res.ExitCode == nil:
				outcomes[i] = "no exit code"
			case *res.ExitCode == 0:
				outcomes[i] = "exit 0"
			default:
				outcomes[i] = "exit " + strconv.Itoa(*res.ExitCode) // 137: the guest's OOM killer
			}
		})
	}
	wg.Wait()
	took := time.Since(start)
	close(done)
	polls.Wait()
	return lat, outcomes, took
}

func outcomeSummary(outcomes []string) string {
	n := map[string]int{}
	for _, o := range outcomes {
		n[o]++
	}
	keys := make([]string, 0, len(n))
	for k := range n {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var parts []string
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%d %s", n[k], k))
	}
	return strings.Join(parts, ", ")
}

// accountFor returns the state of every sandbox of ids and how many the
// server paused, by the reason of each pause event. It keeps to the
// default read rate, waiting out a 429 as a client would.
func accountFor(b *testing.B, c *client, ids []string) (states, paused map[string]int) {
	states, paused = map[string]int{}, map[string]int{}
	for _, id := range ids {
		var sb sandboxJSON
		getPaced(b, c, "/v1/sandboxes/"+id, &sb)
		states[sb.State]++
		var page struct {
			Data []struct {
				Type string         `json:"type"`
				Data map[string]any `json:"data"`
			} `json:"data"`
		}
		getPaced(b, c, "/v1/sandboxes/"+id+"/events?limit=1000", &page)
		for _, e := range page.Data {
			if e.Type == "paused" {
				why, _ := e.Data["reason"].(string)
				paused[why]++
			}
			if e.Type == "out_of_memory" {
				paused["(guest out of memory)"]++
			}
		}
	}
	return states, paused
}

// getPaced GETs path into v, waiting out rate_limited answers.
func getPaced(b *testing.B, c *client, path string, v any) {
	b.Helper()
	for range 100 {
		r := c.raw(b, "GET", path, nil, nil, requestTimeout)
		if r.Status == http.StatusTooManyRequests {
			time.Sleep(50 * time.Millisecond) // the read bucket refills at 100 a second
			continue
		}
		if r.Status != http.StatusOK || json.Unmarshal(r.Body, v) != nil {
			b.Fatalf("GET %s: %v", path, r)
		}
		return
	}
	b.Fatalf("GET %s: rate-limited 100 times", path)
}

// freeMiB is the free space of dir's filesystem: sandboxes' memory files
// and disks grow there as guests write.
func freeMiB(dir string) int64 {
	n, err := admission.DiskFreeMiB(dir)
	if err != nil {
		return -1
	}
	return n
}

// hostOOMKills is the host kernel's count of OOM kills since it booted
// (memory cgroups' included).
func hostOOMKills() int64 {
	data, _ := os.ReadFile("/proc/vmstat")
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "oom_kill "); ok {
			n, _ := strconv.ParseInt(v, 10, 64)
			return n
		}
	}
	return -1
}

// printRows prints measures as a table.
func printRows(rows [][2]string) {
	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "measure\tvalue")
	for _, r := range rows {
		fmt.Fprintf(w, "%s\t%s\n", r[0], r[1])
	}
	w.Flush()
}
