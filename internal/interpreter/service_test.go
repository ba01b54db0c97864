package interpreter

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/emberbox/emberbox/internal/errdefs"
	"github.com/emberbox/emberbox/internal/sandbox"
)

func newTestService(t *testing.T) (*Service, *sandbox.Sandbox, *fakeGuest) {
	t.Helper()
	return New(nil), &sandbox.Sandbox{ID: "sbx_1"}, &fakeGuest{t: t}
}

func run(t *testing.T, s *Service, sb *sandbox.Sandbox, g Guest, req RunRequest) (*Execution, []Event) {
	t.Helper()
	var events []Event
	ex, err := s.Run(context.Background(), sb, g, req, func(ev Event) error {
		events = append(events, ev)
		return nil
	})
	if err != nil {
		t.Fatalf("Run(%q): %v", req.Code, err)
	}
	return ex, events
}

func TestRunKeepsStateInTheDefaultContext(t *testing.T) {
	s, sb, g := newTestService(t)
	ex, _ := run(t, s, sb, g, RunRequest{Code: "set x 42"})
	if ex.Status != StatusOK || ex.Context != DefaultContext || ex.ExecutionCount != 1 {
		t.Fatalf("first run: %+v", ex)
	}
	ex, events := run(t, s, sb, g, RunRequest{Code: "get x"})
	if ex.Status != StatusOK || len(ex.Results) != 1 || !ex.Results[0].Main || string(ex.Results[0].Data["text/plain"]) != `"'42'"` {
		t.Fatalf("second run: %+v", ex)
	}
	if ex.ExecutionCount != 2 {
		t.Errorf("execution count %d, want 2", ex.ExecutionCount)
	}
	if len(events) != 2 || events[0].Kind != KindCount || events[1].Kind != KindResult {
		t.Errorf("events %+v, want count then result", events)
	}
	if len(g.spawned) != 1 {
		t.Fatalf("%d bridges started, want one for both runs", len(g.spawned))
	}
	sp := g.spawned[0]
	if len(sp.Argv) != 4 || sp.Argv[0] != "python3" || sp.Argv[3] != bridgeSource || !sp.Detach || sp.User != "" {
		t.Errorf("bridge spawned as %q detach=%v user=%q", sp.Argv[:3], sp.Detach, sp.User)
	}
	infos := s.List(context.Background(), sb, g)
	if len(infos) != 1 || infos[0].ID != DefaultContext || infos[0].Cwd != "/workspace" || infos[0].Language != "python" {
		t.Errorf("List = %+v", infos)
	}
}

func TestRunOutputAndErrors(t *testing.T) {
	s, sb, g := newTestService(t)
	ex, _ := run(t, s, sb, g, RunRequest{Code: "print hello"})
	if ex.Stdout != "hello\n" || ex.Stderr != "warn\n" || ex.Status != StatusOK {
		t.Errorf("print: %+v", ex)
	}
	ex, events := run(t, s, sb, g, RunRequest{Code: "raise"})
	if ex.Status != StatusError || ex.Error == nil || ex.Error.Name != "ValueError" || ex.Error.Value != "bad" ||
		!strings.Contains(ex.Error.Traceback, "ValueError: bad") {
		t.Errorf("raise: %+v %+v", ex, ex.Error)
	}
	if last := events[len(events)-1]; last.Kind != KindError {
		t.Errorf("last event %+v, want the error", last)
	}
	ex, _ = run(t, s, sb, g, RunRequest{Code: "plot"})
	if len(ex.Results) != 2 || ex.Results[0].Main || !ex.Results[1].Main || string(ex.Results[0].Data["image/png"]) != `"iVBORw0KGgo="` {
		t.Errorf("plot: %+v", ex.Results)
	}
}

func TestRunRefusesOtherLanguagesAndUnknownContexts(t *testing.T) {
	s, sb, g := newTestService(t)
	_, err := s.Run(context.Background(), sb, g, RunRequest{Code: "1", Language: "r"}, nil)
	if !errors.Is(err, errdefs.ErrInvalidArgument) || errdefs.Code(err) != "language_unsupported" {
		t.Errorf("language r: %v", err)
	}
	_, err = s.Run(context.Background(), sb, g, RunRequest{Code: "1", Context: "nope"}, nil)
	if !IsNotFound(err) {
		t.Errorf("unknown context: %v", err)
	}
	if _, err := s.Create(context.Background(), sb, g, CreateRequest{Language: "javascript"}); errdefs.Code(err) != "language_unsupported" {
		t.Errorf("create javascript: %v", err)
	}
	if _, err := s.Create(context.Background(), sb, g, CreateRequest{ID: "Bad_ID"}); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("create Bad_ID: %v", err)
	}
	if _, err := s.Create(context.Background(), sb, g, CreateRequest{Cwd: "relative"}); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("create relative cwd: %v", err)
	}
	if len(g.spawned) != 0 {
		t.Errorf("refused requests started %d bridges", len(g.spawned))
	}
}

