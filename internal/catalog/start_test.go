package catalog_test

import (
	"context"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/emberbox/emberbox/internal/catalog"
	"github.com/emberbox/emberbox/internal/errdefs"
	"github.com/emberbox/emberbox/internal/guest"
	"github.com/emberbox/emberbox/internal/sandbox"
)

// fakeGuest answers what the start preparer calls; the rest is unused.
type fakeGuest struct {
	guest.Handle
	mu        sync.Mutex
	spawned   []guest.ExecRequest
	listenAt  time.Time // DialPort succeeds from then on
	exitEarly bool
}

// handle returns g as a guest handle.
func (g *fakeGuest) handle() guest.Handle {
	return guest.Handle{ProcessRunner: g, FileSystem: g, Watcher: g, PortDialer: g}
}

func (g *fakeGuest) Spawn(ctx context.Context, req guest.ExecRequest) (*guest.ProcessInfo, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.spawned = append(g.spawned, req)
	return &guest.ProcessInfo{ID: "p1", State: "running", Command: req.Command}, nil
}

func (g *fakeGuest) Processes(ctx context.Context) ([]guest.ProcessInfo, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	var out []guest.ProcessInfo
	for _, r := range g.spawned {
		out = append(out, guest.ProcessInfo{ID: "p1", State: "running", Command: r.Command})
	}
	return out, nil
}

func (g *fakeGuest) Process(ctx context.Context, id string) (*guest.ProcessInfo, error) {
	if g.exitEarly {
		code := 3
		return &guest.ProcessInfo{ID: id, State: "exited", ExitCode: &code}, nil
	}
	return &guest.ProcessInfo{ID: id, State: "running"}, nil
}

func (g *fakeGuest) DialPort(ctx context.Context, port int) (net.Conn, error) {
	if time.Now().Before(g.listenAt) || port != 8000 {
		return nil, errdefs.New(errdefs.ErrUnavailable, "port_refused", "refused")
	}
	a, b := net.Pipe()
	b.Close()
	return a, nil
}

func TestStartCommand(t *testing.T) {
	e := newEnv(t, "")
	ctx := context.Background()
	req := recipe("x")
	req.Start = &catalog.StartSpec{Command: "python3 -m http.server 8000", ReadyPort: 8000, ReadyTimeoutSeconds: 5}
	img, err := e.svc.Create(ctx, "key_a", req)
	if err != nil {
		t.Fatal(err)
	}
	img = e.wait("key_a", img.ID)
	p := e.svc.Preparer()

	g := &fakeGuest{listenAt: time.Now().Add(500 * time.Millisecond)}
	sb := &sandbox.Sandbox{ID: "sbx_1", ImageID: img.ID}
	if err := p.Prepare(ctx, sb, g.handle()); err != nil {
		t.Fatal(err)
	}
	rep, ok := e.svc.StartReport("sbx_1")
	if !ok || !rep.Ready || rep.ReadyMs < 400 || rep.Command != req.Start.Command {
		t.Errorf("report %+v", rep)
	}
	if len(g.spawned) != 1 || g.spawned[0].Cwd != "/srv" || g.spawned[0].Env["FROM_BUILD"] != "1" || !g.spawned[0].Detach {
		t.Errorf("spawned %+v", g.spawned)
	}
	// Again (a restart): the running command is not started twice.
	if err := p.Prepare(ctx, sb, g.handle()); err != nil || len(g.spawned) != 1 {
		t.Errorf("second prepare: %v, %d spawns", err, len(g.spawned))
	}

	// Never ready: the sandbox runs, the report says why.
	never := &fakeGuest{listenAt: time.Now().Add(time.Hour)}
	if err := p.Prepare(ctx, &sandbox.Sandbox{ID: "sbx_2", ImageID: img.ID}, never.handle()); err != nil {
		t.Fatal(err)
	}
	if rep, _ := e.svc.StartReport("sbx_2"); rep.Ready || rep.Error == "" {
		t.Errorf("never ready: %+v", rep)
	}
	// Exits before it is ready: said at once.
	exits := &fakeGuest{listenAt: time.Now().Add(time.Hour), exitEarly: true}
	begin := time.Now()
	_ = p.Prepare(ctx, &sandbox.Sandbox{ID: "sbx_3", ImageID: img.ID}, exits.handle())
	if rep, _ := e.svc.StartReport("sbx_3"); rep.Ready || rep.Error != "the command exited with code 3 before it was ready" || time.Since(begin) > 3*time.Second {
		t.Errorf("exited: %+v after %s", rep, time.Since(begin))
	}
	// A build sandbox (an internal owner) builds on the image: no start.
	build := &fakeGuest{}
	if err := p.Prepare(ctx, &sandbox.Sandbox{ID: "sbx_5", OwnerKeyID: "system:build", ImageID: img.ID}, build.handle()); err != nil || len(build.spawned) != 0 {
		t.Errorf("a build sandbox ran the start command: %v %d", err, len(build.spawned))
	}
	// A sandbox of the default image has no start command.
	if err := p.Prepare(ctx, &sandbox.Sandbox{ID: "sbx_4"}, g.handle()); err != nil {
		t.Fatal(err)
	}
	if _, ok := e.svc.StartReport("sbx_4"); ok {
		t.Error("a report for a sandbox without an image")
	}
	want := []string{"sbx_1:start_ready", "sbx_1:start_ready", "sbx_2:start_not_ready", "sbx_3:start_not_ready"}
	if strings.Join(e.ev.got, " ") != strings.Join(want, " ") {
		t.Errorf("events %v, want %v", e.ev.got, want)
	}
}
