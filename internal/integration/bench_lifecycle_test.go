package integration

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"text/tabwriter"
	"time"
)

// BenchmarkLifecycle measures the lifecycle on this machine, one table
// per part, each to be run alone (-bench 'Lifecycle/paths'):
//
//   - cold: a create with no template, to the first output;
//   - paths: create from the template, create from a user snapshot,
//     pause, wake and fork (each to the first output of a streamed
//     `echo hi`, p50 and p95, as the SDK calls them: Prefer: wait), with
//     the server's phases of each;
//   - memory: host memory (Pss) of an idle default sandbox and of copies
//     of one snapshot;
//   - holds: how many idle default sandboxes the host holds before
//     no_capacity, with the default limits and with memory and vCPUs
//     overcommitted.
//
// It asserts nothing about time.
func BenchmarkLifecycle(b *testing.B) {
	b.Run("cold", func(b *testing.B) {
		for range b.N {
			var t table
			s := startServerWith(b, b.TempDir(), "--templates=false")
			t.row("cold create → first output", createTimes(b, s.client(s.AdminKey), nil, 5))
			s.cleanup(b)
			t.print()
		}
	})
	b.Run("paths", func(b *testing.B) {
		for range b.N {
			benchPaths(b)
		}
	})
	b.Run("memory", func(b *testing.B) {
		for range b.N {
			benchMemory(b)
		}
	})
	b.Run("holds", func(b *testing.B) {
		for range b.N {
			var t table
			t.note("idle default sandboxes held, default limits", holds(b, []string{"--quota-sandboxes", "0"}, 100))
			t.note("idle default sandboxes held, --memory-overcommit 25 --vcpu-overcommit 100 --disk-overcommit 20",
				holds(b, []string{"--quota-sandboxes", "0", "--memory-overcommit", "25", "--vcpu-overcommit", "100", "--disk-overcommit", "20"}, 100))
			t.print()
		}
	})
}

// benchPaths times the ways to a first command from a client: create from
// the template and from a user snapshot, pause, wake and fork.
func benchPaths(b *testing.B) {
	var t table
	s, c := templateServer(b)
	t.note("accel", accelOf(b, c))
	var createPhases phaseStats
	t.row("create (template) → first output", createTimes(b, c, nil, 20, func(id string) { createPhases.add(phasesOf(b, c, id, "ready")) }))
	t.note("create (template): server phases, p50", createPhases.String())

	src, sn := snapshotSource(b, c)
	t.row("create from a user snapshot → first output", createTimes(b, c, map[string]any{"snapshot": sn, "timeoutSeconds": 600}, 10))

	var pause, wake []float64
	var wakePhases phaseStats
	for range 20 {
		start := time.Now()
		c.lifecycle(b, src.ID, "pause", nil)
		c.waitState(b, src.ID, "paused")
		pause = append(pause, ms(time.Since(start)))
		start = time.Now()
		c.lifecycle(b, src.ID, "wake", nil)
		firstOutput(b, c, src.ID, "echo hi")
		wake = append(wake, ms(time.Since(start)))
		wakePhases.add(phasesOf(b, c, src.ID, "woken"))
	}
	t.row("pause", pause)
	t.row("wake → first output", wake)
	t.note("wake: server phases, p50", wakePhases.String())
	c.lifecycle(b, src.ID, "pause", nil)
	c.waitState(b, src.ID, "paused")
	t.note("host processes of a paused sandbox", strconv.Itoa(btoi(vmPID(src.ID) != 0)))
	c.lifecycle(b, src.ID, "wake", nil)
	c.waitState(b, src.ID, "running")

	var fork []float64
	var forkPhases phaseStats
	for range 10 {
		start := time.Now()
		r := c.raw(b, "POST", "/v1/sandboxes/"+src.ID+":fork", map[string]any{"count": 1}, nil, requestTimeout)
		var f struct {
			Sandboxes []sandboxJSON `json:"sandboxes"`
		}
		if r.Status != http.StatusOK || json.Unmarshal(r.Body, &f) != nil || len(f.Sandboxes) != 1 {
			b.Fatalf("fork: %v", r)
		}
		s.tr.add(f.Sandboxes[0].ID, s.AdminKey)
		firstOutput(b, c, f.Sandboxes[0].ID, "echo hi")
		fork = append(fork, ms(time.Since(start)))
		forkPhases.add(phasesOf(b, c, f.Sandboxes[0].ID, "ready"))
		c.delete(b, f.Sandboxes[0].ID)
	}
	t.row("fork → first output", fork)
	t.note("fork: server phases of the copy, p50", forkPhases.String())
	t.print()
}