func TestContextsAreIsolated(t *testing.T) {
	s, sb, g := newTestService(t)
	ci, err := s.Create(context.Background(), sb, g, CreateRequest{ID: "work", Env: map[string]string{"A": "1"}})
	if err != nil {
		t.Fatal(err)
	}
	if ci.ID != "work" || len(ci.EnvNames) != 1 || ci.EnvNames[0] != "A" {
		t.Errorf("created %+v", ci)
	}
	if g.spawned[0].Env["A"] != "1" {
		t.Errorf("bridge env %v, want the context's", g.spawned[0].Env)
	}
	if _, err := s.Create(context.Background(), sb, g, CreateRequest{ID: "work"}); errdefs.Code(err) != "context_exists" {
		t.Errorf("second create: %v", err)
	}
	run(t, s, sb, g, RunRequest{Code: "set x 1", Context: "work"})
	ex, _ := run(t, s, sb, g, RunRequest{Code: "get x"})
	if ex.Error == nil || ex.Error.Name != "NameError" {
		t.Errorf("default context sees another's variable: %+v", ex)
	}
	if got := s.List(context.Background(), sb, g); len(got) != 2 || got[0].ID != "work" {
		t.Errorf("List = %+v", got)
	}
	sb2, g2 := &sandbox.Sandbox{ID: "sbx_2"}, &fakeGuest{t: t}
	other, _ := s.Create(context.Background(), sb2, g2, CreateRequest{})
	if !strings.HasPrefix(other.ID, "ctx-") || len(s.List(context.Background(), sb2, g2)) != 1 ||
		len(s.List(context.Background(), sb, g)) != 2 {
		t.Errorf("contexts leak across sandboxes: %+v", other)
	}
	if !s.Delete(context.Background(), sb, g, "work") || s.Delete(context.Background(), sb, g, "work") {
		t.Error("Delete: want true then false")
	}
	if !waitFor(func() bool { return g.alive() == 1 }) {
		t.Errorf("%d bridges run after a delete, want 1", g.alive())
	}
	if _, err := s.Run(context.Background(), sb, g, RunRequest{Code: "get x", Context: "work"}, nil); !IsNotFound(err) {
		t.Errorf("run in a deleted context: %v", err)
	}
}

func TestRestartEmptiesState(t *testing.T) {
	s, sb, g := newTestService(t)
	run(t, s, sb, g, RunRequest{Code: "set x 1"})
	if _, err := s.Restart(context.Background(), sb, g, DefaultContext); err != nil {
		t.Fatal(err)
	}
	ex, _ := run(t, s, sb, g, RunRequest{Code: "get x"})
	if ex.Error == nil || ex.ExecutionCount != 1 {
		t.Errorf("after restart: %+v", ex)
	}
	if _, err := s.Restart(context.Background(), sb, g, "nope"); !IsNotFound(err) {
		t.Errorf("restart unknown: %v", err)
	}
}

func TestTimeoutInterrupts(t *testing.T) {
	s, sb, g := newTestService(t)
	ex, _ := run(t, s, sb, g, RunRequest{Code: "sleep", Timeout: 50 * time.Millisecond})
	if ex.Status != StatusTimeout || ex.Error == nil || ex.Error.Name != "KeyboardInterrupt" {
		t.Fatalf("timed out run: %+v", ex)
	}
	ex, _ = run(t, s, sb, g, RunRequest{Code: "print after"})
	if ex.Status != StatusOK || ex.Stdout != "after\n" {
		t.Errorf("the context should go on after an interrupt: %+v", ex)
	}
}

func TestInterruptCall(t *testing.T) {
	s, sb, g := newTestService(t)
	if ok, err := s.Interrupt(sb.ID, DefaultContext); ok || err != nil {
		t.Errorf("interrupt with nothing running: %v %v", ok, err)
	}
	done := make(chan *Execution)
	go func() {
		ex, _ := s.Run(context.Background(), sb, g, RunRequest{Code: "sleep"}, nil)
		done <- ex
	}()
	waitRunning(t, s, sb.ID, DefaultContext)
	if ok, err := s.Interrupt(sb.ID, DefaultContext); !ok || err != nil {
		t.Fatalf("interrupt: %v %v", ok, err)
	}
	if ex := <-done; ex.Status != StatusInterrupted {
		t.Errorf("interrupted run: %+v", ex)
	}
}

