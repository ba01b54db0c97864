package computer

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/emberbox/emberbox/internal/errdefs"
	"github.com/emberbox/emberbox/internal/guest"
)

// CDPPort is where the browser's DevTools endpoint listens in the guest,
// on 127.0.0.1 only.
const CDPPort = 9222

// Bounds and defaults of a browser's window.
const (
	DefaultWidth, DefaultHeight = 1280, 720
	MinSide                     = 200
	MaxWidth, MaxHeight         = 3840, 2160
)

const (
	// profileDir holds the browser's profile; Chromium refuses remote
	// debugging of its default profile.
	profileDir = "/tmp/emberbox-browser"
	// startWait bounds a start, from the spawn to a DevTools answer:
	// Chromium's first start under software emulation takes seconds.
	startWait = 3 * time.Minute
	// installRetryAfter is what a start answers while an install runs;
	// failedInstallHeld is how long a failed install is reported before
	// a start tries again.
	installRetryAfter = 10 * time.Second
	failedInstallHeld = time.Minute
)

// Guest is what computer use needs of a sandbox's agent (guest.Handle).
type Guest interface {
	Exec(ctx context.Context, req guest.ExecRequest, onEvent func(guest.Event) error) (*guest.ExecResult, error)
	Spawn(ctx context.Context, req guest.ExecRequest) (*guest.ProcessInfo, error)
	Processes(ctx context.Context) ([]guest.ProcessInfo, error)
	Process(ctx context.Context, id string) (*guest.ProcessInfo, error)
	ProcessOutput(ctx context.Context, req guest.ProcessRequest, onEvent func(guest.Event) error) error
	Signal(ctx context.Context, id, signal string) (*guest.ProcessInfo, error)
	DialPort(ctx context.Context, port int) (net.Conn, error)
	ReadFile(ctx context.Context, path string) (*guest.FileEntry, io.ReadCloser, error)
	Remove(ctx context.Context, path string, recursive bool) (bool, error)
	List(ctx context.Context, req guest.FileRequest) ([]guest.FileEntry, error)
}

// BrowserOptions is what a start asks for; zero sizes take the defaults.
type BrowserOptions struct {
	Headless      bool
	Width, Height int
}

// Check validates o and fills in its defaults.
func (o BrowserOptions) Check() (BrowserOptions, error) {
	if o.Width == 0 {
		o.Width = DefaultWidth
	}
	if o.Height == 0 {
		o.Height = DefaultHeight
	}
	if o.Width < MinSide || o.Width > MaxWidth || o.Height < MinSide || o.Height > MaxHeight {
		return o, errdefs.New(errdefs.ErrInvalidArgument, "invalid_request",
			"the window must be %d to %d pixels wide and %d to %d high", MinSide, MaxWidth, MinSide, MaxHeight)
	}
	return o, nil
}

// Browser is the state of a sandbox's browser.
type Browser struct {
	Running       bool
	Headless      bool
	Width, Height int
	ProcessID     string
	StartedAt     time.Time
	// Version is what the browser reports, e.g. "Chrome/156.0.8078.129".
	Version string
	// DebuggerPath is the browser's DevTools WebSocket path,
	// /devtools/browser/<id>.
	DebuggerPath string
}

// Service starts, finds and stops the browsers of sandboxes.
type Service struct {
	log   *slog.Logger
	locks keyedMutex
	now   func() time.Time
}

// New returns a Service that logs to log (nil discards).
func New(log *slog.Logger) *Service {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Service{log: log, now: time.Now}
}

// StartBrowser starts the browser of sandbox id in g, or answers the one
// running there (whatever it was started with). One with a window
// (Headless false) shows on the sandbox's desktop, which it starts if it
// does not run.
func (s *Service) StartBrowser(ctx context.Context, id string, g Guest, opt BrowserOptions) (*Browser, error) {
	opt, err := opt.Check()
	if err != nil {
		return nil, err
	}
	defer s.locks.lock(id)()
	procs, err := processes(ctx, g)
	if err != nil {
		return nil, err
	}
	if p := findBrowser(procs); p != nil {
		return s.answering(ctx, g, p)
	}
	l, err := s.binary(ctx, g, procs)
	if err != nil {
		return nil, err
	}
	req := guest.ExecRequest{Argv: browserArgv(l, opt, "about:blank"), Cwd: "/tmp", Detach: true, User: l.user}
	if !opt.Headless {
		if _, err := s.StartDesktop(ctx, id, g, DesktopOptions{Width: opt.Width, Height: opt.Height}); err != nil {
			return nil, err
		}
		req.Env = map[string]string{"DISPLAY": Display}
	}
	info, err := g.Spawn(ctx, req)
	if err != nil {
		return nil, fmt.Errorf("starting the browser: %w", err)
	}
	s.log.Info("browser started", "sandbox", id, "process", info.ID, "argv0", l.argv[0])
	b, err := s.answering(ctx, g, info)
	if err != nil {
		kill(ctx, g, info.ID)
		return nil, err
	}
	return b, nil
}

// GetBrowser reports the browser of g: Running false if there is none.
func (s *Service) GetBrowser(ctx context.Context, g Guest) (*Browser, error) {
	procs, err := processes(ctx, g)
	if err != nil {
		return nil, err
	}
	p := findBrowser(procs)
	if p == nil {
		return &Browser{}, nil
	}
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	b := browserOf(p)
	// Running but not answering (starting, or hung): it is said without a
	// URL rather than failing the read.
	if v, err := devtoolsVersion(wctx, g); err == nil {
		b.Version, b.DebuggerPath = v.Browser, v.path
	}
	return &b, nil
}

