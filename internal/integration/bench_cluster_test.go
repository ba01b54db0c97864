package integration

import (
	"fmt"
	"net/http"
	"sort"
	"testing"
	"time"

	"github.com/emberbox/emberbox/internal/pgtest"
)

// BenchmarkCluster measures what a cluster adds to a call: two nodes on
// one PostgreSQL database, one sandbox on node b, and the same calls made
// through b (its owner) and through a (which proxies them over the
// node-to-node channel): a read of the record (no guest: the proxy's own
// cost) and an exec of `true`; and a create placed through a onto b
// against one made on b. Run with `make bench`.
func BenchmarkCluster(b *testing.B) {
	needVMs(b)
	dsn := pgtest.Start(b).NewDatabase(b)
	var nodes []*clusterNode
	for i, id := range []string{"a", "b"} {
		n := &clusterNode{id: id, host: fmt.Sprintf("127.0.0.%d", i+1), dataDir: b.TempDir()}
		n.channel = fmt.Sprintf("%s:%d", n.host, freePort(b))
		// b is the only node with room, so creates through a are placed on b.
		mem := clusterSlotMiB / 2
		if id == "b" {
			mem = 4 * clusterSlotMiB
		}
		n.args = []string{"--store", dsn, "--node-id", id, "--cluster-listen", n.channel,
			"--max-memory-mib", fmt.Sprint(mem), "--vm-overhead-mib", fmt.Sprint(clusterOverheadMiB),
			"--quota-sandboxes", "0", "--memory-floor-mib", "0", "--rate-read", "0", "--rate-write", "0",
			"--vm-uid-base", fmt.Sprint(1_600_000 + i*10_000), "--vm-uid-count", "10000"}
		n.start(b)
		nodes = append(nodes, n)
	}
	a, own := nodes[0], nodes[1]
	key := a.s.AdminKey
	ca, cb := a.s.client(key), own.s.client(key)
	body := map[string]any{"memoryMiB": clusterMemMiB, "vcpu": 1}
	sb := cb.createRunning(b, body)
	if got := cb.get(b, sb.ID); got.Node != "b" {
		b.Fatalf("sandbox on %q, want b", got.Node)
	}
	getMillis := func(c *client, n int) []float64 {
		var ms []float64
		for range n {
			start := time.Now()
			if r := c.raw(b, "GET", "/v1/sandboxes/"+sb.ID, nil, nil, requestTimeout); r.Status != http.StatusOK {
				b.Fatalf("get: %v", r)
			}
			ms = append(ms, float64(time.Since(start).Microseconds())/1000)
		}
		sort.Float64s(ms)
		return ms
	}
	// Creates through b and through a alternate, so that both see the
	// same state of b's template for the shape.
	var direct, placed []float64
	creates := func(n int) {
		direct, placed = nil, nil
		for range n {
			for _, c := range []*client{cb, ca} {
				start := time.Now()
				made := c.createRunning(b, body)
				ms := float64(time.Since(start).Microseconds()) / 1000
				if c == cb {
					direct = append(direct, ms)
				} else {
					placed = append(placed, ms)
				}
				cb.delete(b, made.ID)
			}
		}
		sort.Float64s(direct)
		sort.Float64s(placed)
	}
	b.ResetTimer()
	for range b.N {
		for _, m := range []struct {
			name string
			run  func() []float64
		}{
			{"get-owner", func() []float64 { return getMillis(cb, 200) }},
			{"get-proxied", func() []float64 { return getMillis(ca, 200) }},
			{"exec-owner", func() []float64 { return execMillis(b, cb, sb.ID, 50) }},
			{"exec-proxied", func() []float64 { return execMillis(b, ca, sb.ID, 50) }},
			{"create-owner", func() []float64 { creates(6); return direct }},
			{"create-placed", func() []float64 { return placed }},
		} {
			ms := m.run()
			b.ReportMetric(percentile(ms, 50), m.name+"-p50-ms")
			b.ReportMetric(percentile(ms, 90), m.name+"-p90-ms")
			b.Logf("%s: p50 %.2f ms, p90 %.2f ms (%d calls)", m.name, percentile(ms, 50), percentile(ms, 90), len(ms))
		}
	}
}
