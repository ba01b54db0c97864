package envd

import (
	"strings"
	"sync"
)

// Bounds of what the server remembers of sandboxes: tags of processes and
// read cursors of watchers. Past them the oldest is forgotten (a tag then
// no longer selects its process; a watcher is read from its start again).
const (
	maxTags     = 4096
	maxWatchers = 1024
)

// table is a bounded map keyed by sandbox and name, forgetting the oldest
// entry when full: what the guest cannot keep (E2B's process tags, the
// cursor of a polled watcher) is kept here, in memory.
type table[V any] struct {
	mu    sync.Mutex
	max   int
	m     map[string]V
	order []string // insertion order, for eviction
}

func newTable[V any](max int) *table[V] {
	return &table[V]{max: max, m: map[string]V{}}
}

func tableKey(sandboxID, name string) string { return sandboxID + "\x00" + name }

func (t *table[V]) get(sandboxID, name string) (V, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	v, ok := t.m[tableKey(sandboxID, name)]
	return v, ok
}

func (t *table[V]) put(sandboxID, name string, v V) {
	t.mu.Lock()
	defer t.mu.Unlock()
	k := tableKey(sandboxID, name)
	if _, ok := t.m[k]; !ok {
		for len(t.m) >= t.max && len(t.order) > 0 {
			delete(t.m, t.order[0])
			t.order = t.order[1:]
		}
		t.order = append(t.order, k)
	}
	t.m[k] = v
}

func (t *table[V]) remove(sandboxID, name string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	k := tableKey(sandboxID, name)
	if _, ok := t.m[k]; !ok {
		return
	}
	delete(t.m, k)
	for i, o := range t.order {
		if o == k {
			t.order = append(t.order[:i], t.order[i+1:]...)
			break
		}
	}
}

// entries returns a sandbox's entries by name.
func (t *table[V]) entries(sandboxID string) map[string]V {
	t.mu.Lock()
	defer t.mu.Unlock()
	prefix := sandboxID + "\x00"
	out := map[string]V{}
	for k, v := range t.m {
		if name, ok := strings.CutPrefix(k, prefix); ok {
			out[name] = v
		}
	}
	return out
}
