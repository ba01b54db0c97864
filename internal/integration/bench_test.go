package integration

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"
)

// The benchmarks measure and report (b.ReportMetric); they assert nothing
// about time. Run them with `make bench`:
//   go test -run '^$' -bench . -benchtime 1x ./internal/integration/

// BenchmarkColdCreate: 10 sequential creates with default resources, each
// timed from the POST to the first output of a streamed `echo hi`.
func BenchmarkColdCreate(b *testing.B) {
	s := startServerWith(b, b.TempDir(), "--templates=false") // every create boots
	c := s.client(s.AdminKey)
	const n = 10
	b.ResetTimer()
	for range b.N {
		var ms []float64
		for i := range n {
			start := time.Now()
			sb := c.create(b, nil, nil)
			if sb.State != "running" {
				sb = c.waitState(b, sb.ID, "running")
			}
			created := time.Since(start)
			firstOutput(b, c, sb.ID, "echo hi")
			total := time.Since(start)
			ms = append(ms, float64(total)/float64(time.Millisecond))
			b.Logf("create %d: running after %s, first output after %s", i+1, created.Round(time.Millisecond), total.Round(time.Millisecond))
			b.StopTimer()
			c.delete(b, sb.ID)
			b.StartTimer()
		}
		b.ReportMetric(percentile(ms, 50), "p50-ms")
		b.ReportMetric(percentile(ms, 90), "p90-ms")
	}
}

// firstOutput runs command as a streamed exec and returns when its first
// stdout event arrives, reading the rest of the stream afterwards.
func firstOutput(b *testing.B, c *client, id, command string) {
	b.Helper()
	body, _ := json.Marshal(execReq{Command: command, Stream: true})
	ctx, cancel := context.WithTimeout(context.Background(), requestTimeout)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "POST", c.s.URL+"/v1/sandboxes/"+id+":exec", strings.NewReader(string(body)))
	req.Header.Set("Authorization", "Bearer "+c.key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.hc.Do(req)
	if err != nil {
		b.Fatalf("streamed exec: %v", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b.Fatalf("streamed exec: HTTP %d", resp.StatusCode)
	}
	sc := bufio.NewScanner(resp.Body)
	got := false
	for sc.Scan() {
		var ev streamEvent
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			b.Fatalf("stream line %q: %v", sc.Text(), err)
		}
		if ev.Type == "stdout" && !got {
			got = true
			if string(ev.bytes(b)) != "hi\n" {
				b.Errorf("first output %q, want \"hi\\n\"", ev.bytes(b))
			}
			b.StopTimer() // the rest of the stream is not measured
			defer b.StartTimer()
		}
		if ev.Type == "exit" || ev.Type == "error" {
			break
		}
	}
	if !got {
		b.Fatalf("no output from %q", command)
	}
}

// BenchmarkExecTrue: 50 `true` execs through the API on one sandbox; the API
// latency beside the agent's durationMs shows the overhead.
func BenchmarkExecTrue(b *testing.B) {
	s := startServer(b, b.TempDir())
	c := s.client(s.AdminKey)
	sb := c.createRunning(b, nil)
	c.sh(b, sb.ID, "true") // warm: first connection, page cache
	const n = 50
	b.ResetTimer()
	for range b.N {
		var api, agent, overhead []float64
		for range n {
			start := time.Now()
			res, _ := c.exec(b, sb.ID, execReq{Command: "true"})
			took := float64(time.Since(start)) / float64(time.Millisecond)
			if res.ExitCode == nil || *res.ExitCode != 0 {
				b.Fatalf("true: exit %s", res.exit())
			}
			api = append(api, took)
			agent = append(agent, float64(res.DurationMs))
			overhead = append(overhead, took-float64(res.DurationMs))
		}
		b.ReportMetric(percentile(api, 50), "api-p50-ms")
		b.ReportMetric(percentile(api, 90), "api-p90-ms")
		b.ReportMetric(percentile(agent, 50), "agent-p50-ms")
		b.ReportMetric(percentile(overhead, 50), "overhead-p50-ms")
	}
}

// BenchmarkIdle: one idle sandbox with default resources; host CPU of its
// QEMU process over 60 s (utime+stime from /proc/PID/stat) as % of one core,
// and its resident memory.
func BenchmarkIdle(b *testing.B) {
	s := startServer(b, b.TempDir())
	c := s.client(s.AdminKey)
	sb := c.createRunning(b, nil)
	c.sh(b, sb.ID, "true")
	pid := vmPID(sb.ID)
	if pid == 0 {
		b.Fatalf("no QEMU process for %s", sb.ID)
	}
	hz := clockTicks()
	const window = 60 * time.Second
	b.ResetTimer()
	for range b.N {
		t0, ticks0 := time.Now(), cpuTicks(b, pid)
		time.Sleep(window) // the measurement window itself
		t1, ticks1 := time.Now(), cpuTicks(b, pid)
		cpu := float64(ticks1-ticks0) / hz / t1.Sub(t0).Seconds() * 100
		rss := rssMiB(b, pid)
		b.ReportMetric(cpu, "cpu-%core")
		b.ReportMetric(rss, "rss-MiB")
		b.Logf("idle VM pid %d: %.2f%% of one core over %s, VmRSS %.0f MiB", pid, cpu, t1.Sub(t0).Round(time.Millisecond), rss)
	}
}

// cpuTicks returns utime+stime of pid, in clock ticks.
func cpuTicks(b testing.TB, pid int) uint64 {
	b.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		b.Fatalf("reading stat of VM pid %d: %v", pid, err)
	}
	s := string(data)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	// Fields after the command: state is field 3, utime 14, stime 15.
	ut, err1 := strconv.ParseUint(f[11], 10, 64)
	st, err2 := strconv.ParseUint(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		b.Fatalf("malformed /proc/%d/stat: %q", pid, s)
	}
	return ut + st
}

// rssMiB returns VmRSS of pid in MiB.
func rssMiB(b testing.TB, pid int) float64 {
	b.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		b.Fatalf("reading status of VM pid %d: %v", pid, err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			f := strings.Fields(rest) // "123456 kB"
			kb, err := strconv.ParseFloat(f[0], 64)
			if err == nil {
				return kb / 1024
			}
		}
	}
	b.Fatalf("no VmRSS in /proc/%d/status", pid)
	return 0
}

// clockTicks is the kernel's USER_HZ (getconf CLK_TCK), 100 if unknown.
func clockTicks() float64 {
	out, err := exec.Command("getconf", "CLK_TCK").Output()
	if err == nil {
		if v, err := strconv.ParseFloat(strings.TrimSpace(string(out)), 64); err == nil && v > 0 {
			return v
		}
	}
	return 100
}
