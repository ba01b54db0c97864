package computer

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/emberbox/emberbox/internal/errdefs"
	"github.com/emberbox/emberbox/internal/guest"
	"github.com/emberbox/emberbox/internal/mcpgateway"
)

// fakeGuest is a guest whose processes are records and whose port 9222
// is an HTTP server of the test's, answering once a browser is spawned.
type fakeGuest struct {
	mu      sync.Mutex
	procs   []guest.ProcessInfo
	spawned []guest.ExecRequest
	output  map[string]string
	files   map[string]string
	find    string // what findScript prints; "" exits 1
	answer  string // /json/version's body
	devtool *httptest.Server
	// gateway, when set, is the status an MCP gateway spawned with
	// config stdin and pid writes ("" writes none); exit ends it at once.
	gateway     func(stdin []byte, pid int) string
	gatewayExit bool
}

func newFakeGuest(t *testing.T) *fakeGuest {
	g := &fakeGuest{output: map[string]string{}, files: map[string]string{},
		answer: `{"Browser":"Chrome/156.0.1","webSocketDebuggerUrl":"ws://localhost:9222/devtools/browser/0a1b-2c"}`}
	g.devtool = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		g.mu.Lock()
		defer g.mu.Unlock()
		if r.URL.Path != "/json/version" || r.Host != "localhost:9222" {
			http.NotFound(w, r)
			return
		}
		_, _ = w.Write([]byte(g.answer))
	}))
	t.Cleanup(g.devtool.Close)
	return g
}

func (g *fakeGuest) Exec(_ context.Context, req guest.ExecRequest, _ func(guest.Event) error) (*guest.ExecResult, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if len(req.Argv) == 2 && req.Argv[0] == "cat" {
		b, ok := g.files[req.Argv[1]]
		code := 0
		if !ok || req.User != "root" {
			code = 1
		}
		return &guest.ExecResult{ExitCode: &code, Stdout: []byte(b)}, nil
	}
	code := 1
	if g.find != "" {
		code = 0
	}
	return &guest.ExecResult{ExitCode: &code, Stdout: []byte(g.find + "\n")}, nil
}

func (g *fakeGuest) Spawn(_ context.Context, req guest.ExecRequest) (*guest.ProcessInfo, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.spawned = append(g.spawned, req)
	p := guest.ProcessInfo{ID: fmt.Sprintf("proc_%d", len(g.procs)+1), Argv: req.Argv, User: req.User,
		StartedAt: time.Unix(1000+int64(len(g.procs)), 0)}
	g.procs = append(g.procs, p)
	if rid := recordingIDOf(p); rid != "" {
		g.files[RecordingsDir+"/"+rid+".mp4"] = "ftyp" // ffmpeg's first bytes
	}
	if isGateway(p) {
		p.PID = 100 + len(g.procs)
		g.procs[len(g.procs)-1].PID = p.PID
		if g.gateway != nil {
			if st := g.gateway(req.Stdin, p.PID); st != "" {
				g.files[mcpgateway.StatusPath] = st
			}
		}
		if g.gatewayExit {
			code, at := 1, time.Now()
			g.procs[len(g.procs)-1].ExitCode, g.procs[len(g.procs)-1].EndedAt = &code, &at
			g.output[p.ID] = "listening on port 8930: address already in use"
		}
	}
	return &p, nil
}

func (g *fakeGuest) Processes(context.Context) ([]guest.ProcessInfo, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]guest.ProcessInfo(nil), g.procs...), nil
}

func (g *fakeGuest) Process(_ context.Context, id string) (*guest.ProcessInfo, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for i := range g.procs {
		if g.procs[i].ID == id {
			p := g.procs[i]
			p.OutputBytes = int64(len(g.output[id]))
			return &p, nil
		}
	}
	return nil, errdefs.New(errdefs.ErrNotFound, "process_not_found", "no process %s", id)
}

func (g *fakeGuest) ProcessOutput(_ context.Context, req guest.ProcessRequest, on func(guest.Event) error) error {
	g.mu.Lock()
	out := g.output[req.ID]
	g.mu.Unlock()
	if int(req.Cursor) < len(out) {
		return on(guest.Event{Type: guest.EventStderr, Data: []byte(out[req.Cursor:]), Offset: req.Cursor})
	}
	return nil
}

func (g *fakeGuest) Signal(_ context.Context, id, _ string) (*guest.ProcessInfo, error) {
	g.end(id, -9, time.Now())
	return g.Process(context.Background(), id)
}

func (g *fakeGuest) end(id string, code int, at time.Time) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for i := range g.procs {
		if g.procs[i].ID == id {
			g.procs[i].ExitCode, g.procs[i].EndedAt = &code, &at
		}
	}
}

