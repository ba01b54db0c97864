package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// BenchmarkClusterLiveness is the stress run of cluster liveness: three
// nodes with --node-heartbeat 1s --node-timeout 6s; in each repetition a
// 4 GiB sandbox with 512 MiB of touched memory is paused and its node
// drained (the sandbox moves to another node, and the node is undrained),
// while every node creates, execs in and deletes small sandboxes, and a
// CPU hog (two busy loops) and a disk hog (2 GiB written with O_DIRECT, in
// a loop, into the data dirs' filesystem) run beside them. It reports how
// many healthy nodes were declared lost over all repetitions (the nodes'
// logs and the store), the drains' time, and, at the end, how long after a
// kill -9 of a node it is declared lost. Run it for the figure with
// `go test -run '^$' -bench ClusterLiveness -benchtime 20x ./internal/integration/`.
func BenchmarkClusterLiveness(b *testing.B) {
	needVMs(b)
	const bigMiB = 4096
	nodes := startClusterNodes(b, 1_700_000, 2*(bigMiB+clusterOverheadMiB),
		"--stop-drain-timeout", "0", "--rate-read", "0", "--rate-write", "0")
	key := nodes[0].s.AdminKey
	via := func(n *clusterNode) *client { return n.s.client(key) }
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	hogs := startHogs(ctx, b, nodes[0].dataDir)

	// Small sandboxes come and go on every node throughout.
	var churn sync.WaitGroup
	var churned, churnFailed atomic.Int64
	for _, n := range nodes {
		churn.Go(func() {
			for ctx.Err() == nil {
				r := via(n).raw(b, "POST", "/v1/sandboxes", map[string]any{"memoryMiB": 512, "vcpu": 1},
					http.Header{"Prefer": {"wait=120"}}, requestTimeout)
				var sb sandboxJSON
				if r.Status != http.StatusOK && r.Status != http.StatusCreated || json.Unmarshal(r.Body, &sb) != nil || sb.ID == "" {
					churnFailed.Add(1)
					time.Sleep(time.Second)
					continue
				}
				via(n).raw(b, "POST", "/v1/sandboxes/"+sb.ID+":exec", execReq{Command: "echo churn"}, nil, requestTimeout)
				via(n).raw(b, "DELETE", "/v1/sandboxes/"+sb.ID, nil, nil, requestTimeout)
				churned.Add(1)
			}
		})
	}

	var drains []float64
	lost := 0
	b.ResetTimer()
	for i := range b.N {
		big := via(nodes[i%3]).createRunning(b, map[string]any{"memoryMiB": bigMiB, "vcpu": 1, "timeoutSeconds": 3600})
		// Slow under emulation beside the hogs: minutes, not the exec's
		// default limit.
		if res, _ := via(nodes[0]).exec(b, big.ID, execReq{Command: "yes emberbox | head -c 512M > /dev/shm/held", TimeoutMs: 600_000}); !exited0(res) {
			b.Fatalf("filling the sandbox's memory: exit %s, timed out %v, stderr %q", res.exit(), res.TimedOut, res.Stderr)
		}
		if r := via(nodes[0]).raw(b, "POST", "/v1/sandboxes/"+big.ID+":pause", map[string]any{}, http.Header{"Prefer": {"wait=120"}}, requestTimeout); r.Status != http.StatusOK {
			b.Fatalf("pause: %v", r)
		}
		from := via(nodes[0]).get(b, big.ID).Node
		start := time.Now()
		if r := via(nodes[0]).raw(b, "POST", "/v1/nodes/"+from+":drain", map[string]any{}, nil, requestTimeout); r.Status != http.StatusOK {
			b.Fatalf("drain %s: %v", from, r)
		}
		moved := waitUntil(5*time.Minute, 250*time.Millisecond, func() bool {
			got := via(nodes[0]).get(b, big.ID)
			return got.Node != from && got.Node != ""
		})
		drains = append(drains, time.Since(start).Seconds())
		via(nodes[0]).raw(b, "POST", "/v1/nodes/"+from+":undrain", map[string]any{}, nil, requestTimeout)
		via(nodes[0]).delete(b, big.ID)
		if !moved {
			b.Errorf("repetition %d: the paused sandbox never left node %s", i, from)
		}
		lost += restartLost(b, via(nodes[0]), nodes)
		// As it goes, for a long run read live.
		fmt.Fprintf(os.Stderr, "liveness repetition %d: drained %s in %.1f s; healthy nodes declared lost so far: %d\n",
			i+1, from, drains[len(drains)-1], lost)
	}
	b.StopTimer()
	cancel()
	churn.Wait()
	hogs.Wait()

	// A real failure is still found: node c killed.
	victim := nodes[2]
	killed := time.Now()
	if err := victim.s.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		b.Fatal(err)
	}
	<-victim.s.exited
	detected := waitUntil(time.Minute, 100*time.Millisecond, func() bool {
		for _, n := range listClusterNodes(b, via(nodes[0])) {
			if n.ID == victim.id && n.State == "down" {
				return true
			}
		}
		return false
	})
	if !detected {
		b.Errorf("node %s, killed, was not declared lost within a minute", victim.id)
	}
	detect := time.Since(killed)
	victim.start(b) // for the cleanup's orderly stop

	sort.Float64s(drains)
	b.ReportMetric(float64(lost), "healthy-nodes-lost")
	b.ReportMetric(drains[len(drains)/2], "drain-p50-s")
	b.ReportMetric(drains[len(drains)-1], "drain-max-s")
	b.ReportMetric(detect.Seconds(), "kill9-detected-s")
	b.Logf("%d repetitions: %d healthy nodes declared lost; drains p50 %.1f s, max %.1f s; %d small sandboxes created, exec'd and deleted beside them (%d creates refused or failed); a kill -9'd node declared lost %.1f s after",
		b.N, lost, drains[len(drains)/2], drains[len(drains)-1], churned.Load(), churnFailed.Load(), detect.Seconds())
	if lost > 0 {
		b.Errorf("%d healthy nodes were declared lost", lost)
	}
}

// startHogs runs a CPU hog (two busy loops) and a disk hog (2 GiB written
// with O_DIRECT into dir, again and again) until ctx ends.
func startHogs(ctx context.Context, b *testing.B, dir string) *sync.WaitGroup {
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() {
			cmd := exec.CommandContext(ctx, "sh", "-c", "while :; do :; done")
			_ = cmd.Run()
		})
	}
	wg.Go(func() {
		hog := filepath.Join(dir, "disk-hog")
		defer os.Remove(hog)
		for ctx.Err() == nil {
			cmd := exec.CommandContext(ctx, "dd", "if=/dev/zero", "of="+hog, "bs=1M", "count=2048", "oflag=direct", "status=none")
			if err := cmd.Run(); err != nil && ctx.Err() == nil {
				b.Logf("disk hog: %v", err)
				time.Sleep(time.Second)
			}
		}
	})
	return &wg
}

// restartLost starts again every node the cluster declared down (a
// declared node stands down and exits) and returns how many there were.
func restartLost(b *testing.B, c *client, nodes []*clusterNode) int {
	down := 0
	for _, row := range listClusterNodes(b, c) {
		if row.State != "down" {
			continue
		}
		down++
		for _, n := range nodes {
			if n.id == row.ID {
				b.Logf("node %s was declared lost while healthy; starting it again", n.id)
				select {
				case <-n.s.exited:
				case <-time.After(time.Minute):
					b.Fatalf("node %s, declared lost, did not stand down", n.id)
				}
				n.start(b)
			}
		}
	}
	return down
}