// An interrupt the kernel takes before the cell starts aborts it with no
// traceback; the execution still says what ended it.
func TestInterruptBeforeTheCellRuns(t *testing.T) {
	s, sb, g := newTestService(t)
	done := make(chan *Execution)
	go func() {
		ex, _ := s.Run(context.Background(), sb, g, RunRequest{Code: "abort"}, nil)
		done <- ex
	}()
	waitRunning(t, s, sb.ID, DefaultContext)
	if ok, err := s.Interrupt(sb.ID, DefaultContext); !ok || err != nil {
		t.Fatalf("interrupt: %v %v", ok, err)
	}
	ex := <-done
	if ex.Status != StatusInterrupted || ex.Error == nil || ex.Error.Name != "KeyboardInterrupt" {
		t.Errorf("aborted run: status %q error %+v", ex.Status, ex.Error)
	}
}

func TestDisconnectInterruptsUnlessKept(t *testing.T) {
	s, sb, g := newTestService(t)
	run(t, s, sb, g, RunRequest{Code: "set warm 1"}) // start the context
	ctx, cancel := context.WithCancel(context.Background())
	got := make(chan *Execution)
	go func() {
		ex, _ := s.Run(ctx, sb, g, RunRequest{Code: "sleep"}, nil)
		got <- ex
	}()
	waitRunning(t, s, sb.ID, DefaultContext)
	cancel()
	if ex := <-got; ex.Status != StatusInterrupted {
		t.Errorf("after the client left: %+v", ex)
	}
	failing := func(Event) error { return errors.New("client gone") }
	ex, err := s.Run(context.Background(), sb, g, RunRequest{Code: "print x", KeepOnDisconnect: true}, failing)
	if err != nil || ex.Status != StatusOK || ex.Stdout != "x\n" {
		t.Errorf("kept run: %+v %v", ex, err)
	}
}

func TestHostileBridgeIsBounded(t *testing.T) {
	s, sb, g := newTestService(t)
	ex, _ := run(t, s, sb, g, RunRequest{Code: "flood"})
	if !ex.Truncated || len(ex.Stdout) > MaxOutput {
		t.Errorf("flood kept %d bytes, truncated=%v", len(ex.Stdout), ex.Truncated)
	}
	ex, _ = run(t, s, sb, g, RunRequest{Code: "huge"})
	if ex.Status != StatusLost {
		t.Errorf("a line over the bound: %+v, want lost", ex.Status)
	}
	// The connection that carried it is cut; the next run connects again.
	ex, _ = run(t, s, sb, g, RunRequest{Code: "print again"})
	if ex.Status != StatusOK || ex.Stdout != "again\n" || len(g.spawned) != 1 {
		t.Errorf("after the cut: %+v, %d bridges", ex, len(g.spawned))
	}
}

func TestStubbornCellEndsItsContext(t *testing.T) {
	old := interruptGrace
	interruptGrace = 100 * time.Millisecond
	t.Cleanup(func() { interruptGrace = old })
	s, sb, g := newTestService(t)
	ex, _ := run(t, s, sb, g, RunRequest{Code: "stubborn", Timeout: 20 * time.Millisecond})
	if ex.Status != StatusLost {
		t.Errorf("stubborn: %+v", ex)
	}
}

func TestStoppedSandboxForgetsContexts(t *testing.T) {
	s, sb, g := newTestService(t)
	if _, err := s.Create(context.Background(), sb, g, CreateRequest{ID: "work"}); err != nil {
		t.Fatal(err)
	}
	run(t, s, sb, g, RunRequest{Code: "set x 1"})
	g.stop()
	// The host learns of the cut connections as it reads them.
	if !waitFor(func() bool { return len(s.List(context.Background(), sb, g)) == 0 }) {
		t.Fatalf("contexts still listed: %+v", s.List(context.Background(), sb, g))
	}
	if _, err := s.Run(context.Background(), sb, g, RunRequest{Code: "1", Context: "work"}, nil); !IsNotFound(err) {
		t.Errorf("run in a forgotten context: %v", err)
	}
	ex, _ := run(t, s, sb, g, RunRequest{Code: "get x"})
	if ex.Error == nil || len(g.spawned) != 3 {
		t.Errorf("the default context should start afresh: %+v, %d bridges", ex, len(g.spawned))
	}
}

