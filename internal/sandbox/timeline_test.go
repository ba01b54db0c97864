package sandbox

import (
	"testing"
	"time"
)

func TestTimeline(t *testing.T) {
	var none *timeline
	none.mark("start") // a sandbox with no timeline records nothing
	if none.ms() != nil || withPhases(nil, none) != nil {
		t.Fatal("a nil timeline reported phases")
	}
	tl := newTimeline()
	time.Sleep(2 * time.Millisecond)
	tl.mark("admit")
	tl.mark("connect")
	time.Sleep(2 * time.Millisecond)
	tl.mark("connect") // a retried phase adds up
	got := withPhases(map[string]any{"attempt": 1}, tl)["phasesMs"].(map[string]float64)
	if len(got) != 2 || got["admit"] < 2 || got["connect"] < 2 {
		t.Errorf("phases %v, want admit and connect of at least 2 ms each", got)
	}
}
