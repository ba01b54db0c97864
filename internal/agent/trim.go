package agent

import (
	"context"
	"os"
	"sync/atomic"
	"time"

	"github.com/emberbox/emberbox/internal/agentproto"
)

// DefaultTrimAfter is how long the host must have sent no work before the
// guest's page cache is trimmed (Config.TrimCachesAfter).
const DefaultTrimAfter = time.Minute

// cacheTrimmer drops the guest's clean page cache, and compacts its free
// memory, once the host has sent no work for a while: the freed pages go
// back to the host through free page reporting (the balloon device), so an
// idle sandbox holds little beyond what its processes use, in host memory
// and in its memory file. Page cache is the guest's largest reclaimable
// use and the kernel never frees it unasked while memory is plentiful,
// which from inside a VM it always looks. What it costs is a re-read of
// files from the disk (the host's page cache, shared by every VM) on the
// next command. The host's periodic info calls are not work.
type cacheTrimmer struct {
	after   time.Duration
	drop    func() error
	busy    atomic.Int64 // calls in flight
	last    atomic.Int64 // unix nanos when the last call ended
	trimmed atomic.Bool  // trimmed since the last call
}

// working reports whether a call of method is work that keeps the cache.
func working(method string) bool { return method != agentproto.MethodInfo }

func (t *cacheTrimmer) begin() {
	t.busy.Add(1)
	t.trimmed.Store(false)
}

func (t *cacheTrimmer) end(now time.Time) {
	t.last.Store(now.UnixNano())
	t.busy.Add(-1)
}

// tick trims once the host has been quiet for t.after, once per quiet
// spell, and reports whether it did.
func (t *cacheTrimmer) tick(now time.Time) bool {
	if t.busy.Load() > 0 || t.trimmed.Load() || now.Sub(time.Unix(0, t.last.Load())) < t.after {
		return false
	}
	t.trimmed.Store(true)
	return t.drop() == nil
}

// run ticks until ctx ends.
func (t *cacheTrimmer) run(ctx context.Context, log func(msg string, args ...any)) {
	tk := time.NewTicker(max(t.after/6, time.Second))
	defer tk.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-tk.C:
			if t.tick(now) {
				log("trimmed the page cache", "quiet_for", t.after)
			}
		}
	}
}

// dropCaches frees the guest kernel's clean page cache (not dentries and
// inodes, which are small and make the next command's lookups fast), then
// compacts free memory: page reporting hands back only whole free blocks
// (2 MiB), and freed cache pages lie scattered.
func dropCaches() error {
	if err := os.WriteFile("/proc/sys/vm/drop_caches", []byte("1\n"), 0); err != nil {
		return err
	}
	_ = os.WriteFile("/proc/sys/vm/compact_memory", []byte("1\n"), 0) // absent without CONFIG_COMPACTION
	return nil
}