// StopBrowser ends the browser of sandbox id, reporting whether one ran.
func (s *Service) StopBrowser(ctx context.Context, id string, g Guest) (bool, error) {
	defer s.locks.lock(id)()
	procs, err := processes(ctx, g)
	if err != nil {
		return false, err
	}
	stopped := false
	for i := range procs {
		if isBrowser(procs[i]) && running(procs[i]) {
			kill(ctx, g, procs[i].ID)
			stopped = true
			waitEnded(ctx, g, procs[i].ID)
		}
	}
	if stopped {
		s.log.Info("browser stopped", "sandbox", id)
	}
	return stopped, nil
}

// answering waits for p's DevTools endpoint and returns the browser.
func (s *Service) answering(ctx context.Context, g Guest, p *guest.ProcessInfo) (*Browser, error) {
	wctx, cancel := context.WithTimeout(ctx, startWait)
	defer cancel()
	for {
		v, err := devtoolsVersion(wctx, g)
		if err == nil {
			b := browserOf(p)
			b.Version, b.DebuggerPath = v.Browser, v.path
			return &b, nil
		}
		if errors.Is(err, errBadAnswer) {
			return nil, err
		}
		cur, perr := g.Process(wctx, p.ID)
		if perr == nil && !running(*cur) {
			return nil, errdefs.New(errdefs.ErrInternal, "browser_failed",
				"the browser ended as it started: %s", tail(ctx, g, p.ID))
		}
		select {
		case <-wctx.Done():
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			return nil, errdefs.New(errdefs.ErrUnavailable, "browser_failed",
				"the browser did not answer on port %d within %s", CDPPort, startWait).
				WithHint("GET …/browser reports it once it answers; :stop ends it")
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// browserArgv is how a browser is started. Its profile flag is what
// findBrowser knows it by; the window size is read back from it.
func browserArgv(l launcher, opt BrowserOptions, page string) []string {
	argv := append(slices.Clip(l.argv),
		"--user-data-dir="+profileDir,
		"--remote-debugging-port="+strconv.Itoa(CDPPort),
		"--remote-debugging-address=127.0.0.1",
		"--window-size="+strconv.Itoa(opt.Width)+","+strconv.Itoa(opt.Height),
		"--no-first-run", "--no-default-browser-check", "--password-store=basic",
		// Nothing leaves unasked: no component updates, sync, metrics or
		// crash reports through the sandbox's egress.
		"--disable-background-networking", "--disable-component-update", "--disable-sync",
		"--disable-breakpad", "--disable-domain-reliability",
		// /dev/shm is small in a VM; no GPU in a microVM.
		"--disable-dev-shm-usage", "--disable-gpu",
	)
	if opt.Headless {
		argv = append(argv, "--headless=new")
	}
	return append(argv, page)
}

// isBrowser reports whether p is a browser this package started (of any
// version of the server).
func isBrowser(p guest.ProcessInfo) bool {
	i := slices.Index(p.Argv, "--user-data-dir="+profileDir)
	return i > 0 && i+1 < len(p.Argv) && p.Argv[i+1] == "--remote-debugging-port="+strconv.Itoa(CDPPort)
}

func running(p guest.ProcessInfo) bool { return p.EndedAt == nil && p.ExitCode == nil }

// findBrowser returns the running browser of procs, or nil.
func findBrowser(procs []guest.ProcessInfo) *guest.ProcessInfo {
	for i := range procs {
		if isBrowser(procs[i]) && running(procs[i]) {
			return &procs[i]
		}
	}
	return nil
}

// browserOf reads a browser's options back from its command line.
func browserOf(p *guest.ProcessInfo) Browser {
	b := Browser{Running: true, ProcessID: p.ID, StartedAt: p.StartedAt,
		Headless: slices.Contains(p.Argv, "--headless=new")}
	for _, a := range p.Argv {
		if size, ok := strings.CutPrefix(a, "--window-size="); ok {
			w, h, _ := strings.Cut(size, ",")
			b.Width, _ = strconv.Atoi(w)
			b.Height, _ = strconv.Atoi(h)
		}
	}
	return b
}

// processes lists the guest's processes, which is how this package
// finds what it started.
func processes(ctx context.Context, g Guest) ([]guest.ProcessInfo, error) {
	procs, err := g.Processes(ctx)
	if err != nil {
		return nil, fmt.Errorf("listing the sandbox's processes: %w", err)
	}
	return procs, nil
}

// kill ends a process of the guest, even if ctx has ended.
func kill(ctx context.Context, g Guest, pid string) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	_, _ = g.Signal(ctx, pid, "KILL")
}

// waitEnded waits a while for the agent to reap a killed process, so
// that what a stop answers is what a read after it sees.
func waitEnded(ctx context.Context, g Guest, pid string) {
	waitEndedFor(ctx, g, pid, 15*time.Second)
}

// waitEndedFor waits up to d for process pid of g to end.
func waitEndedFor(ctx context.Context, g Guest, pid string, d time.Duration) {
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	for {
		p, err := g.Process(ctx, pid)
		if err != nil || !running(*p) {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// keyedMutex serializes starts and stops per sandbox.
type keyedMutex struct {
	mu sync.Mutex
	m  map[string]*keyed
}

type keyed struct {
	mu   sync.Mutex
	refs int
}

// lock locks key and returns its unlock.
func (k *keyedMutex) lock(key string) func() {
	k.mu.Lock()
	if k.m == nil {
		k.m = map[string]*keyed{}
	}
	e := k.m[key]
	if e == nil {
		e = &keyed{}
		k.m[key] = e
	}
	e.refs++
	k.mu.Unlock()
	e.mu.Lock()
	return func() {
		e.mu.Unlock()
		k.mu.Lock()
		if e.refs--; e.refs == 0 {
			delete(k.m, key)
		}
		k.mu.Unlock()
	}
}
