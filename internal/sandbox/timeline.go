package sandbox

import (
	"math"
	"sync"
	"time"
)

// timeline records how long each phase of a sandbox's way to running
// took (admission, the record, the VM's start, the guest's connection, …),
// for the phasesMs of its ready or woken event: where a create's or a
// wake's time goes, phase by phase, for whoever makes it faster.
type timeline struct {
	mu     sync.Mutex
	last   time.Time
	order  []string
	phases map[string]time.Duration
}

func newTimeline() *timeline {
	return &timeline{last: time.Now(), phases: map[string]time.Duration{}}
}

// mark ends phase name at now: it took the time since the previous mark
// (a phase marked twice, as a retried boot's, adds up). A nil timeline
// records nothing.
func (t *timeline) mark(name string) {
	if t == nil {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	now := time.Now()
	if _, ok := t.phases[name]; !ok {
		t.order = append(t.order, name)
	}
	t.phases[name] += now.Sub(t.last)
	t.last = now
}

// ms returns each phase's time in milliseconds, to a tenth; nil for a nil
// or empty timeline.
func (t *timeline) ms() map[string]float64 {
	if t == nil {
		return nil
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.order) == 0 {
		return nil
	}
	out := make(map[string]float64, len(t.order))
	for _, name := range t.order {
		out[name] = math.Round(float64(t.phases[name])/float64(time.Millisecond)*10) / 10
	}
	return out
}

// withPhases adds t's phases to an event's data as phasesMs.
func withPhases(data map[string]any, t *timeline) map[string]any {
	if ms := t.ms(); ms != nil {
		if data == nil {
			data = map[string]any{}
		}
		data["phasesMs"] = ms
	}
	return data
}
