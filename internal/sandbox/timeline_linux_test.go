package sandbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/emberbox/emberbox/internal/sandbox"
)

// TestReadyEventTimesEachPhase: a create's ready event says how long each
// phase of its way to running took, in order of the path.
func TestReadyEventTimesEachPhase(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	m := e.manager()
	sb, err := m.Create(ctx, "k", spec())
	if err != nil {
		t.Fatal(err)
	}
	waitState(t, m, "k", sb.ID, sandbox.StateRunning)
	// The event is written just after the record says running.
	deadline := time.Now().Add(20 * time.Second)
	for {
		evs, err := e.st.ListEvents(ctx, sb.ID, 100)
		if err != nil {
			t.Fatal(err)
		}
		for _, ev := range evs {
			if ev.Type != "ready" {
				continue
			}
			phases, _ := ev.Data["phasesMs"].(map[string]any)
			for _, want := range []string{"admit", "record", "start", "recordVM", "handshake", "info", "configure", "prepare", "running"} {
				if ms, ok := phases[want].(float64); !ok || ms < 0 {
					t.Errorf("phasesMs %v: no %s", phases, want)
				}
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no ready event in %v", evs)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
