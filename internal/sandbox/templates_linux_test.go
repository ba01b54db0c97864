package sandbox_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/emberbox/emberbox/internal/agentproto"
	"github.com/emberbox/emberbox/internal/sandbox"
)

// TestTemplateCreate: with templates on, the default shape's template is
// built once (one boot), and creates of that shape are copies of it
// (resumes, no boots) that run commands with their own env; a shape with
// no template boots.
func TestTemplateCreate(t *testing.T) {
	e := newEnv(t)
	// The env's boot timeout is short for its tests of failing boots; a
	// machine loaded by other tests needs more for the template's boot.
	// The manager's log goes to the test's, so a failed template build
	// says why (a build is not retried for templateRetry).
	m := e.managerWith(func(c *sandbox.Config) {
		c.Templates, c.BootTimeout = true, 30*time.Second
		c.Logger = slog.New(slog.NewTextHandler(testLog{t}, &slog.HandlerOptions{Level: slog.LevelWarn}))
	})
	ctx := context.Background()
	m.PrepareTemplate()
	deadline := time.Now().Add(60 * time.Second)
	for e.drv.Starts() < 1 || !m.TemplateReady(sandbox.DefaultVCPU, sandbox.DefaultMemoryMiB, sandbox.DefaultDiskMiB) {
		if time.Now().After(deadline) {
			t.Fatalf("template not built: %d starts", e.drv.Starts())
		}
		time.Sleep(10 * time.Millisecond)
	}
	starts, resumes := e.drv.Starts(), e.drv.Resumes()
	for i := range 2 {
		sb, err := m.Create(ctx, "k", spec())
		if err != nil {
			t.Fatal(err)
		}
		waitState(t, m, "k", sb.ID, sandbox.StateRunning)
		res, err := exec(ctx, m, "k", sb.ID, agentproto.ExecRequest{Command: `echo "$GREETING"`})
		if err != nil || string(res.Stdout) != "hello\n" {
			t.Fatalf("copy %d: %v %+v", i, err, res)
		}
	}
	if e.drv.Starts() != starts || e.drv.Resumes() != resumes+2 {
		t.Errorf("creates made %d boots and %d resumes, want 0 and 2", e.drv.Starts()-starts, e.drv.Resumes()-resumes)
	}
	small := spec()
	small.VCPU, small.MemoryMiB = 1, 1024
	sb, err := m.Create(ctx, "k", small)
	if err != nil {
		t.Fatal(err)
	}
	waitState(t, m, "k", sb.ID, sandbox.StateRunning)
	if e.drv.Starts() < starts+1 {
		t.Errorf("a shape without a template did not boot")
	}
}

// testLog writes a logger's lines to the test's log.
type testLog struct{ t *testing.T }

func (w testLog) Write(p []byte) (int, error) {
	w.t.Helper()
	w.t.Logf("%s", p)
	return len(p), nil
}
