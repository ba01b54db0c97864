package sandbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/emberbox/emberbox/internal/sandbox"
)

// TestOOMRanking: each tick scores a running VM for the host's OOM killer
// by whether it has work in flight: idle ones go first, working ones
// after, and the server (below both) last.
func TestOOMRanking(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	m := e.manager()
	sb, err := m.Create(ctx, "k", spec())
	if err != nil {
		t.Fatal(err)
	}
	waitState(t, m, "k", sb.ID, sandbox.StateRunning)
	mach := e.drv.Machine(sb.ID)
	score := func() int {
		t.Helper()
		m.Reaper.ExpireLeases(ctx)
		s, ok := mach.OOMScore()
		if !ok {
			t.Fatal("the vm was never scored")
		}
		return s
	}
	idle := score()
	callCtx, endCall := context.WithCancel(ctx)
	if _, _, err := m.Guest(callCtx, "k", sb.ID); err != nil {
		t.Fatal(err)
	}
	busy := score()
	endCall()
	// The call's hold ends as its context does (context.AfterFunc).
	var after int
	for range 500 {
		if after = score(); after == idle {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if !(sandbox.OOMScoreServer < busy && busy < idle) || after != idle {
		t.Errorf("scores: server %d, working %d, idle %d, idle again %d; want server < working < idle",
			sandbox.OOMScoreServer, busy, idle, after)
	}
}