func (g *fakeGuest) ReadFile(_ context.Context, path string) (*guest.FileEntry, io.ReadCloser, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	b, ok := g.files[path]
	if !ok {
		return nil, nil, errdefs.New(errdefs.ErrNotFound, "file_not_found", "no %s", path)
	}
	return &guest.FileEntry{Path: path, Size: int64(len(b))}, io.NopCloser(strings.NewReader(b)), nil
}

func (g *fakeGuest) Remove(_ context.Context, path string, _ bool) (bool, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	_, ok := g.files[path]
	delete(g.files, path)
	return ok, nil
}

func (g *fakeGuest) List(_ context.Context, req guest.FileRequest) ([]guest.FileEntry, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	var out []guest.FileEntry
	for p, b := range g.files {
		if dir, name, _ := strings.Cut(strings.TrimPrefix(p, req.Path+"/"), "/"); name == "" && strings.HasPrefix(p, req.Path+"/") {
			out = append(out, guest.FileEntry{Name: dir, Path: p, Type: "file", Size: int64(len(b))})
		}
	}
	if out == nil {
		return nil, errdefs.New(errdefs.ErrNotFound, "file_not_found", "no %s", req.Path)
	}
	return out, nil
}

func (g *fakeGuest) DialPort(ctx context.Context, port int) (net.Conn, error) {
	g.mu.Lock()
	up := port == CDPPort && findBrowser(g.procs) != nil
	for _, p := range g.procs {
		up = up || port == vncPort && running(p) && slices.Contains(p.Argv, "x11vnc")
	}
	g.mu.Unlock()
	if !up {
		return nil, errdefs.New(errdefs.ErrUnavailable, "port_refused", "nothing listens")
	}
	var d net.Dialer
	return d.DialContext(ctx, "tcp", g.devtool.Listener.Addr().String())
}

func TestStartBrowserFromTheLayer(t *testing.T) {
	g := newFakeGuest(t)
	g.find = "layer"
	s := New(nil)
	ctx := context.Background()
	if b, err := s.GetBrowser(ctx, g); err != nil || b.Running {
		t.Fatalf("before a start: %+v, %v", b, err)
	}
	b, err := s.StartBrowser(ctx, "sbx_a", g, BrowserOptions{Headless: true, Width: 800, Height: 600})
	if err != nil {
		t.Fatal(err)
	}
	want := Browser{Running: true, Headless: true, Width: 800, Height: 600, ProcessID: "proc_1",
		StartedAt: time.Unix(1000, 0), Version: "Chrome/156.0.1", DebuggerPath: "/devtools/browser/0a1b-2c"}
	if *b != want {
		t.Fatalf("started %+v, want %+v", *b, want)
	}
	sp := g.spawned[0]
	if sp.User != "root" || strings.Join(sp.Argv[:4], " ") != agentPath+" layer-exec user chromium" || !sp.Detach {
		t.Fatalf("spawned %q as %q: the layer's chromium goes through layer-exec as root, which drops to the user", sp.Argv, sp.User)
	}
	// A second start, whatever it asks, answers the running one.
	again, err := s.StartBrowser(ctx, "sbx_a", g, BrowserOptions{Headless: true})
	if err != nil || *again != want || len(g.spawned) != 1 {
		t.Fatalf("second start: %+v, %v; %d spawns", again, err, len(g.spawned))
	}
	got, err := s.GetBrowser(ctx, g)
	if err != nil || *got != want {
		t.Fatalf("get: %+v, %v", got, err)
	}
	stopped, err := s.StopBrowser(ctx, "sbx_a", g)
	if err != nil || !stopped {
		t.Fatalf("stop: %v, %v", stopped, err)
	}
	if got, _ := s.GetBrowser(ctx, g); got.Running {
		t.Fatal("a stopped browser still runs")
	}
	if stopped, _ := s.StopBrowser(ctx, "sbx_a", g); stopped {
		t.Fatal("a second stop stopped something")
	}
}

func TestStartBrowserOnPath(t *testing.T) {
	g := newFakeGuest(t)
	g.find = "/usr/bin/chromium"
	if _, err := New(nil).StartBrowser(context.Background(), "sbx_a", g, BrowserOptions{Headless: true}); err != nil {
		t.Fatal(err)
	}
	sp := g.spawned[0]
	if sp.User != "" || sp.Argv[0] != "/usr/bin/chromium" || !isBrowser(g.procs[0]) {
		t.Fatalf("spawned %q as %q", sp.Argv, sp.User)
	}
	for _, bad := range []string{"chromium", "/usr/bin/../bin/chromium", "/a\x00b"} {
		g := newFakeGuest(t)
		g.find = bad
		_, err := New(nil).StartBrowser(context.Background(), "sbx_a", g, BrowserOptions{Headless: true})
		if errdefs.Code(err) != "browser_failed" || len(g.spawned) != 0 {
			t.Errorf("the guest named its browser %q: %v, %d spawns", bad, err, len(g.spawned))
		}
	}
}