// benchMemory measures the host memory of an idle default sandbox and of
// ten copies of one snapshot after a minute of idling.
func benchMemory(b *testing.B) {
	var t table
	_, c := templateServer(b)
	src, sn := snapshotSource(b, c)
	c.delete(b, src.ID)

	idle := c.createRunning(b, map[string]any{"timeoutSeconds": 3600})
	c.sh(b, idle.ID, "true")
	var copies []string
	for range 10 {
		cp := c.createRunning(b, map[string]any{"snapshot": sn, "timeoutSeconds": 3600})
		c.sh(b, cp.ID, "true")
		copies = append(copies, cp.ID)
	}
	time.Sleep(60 * time.Second) // the idle period being measured
	t.note("Pss of an idle default sandbox after 60 s", fmt.Sprintf("%.0f MiB", pssMiB(b, vmPID(idle.ID))))
	var pss []float64
	for _, id := range copies {
		pss = append(pss, pssMiB(b, vmPID(id)))
	}
	t.note("Pss of each of 10 copies of one snapshot", fmt.Sprintf("p50 %.0f MiB, max %.0f MiB", percentile(pss, 50), percentile(pss, 100)))
	t.print()
}

// templateServer starts a server with no cap on sandboxes per key (room
// for all a part creates; startServerWith cleans it up at the end of b)
// and waits for its default template.
func templateServer(b *testing.B) (*server, *client) {
	s := startServerWith(b, b.TempDir(), "--quota-sandboxes", "0")
	waitTemplate(b, s)
	return s, s.client(s.AdminKey)
}

// snapshotSource creates a sandbox with a file written and takes a memory
// snapshot of it; it returns the sandbox and the snapshot's id.
func snapshotSource(b *testing.B, c *client) (sandboxJSON, string) {
	src := c.createRunning(b, map[string]any{"timeoutSeconds": 3600})
	c.sh(b, src.ID, "echo hi > /workspace/f")
	return src, snapshotOf(b, c, src.ID)
}

// snapshotOf takes a memory snapshot of sandbox id and returns its id.
func snapshotOf(b *testing.B, c *client, id string) string {
	b.Helper()
	r := c.raw(b, "POST", "/v1/sandboxes/"+id+":snapshot", map[string]any{}, http.Header{"Prefer": {"wait=60"}}, requestTimeout)
	var sn struct {
		ID string `json:"id"`
	}
	if r.Status != http.StatusOK || json.Unmarshal(r.Body, &sn) != nil || sn.ID == "" {
		b.Fatalf("snapshot: %v", r)
	}
	return sn.ID
}

// table is a benchmark's printed result: a row per measure.
type table struct{ rows [][3]string }

// row adds a timed measure's p50 and p95.
func (t *table) row(what string, ms []float64) {
	t.rows = append(t.rows, [3]string{what, fmt.Sprintf("%.0f ms", percentile(ms, 50)), fmt.Sprintf("%.0f ms (n=%d)", percentile(ms, 95), len(ms))})
}

// rowUnit adds a measure's p50 and p95 in unit.
func (t *table) rowUnit(what string, xs []float64, unit string) {
	t.rows = append(t.rows, [3]string{what, fmt.Sprintf("%.1f %s", percentile(xs, 50), unit), fmt.Sprintf("%.1f %s (n=%d)", percentile(xs, 95), unit, len(xs))})
}

// note adds a measure given as text.
func (t *table) note(what, value string) { t.rows = append(t.rows, [3]string{what, value, ""}) }

func (t *table) print() {
	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "measure\tp50 / value\tp95")
	for _, r := range t.rows {
		fmt.Fprintf(w, "%s\t%s\t%s\n", r[0], r[1], r[2])
	}
	w.Flush()
}

// createTimes creates n sandboxes with body one after another, timing each
// from the POST to the first output of a streamed echo, checks each with
// check (if not nil), and deletes them.
func createTimes(b *testing.B, c *client, body map[string]any, n int, check ...func(id string)) []float64 {
	var out []float64
	for range n {
		start := time.Now()
		sb := c.create(b, body, nil)
		if sb.State != "running" {
			sb = c.waitState(b, sb.ID, "running")
		}
		firstOutput(b, c, sb.ID, "echo hi")
		out = append(out, ms(time.Since(start)))
		for _, f := range check {
			f(sb.ID)
		}
		c.delete(b, sb.ID)
	}
	return out
}

