package sandbox_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/emberbox/emberbox/internal/guest"
	"github.com/emberbox/emberbox/internal/sandbox"
)

// Repeated protocol violations stop the sandbox with a reason of its own,
// and its events say why; fewer leave it running.
func TestRepeatedViolationsStopTheSandbox(t *testing.T) {
	e := newEnv(t)
	m := e.manager()
	ctx := context.Background()
	sb, err := m.Create(ctx, "key_a", spec())
	if err != nil {
		t.Fatal(err)
	}
	waitState(t, m, "key_a", sb.ID, sandbox.StateRunning)
	v := guest.Violation{Method: "process.list", Problem: "processes has more than 1024 elements"}
	for range sandbox.MaxGuestViolations - 1 {
		if !sandbox.ReportGuestViolation(m, sb.ID, v) {
			t.Fatal("no live instance")
		}
	}
	time.Sleep(200 * time.Millisecond)
	if got, _ := m.Get(ctx, "key_a", sb.ID); got.State != sandbox.StateRunning {
		t.Fatalf("after %d violations the sandbox is %s, want running", sandbox.MaxGuestViolations-1, got.State)
	}
	sandbox.ReportGuestViolation(m, sb.ID, v)
	got := waitState(t, m, "key_a", sb.ID, sandbox.StateStopped)
	if got.StopReason != sandbox.ReasonGuestProtocolViolation {
		t.Errorf("stop reason %q, want %q", got.StopReason, sandbox.ReasonGuestProtocolViolation)
	}
	m.Close() // events are recorded by the manager's goroutines; Close waits for them
	evs, err := e.st.ListEvents(ctx, sb.ID, 100)
	if err != nil {
		t.Fatal(err)
	}
	var violations, stopping int
	for _, ev := range evs {
		if ev.Type == "guest_protocol_violation" {
			violations++
			if strings.Contains(ev.Message, "stopping") {
				stopping++
			}
			if !strings.Contains(ev.Message, v.Problem) && !strings.Contains(ev.Message, "stopping") {
				t.Errorf("violation event %q does not say what the guest did", ev.Message)
			}
		}
	}
	if violations != sandbox.MaxGuestViolations+1 || stopping != 1 {
		t.Errorf("%d violation events (%d stopping), want %d and 1", violations, stopping, sandbox.MaxGuestViolations+1)
	}
}