func TestStartBrowserInstallsWhereThereIsNone(t *testing.T) {
	g := newFakeGuest(t)
	s := New(nil)
	now := time.Unix(5000, 0)
	s.now = func() time.Time { return now }
	ctx := context.Background()
	start := func() error {
		_, err := s.StartBrowser(ctx, "sbx_a", g, BrowserOptions{Headless: true})
		return err
	}
	err := start()
	var ce *errdefs.CodedError
	if !errors.As(err, &ce) || ce.Code != "browser_installing" || ce.RetryAfter <= 0 || !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("first start: %v", err)
	}
	if len(g.spawned) != 1 || g.spawned[0].User != "root" || !isInstall(g.procs[0]) {
		t.Fatalf("spawned %+v", g.spawned)
	}
	// While it runs, starts wait for it.
	if err := start(); errdefs.Code(err) != "browser_installing" || len(g.spawned) != 1 {
		t.Fatalf("start during the install: %v, %d spawns", err, len(g.spawned))
	}
	// A failed install is reported for a minute, with its tail.
	g.output["proc_1"] = "E: Unable to locate package chromium"
	g.end("proc_1", 100, now.Add(-10*time.Second))
	err = start()
	if errdefs.Code(err) != "browser_install_failed" || !strings.Contains(err.Error(), "Unable to locate package chromium") ||
		!strings.Contains(err.Error(), "exit 100") {
		t.Fatalf("after a failed install: %v", err)
	}
	// Then a start tries again.
	now = now.Add(time.Minute)
	if err := start(); errdefs.Code(err) != "browser_installing" || len(g.spawned) != 2 {
		t.Fatalf("a minute later: %v, %d spawns", err, len(g.spawned))
	}
	// Once it is there, a start starts it.
	g.end("proc_2", 0, now)
	g.find = "/usr/bin/chromium"
	if err := start(); err != nil {
		t.Fatal(err)
	}
}

func TestStartBrowserThatDies(t *testing.T) {
	g := newFakeGuest(t)
	g.find = "layer"
	g.answer = "not json"
	_, err := New(nil).StartBrowser(context.Background(), "sbx_a", g, BrowserOptions{Headless: true})
	if !errors.Is(err, errBadAnswer) {
		t.Fatalf("a DevTools endpoint answering wrongly: %v", err)
	}
	if g.procs[0].EndedAt == nil {
		t.Fatal("a browser that failed its start was left running")
	}
}

func TestParseVersionRefusesWhatNoBrowserSends(t *testing.T) {
	for _, body := range []string{
		`{"webSocketDebuggerUrl":"ws://localhost:9222/devtools/page/x"}`,
		`{"webSocketDebuggerUrl":"http://localhost:9222/devtools/browser/x"}`,
		`{"webSocketDebuggerUrl":"ws://localhost:9222/devtools/browser/x?y=1"}`,
		`{"webSocketDebuggerUrl":"ws://localhost:9222/devtools/browser/../../v1/keys"}`,
		`{"webSocketDebuggerUrl":"ws://localhost:9222/devtools/browser/` + strings.Repeat("a", 65) + `"}`,
		`{}`, `[]`,
	} {
		if _, err := parseVersion([]byte(body)); !errors.Is(err, errBadAnswer) {
			t.Errorf("%s: %v", body, err)
		}
	}
	v, err := parseVersion([]byte(`{"Browser":"Chrome/1\u0000\n` + strings.Repeat("x", 200) + `","webSocketDebuggerUrl":"ws://127.0.0.1:9222/devtools/browser/ab-12"}`))
	if err != nil || v.path != "/devtools/browser/ab-12" || strings.ContainsAny(v.Browser, "\x00\n") || len(v.Browser) > 100 {
		t.Fatalf("%+v, %v", v, err)
	}
}

func TestBrowserOptionsCheck(t *testing.T) {
	o, err := BrowserOptions{Headless: true}.Check()
	if err != nil || o.Width != DefaultWidth || o.Height != DefaultHeight {
		t.Fatalf("%+v, %v", o, err)
	}
	for _, bad := range []BrowserOptions{{Headless: true, Width: 10}, {Headless: true, Height: MaxHeight + 1}, {Headless: true, Width: -1}} {
		if _, err := bad.Check(); errdefs.Code(err) != "invalid_request" {
			t.Errorf("%+v: %v", bad, err)
		}
	}
}
