package integration

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"text/tabwriter"
	"time"

	"github.com/emberbox/emberbox/internal/pricing"
)

// BenchmarkMeteredRun runs the product page's workload once for real: a
// default sandbox (2 vCPU, 4 GiB) that lives 90 s from ready to stop and is
// busy for 15 CPU-seconds as its guest counts them. It prints what the
// meters said (host CPU, guest CPU, GiB-s, resident memory, charge) and what
// 40,000 such runs a month cost at Emberbox's prices and at each provider's,
// from the metered quantities. It asserts nothing about time.
func BenchmarkMeteredRun(b *testing.B) {
	for range b.N {
		s := startServerWith(b, b.TempDir(), "--meter-interval", "5s")
		c := s.client(s.AdminKey)
		sb := c.createRunning(b, nil)
		ready := time.Now()
		out := c.sh(b, sb.ID, `python3 -c '
import time
t = time.process_time()
while time.process_time() - t < 15:
    pass
print(time.process_time() - t)'`)
		guestBurn, _ := strconv.ParseFloat(strings.TrimSpace(out), 64)
		// Resident memory at its peak, from the metrics, before the stop.
		type metrics struct {
			Points []struct {
				MemoryBytes *int64 `json:"memoryBytes"`
			} `json:"points"`
		}
		time.Sleep(time.Until(ready.Add(90 * time.Second)))
		m, _ := call[metrics](b, c, "GET", "/v1/sandboxes/"+sb.ID+"/metrics?range=15m", nil, nil)
		var rss int64
		for _, p := range m.Points {
			if p.MemoryBytes != nil {
				rss = max(rss, *p.MemoryBytes)
			}
		}
		c.lifecycle(b, sb.ID, "stop", nil)
		u, _ := call[struct {
			Groups []usageGroup `json:"groups"`
		}](b, c, "GET", "/v1/usage", nil, nil)
		var g usageGroup
		for _, x := range u.Groups {
			if x.Key == sb.ID {
				g = x
			}
		}
		host, guest, running := secs(b, g.ActiveCPUSeconds), secs(b, g.GuestCPUSeconds), secs(b, g.RunningSeconds)
		b.ReportMetric(running, "running-s")
		b.ReportMetric(host, "host-cpu-s")
		b.ReportMetric(guest, "guest-cpu-s")
		b.ReportMetric(float64(rss)/(1<<20), "rss-MiB")

		tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintf(tw, "\nmetered run (accel %s)\t\n", accelOf(b, c))
		fmt.Fprintf(tw, "running\t%s s\n", g.RunningSeconds)
		fmt.Fprintf(tw, "guest loop burned\t%.2f CPU-s\n", guestBurn)
		fmt.Fprintf(tw, "host CPU (VMM, cgroup)\t%s CPU-s\n", g.ActiveCPUSeconds)
		fmt.Fprintf(tw, "guest CPU (its /proc/stat)\t%s CPU-s\n", g.GuestCPUSeconds)
		if guest > 0 {
			fmt.Fprintf(tw, "host over guest\t%+.1f%%\n", (host/guest-1)*100)
		}
		fmt.Fprintf(tw, "reserved memory\t%s GiB-s\n", g.MemoryGiBSeconds)
		fmt.Fprintf(tw, "peak resident memory\t%.0f MiB\n", float64(rss)/(1<<20))
		fmt.Fprintf(tw, "charged\t%s µ$ (cpu %s, memory %s)\n", g.ChargedMicros, g.CPUMicros, g.MemoryMicros)
		// 40,000 runs a month like this one, at each provider's rates.
		ms := int64(running * 1000)
		one := pricing.Usage{RunningMs: ms, VCPUMs: 2 * ms, MemoryMiBMs: 4096 * ms, ActiveCPUNs: int64(host * 1e9), Runs: 1}
		one.BilledCPUNs = pricing.DefaultRates().BilledCPUNs(one.ActiveCPUNs, ms)
		month := pricing.Usage{RunningMs: one.RunningMs * 40000, VCPUMs: one.VCPUMs * 40000, MemoryMiBMs: one.MemoryMiBMs * 40000,
			ActiveCPUNs: one.ActiveCPUNs * 40000, BilledCPUNs: one.BilledCPUNs * 40000, Runs: 40000}
		fmt.Fprintf(tw, "\n40,000 such runs a month\t\n")
		for _, p := range pricing.Providers() {
			q := p.Price(month)
			fmt.Fprintf(tw, "%s\t$%.2f\n", p.Name, float64(pricing.Cents(q.TotalMicros))/100)
		}
		tw.Flush()
		s.cleanup(b)
	}
}
