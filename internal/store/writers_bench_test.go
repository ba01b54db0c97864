package store

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/emberbox/emberbox/internal/cluster"
	"github.com/emberbox/emberbox/internal/pgtest"
	"github.com/emberbox/emberbox/internal/sandbox"
)

// BenchmarkConcurrentWriters measures the store's write rate when one, two
// or three nodes write at once, as a cluster's nodes do: each node (a
// Store of its own on the one database, registered as a node) runs four
// writers, each changing the state of sandboxes of its node in a loop
// (UpdateSandbox: read, decide, write in one transaction, with the
// node's fence checked), and the figure is transitions a second in all.
// On SQLite the nodes share one file; the cluster's engine is PostgreSQL
// (the suite's second run; its test server runs with fsync off, so commit
// latency here is the lower bound).
func BenchmarkConcurrentWriters(b *testing.B) {
	for _, nodes := range []int{1, 2, 3} {
		b.Run(fmt.Sprintf("nodes=%d", nodes), func(b *testing.B) {
			benchWriters(b, nodes, 4)
		})
	}
}

// BenchmarkConcurrentWritersDurable is BenchmarkConcurrentWriters on a
// PostgreSQL server that syncs every commit to its disk, as a production
// one does: what one writer at a time costs is then the disk's commit
// latency, which writers of different rows share (group commit) only if
// they may commit at once. PostgreSQL run only.
func BenchmarkConcurrentWritersDurable(b *testing.B) {
	if testEngine != postgresEngine {
		b.Skip("PostgreSQL only")
	}
	srv, err := pgtest.NewDurable()
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { srv.Stop() })
	for _, nodes := range []int{1, 2, 3} {
		b.Run(fmt.Sprintf("nodes=%d", nodes), func(b *testing.B) {
			benchWritersOn(b, srv.NewDatabase(b), nodes, 4, false)
		})
	}
	// As the manager changes state: each transition with its trail entry,
	// which the feed carries too.
	for _, nodes := range []int{1, 2, 3} {
		b.Run(fmt.Sprintf("nodes=%d/events", nodes), func(b *testing.B) {
			benchWritersOn(b, srv.NewDatabase(b), nodes, 4, true)
		})
	}
}

func benchWriters(b *testing.B, nodes, writers int) {
	benchWritersOn(b, newDSN(b), nodes, writers, false)
}

func benchWritersOn(b *testing.B, dsn string, nodes, writers int, events bool) {
	ctx := context.Background()
	now := time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)
	type worker struct {
		s  *Store
		id string
	}
	var work []worker
	for n := range nodes {
		s, err := Open(ctx, dsn)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { s.Close() })
		node := fmt.Sprintf("node-%d", n)
		epoch, err := s.RegisterNode(ctx, &cluster.Node{ID: node, Address: node + ":7443", APIURL: "http://" + node,
			MemoryMiB: 1 << 20, OverheadMiB: 64, VCPUs: 1 << 10, Accel: "tcg", Version: "bench"})
		if err != nil {
			b.Fatal(err)
		}
		s.SetNode(node, epoch)
		for w := range writers {
			id := fmt.Sprintf("sbx_%d%019d", n, w)
			sb := newSandbox(id, "key_1", now)
			if err := s.InsertSandbox(ctx, sb, ""); err != nil {
				b.Fatal(err)
			}
			work = append(work, worker{s: s, id: id})
		}
	}
	states := []sandbox.State{sandbox.StatePaused, sandbox.StateRunning}
	reports := []string{"paused", "woken"}
	b.ResetTimer()
	start := time.Now()
	var wg sync.WaitGroup
	for i, w := range work {
		n := b.N / len(work)
		if i < b.N%len(work) {
			n++
		}
		wg.Go(func() {
			for k := range n {
				var entries []*sandbox.TrailEntry
				if events {
					entries = append(entries, &sandbox.TrailEntry{Type: reports[k%2], Message: "bench"})
				}
				if _, err := w.s.UpdateSandbox(ctx, w.id, func(sb *sandbox.Sandbox) bool {
					sb.State = states[k%2]
					return true
				}, entries...); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	b.StopTimer()
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "transitions/s")
}