// holds creates idle default sandboxes on a fresh server started with args
// until it answers no_capacity, the host's available memory falls below 2
// GiB, or max run; it reports how many ran.
func holds(b *testing.B, args []string, max int) string {
	s := startServerWith(b, b.TempDir(), args...)
	defer s.cleanup(b)
	c := s.client(s.AdminKey)
	waitTemplate(b, s)
	why := fmt.Sprintf("stopped at %d", max)
	n := 0
	for n < max {
		if avail := memAvailableMiB(); avail < 2048 {
			why = fmt.Sprintf("host memory available %d MiB", avail)
			break
		}
		r := c.raw(b, "POST", "/v1/sandboxes", map[string]any{"timeoutSeconds": 3600}, http.Header{"Prefer": {"wait=60"}}, requestTimeout)
		if r.Status == http.StatusConflict && r.Err != nil && r.Err.Code == "no_capacity" {
			why = "no_capacity"
			break
		}
		var sb sandboxJSON
		if r.Status != http.StatusOK || json.Unmarshal(r.Body, &sb) != nil {
			b.Fatalf("create %d: %v", n+1, r)
		}
		s.tr.add(sb.ID, s.AdminKey)
		if sb.State != "running" {
			c.waitState(b, sb.ID, "running")
		}
		n++
	}
	return fmt.Sprintf("%d (%s; host memory available after: %d MiB)", n, why, memAvailableMiB())
}

// waitTemplate waits until the server's default template is built.
func waitTemplate(b *testing.B, s *server) {
	b.Helper()
	ok := waitUntil(5*time.Minute, 200*time.Millisecond, func() bool {
		m, _ := filepath.Glob(filepath.Join(s.DataDir, "templates", "*", "2cpu-4096mib-4096mib", "template.ok"))
		return len(m) > 0
	})
	if !ok {
		b.Fatalf("the default template was not built in 5 minutes; log:\n%s", s.logTail(30))
	}
}

func accelOf(b *testing.B, c *client) string {
	sb := c.createRunning(b, map[string]any{"timeoutSeconds": 600})
	defer c.delete(b, sb.ID)
	if sb.Accel == nil {
		return "?"
	}
	if *sb.Accel == "kvm" {
		return "kvm"
	}
	return *sb.Accel + " (no KVM: software emulation)"
}

// pssMiB returns the proportional set size of pid in MiB (shared pages
// counted once among their sharers).
func pssMiB(b testing.TB, pid int) float64 {
	b.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
	if err != nil {
		b.Fatalf("reading smaps_rollup of VM pid %d: %v", pid, err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if rest, ok := strings.CutPrefix(line, "Pss:"); ok {
			if kb, err := strconv.ParseFloat(strings.Fields(rest)[0], 64); err == nil {
				return kb / 1024
			}
		}
	}
	b.Fatalf("no Pss in /proc/%d/smaps_rollup", pid)
	return 0
}

func memAvailableMiB() int {
	data, _ := os.ReadFile("/proc/meminfo")
	for _, line := range strings.Split(string(data), "\n") {
		if rest, ok := strings.CutPrefix(line, "MemAvailable:"); ok {
			kb, _ := strconv.Atoi(strings.Fields(rest)[0])
			return kb / 1024
		}
	}
	return 0
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func btoi(v bool) int {
	if v {
		return 1
	}
	return 0
}

// phasesOf returns the phasesMs of the newest event of type typ of
// sandbox id: where the server spent the time of its way to running.
func phasesOf(b *testing.B, c *client, id, typ string) map[string]float64 {
	page, _ := call[struct {
		Data []struct {
			Type string `json:"type"`
			Data struct {
				PhasesMs map[string]float64 `json:"phasesMs"`
			} `json:"data"`
		} `json:"data"`
	}](b, c, "GET", "/v1/sandboxes/"+id+"/events?limit=1000", nil, nil)
	var out map[string]float64
	for _, e := range page.Data {
		if e.Type == typ && e.Data.PhasesMs != nil {
			out = e.Data.PhasesMs
		}
	}
	return out
}

// phaseStats gathers the phases of several runs of one path.
type phaseStats map[string][]float64

func (p *phaseStats) add(phases map[string]float64) {
	if *p == nil {
		*p = phaseStats{}
	}
	for k, v := range phases {
		(*p)[k] = append((*p)[k], v)
	}
}

// phaseOrder is the order of the phases along the server's paths.
var phaseOrder = []string{"admit", "record", "clone", "start", "recordVM", "continue", "handshake", "info", "renew", "configure", "prepare", "running"}

// String gives each phase's p50 in path order, and their sum.
func (p phaseStats) String() string {
	var parts []string
	var sum float64
	for _, k := range phaseOrder {
		if xs := p[k]; len(xs) > 0 {
			v := percentile(xs, 50)
			sum += v
			parts = append(parts, fmt.Sprintf("%s %.0f", k, v))
		}
	}
	if len(parts) == 0 {
		return "no phases reported"
	}
	return fmt.Sprintf("%s (sum %.0f ms)", strings.Join(parts, ", "), sum)
}