func TestPausedSandboxKeepsContexts(t *testing.T) {
	s, sb, g := newTestService(t)
	if _, err := s.Create(context.Background(), sb, g, CreateRequest{ID: "work"}); err != nil {
		t.Fatal(err)
	}
	run(t, s, sb, g, RunRequest{Code: "set x 1", Context: "work"})
	run(t, s, sb, g, RunRequest{Code: "set y 2"})
	g.detach() // a pause and a wake: connections end, processes stay
	if !waitFor(func() bool { return s.lookup(sb.ID, "work").current() == nil }) {
		t.Fatal("the cut connection was not noticed")
	}
	if got := s.List(context.Background(), sb, g); len(got) != 2 || s.lookup(sb.ID, "work").current() == nil {
		t.Fatalf("after a wake, listed and connected again: %+v", got)
	}
	g.detach()
	ex, _ := run(t, s, sb, g, RunRequest{Code: "get x", Context: "work"})
	if ex.Status != StatusOK || string(ex.Results[0].Data["text/plain"]) != `"'1'"` {
		t.Errorf("state after a wake: %+v", ex)
	}
	ex, _ = run(t, s, sb, g, RunRequest{Code: "get y"})
	if ex.Status != StatusOK || len(g.spawned) != 2 {
		t.Errorf("default context after a wake: %+v, %d bridges", ex, len(g.spawned))
	}
}

func TestNewServiceEndsStrayBridges(t *testing.T) {
	s, sb, g := newTestService(t)
	run(t, s, sb, g, RunRequest{Code: "set x 1"})
	g.detach()
	// A restarted server knows nothing of the bridge it had started.
	s2 := New(nil)
	ex, _ := run(t, s2, sb, g, RunRequest{Code: "get x"})
	if ex.Error == nil || len(g.spawned) != 2 || g.alive() != 1 {
		t.Errorf("a new server's context: %+v, %d bridges, %d alive", ex, len(g.spawned), g.alive())
	}
}

// waitRunning polls until a cell runs in the context.
func waitRunning(t *testing.T, s *Service, sandboxID, id string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if ci, err := s.Get(sandboxID, id); err == nil && ci.Running {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("the run never showed as running")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// waitFor polls cond for up to 10 s.
func waitFor(cond func() bool) bool {
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(5 * time.Millisecond)
	}
	return true
}

func TestConcurrentFirstUsesShareOneStart(t *testing.T) {
	s, sb, g := newTestService(t)
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(2)
		go func() {
			defer wg.Done()
			if _, err := s.Run(context.Background(), sb, g, RunRequest{Code: "print x"}, nil); err != nil {
				t.Error(err)
			}
		}()
		go func() {
			defer wg.Done()
			s.List(context.Background(), sb, g)
		}()
	}
	wg.Wait()
	if len(g.spawned) != 1 {
		t.Errorf("%d bridges started for one default context", len(g.spawned))
	}
}

func TestOutputHeldByAllRunsIsBounded(t *testing.T) {
	old := maxHeld
	maxHeld = 4 << 20
	t.Cleanup(func() { maxHeld = old })
	s, sb, g := newTestService(t)
	ex, _ := run(t, s, sb, g, RunRequest{Code: "flood"})
	if !ex.Truncated || len(ex.Stdout) > 4<<20 {
		t.Errorf("kept %d bytes past the budget of every run", len(ex.Stdout))
	}
	if n := s.held.Load(); n != 0 {
		t.Errorf("%d bytes still counted after the run", n)
	}
}

// TestCopyAdoptsContexts: a sandbox made from a memory snapshot of
// another (a fork's copy, a checkpoint's branch) goes on in its source's
// contexts, whose bridges its memory holds, instead of ending them as
// strays and starting afresh.
func TestCopyAdoptsContexts(t *testing.T) {
	s, sb, g := newTestService(t)
	run(t, s, sb, g, RunRequest{Code: "set x 1"})
	g.detach() // the copy's guest is reached on connections of its own
	cp := &sandbox.Sandbox{ID: "sbx_copy"}
	s.Adopt(sb.ID, cp.ID)
	ex, _ := run(t, s, cp, g, RunRequest{Code: "get x"})
	if ex.Status != StatusOK || len(ex.Results) != 1 || string(ex.Results[0].Data["text/plain"]) != `"'1'"` {
		t.Errorf("the copy's default context: %+v, want the source's state", ex)
	}
	if len(g.spawned) != 1 || g.alive() != 1 {
		t.Errorf("%d bridges started, %d alive; want the one the source started, kept", len(g.spawned), g.alive())
	}
	// Adopting from a sandbox with no contexts gives nothing.
	s.Adopt("sbx_none", "sbx_copy2")
	if got := s.List(context.Background(), &sandbox.Sandbox{ID: "sbx_copy2"}, g); len(got) != 0 {
		t.Errorf("contexts adopted from nothing: %+v", got)
	}
}
