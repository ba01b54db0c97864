package interpreter

import (
	"context"
	"log/slog"
	"regexp"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/emberbox/emberbox/internal/errdefs"
	"github.com/emberbox/emberbox/internal/guest"
	"github.com/emberbox/emberbox/internal/sandbox"
)

// Guest is what the interpreter calls in a sandbox's guest: it spawns and
// watches the kernel bridge and reaches it on its port.
type Guest interface {
	guest.ProcessRunner
	guest.PortDialer
}

// Bounds of contexts.
const (
	MaxContexts = 16 // per sandbox
	maxEnv      = 128
	maxEnvBytes = 64 << 10
	maxCwd      = 4096
	// maxDetached is how long a context whose connection ended (a paused
	// sandbox, or a stopped one nobody asked about since) is remembered.
	maxDetached = 7 * 24 * time.Hour
	// sweepEvery spaces the sweeps of contexts detached too long.
	sweepEvery = time.Minute
)

var (
	// maxHeld bounds the output all executions under way keep in memory
	// together; past it, output is left out as past MaxOutput.
	maxHeld int64 = 1 << 30
	// interruptGrace is how long an interrupted cell has to end before
	// its context is given up (the bridge and kernel killed).
	interruptGrace = 15 * time.Second
	// reconnectWait bounds waiting for "ready" on a new connection to a
	// running bridge (its kernel is up unless it is restarting).
	reconnectWait = 60 * time.Second
)

// contextID is what a context may be called: Runtime's result paths
// allow these names only.
var contextID = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,62}$`)

// envName is a portable environment variable name.
var envName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// Service keeps the interpreter contexts of every sandbox, in memory: a
// context is a bridge process in its guest that the Service started.
type Service struct {
	log       *slog.Logger
	mu        sync.Mutex
	boxes     map[string]*box // by sandbox id
	lastSweep time.Time
	// held counts the output bytes that executions under way keep, all
	// sandboxes together (at most maxHeld).
	held atomic.Int64
}

// box holds one sandbox's contexts.
type box struct {
	contexts map[string]*kctx
	// strays runs once, before the first bridge the Service starts in
	// the sandbox: bridges running there are left from an earlier server
	// process, which nobody will use again.
	strays sync.Once
}

// New returns an empty Service.
func New(log *slog.Logger) *Service {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Service{log: log, boxes: map[string]*box{}}
}

// kctx is one context: its bridge process, the connection to it, and the
// run in progress.
type kctx struct {
	id       string
	envNames []string
	created  time.Time
	ready    chan struct{} // closed once the start ended
	startErr error         // read after ready
	p        proc          // set before ready closes, if the start worked

	cmu sync.Mutex // guards cwd and b; held while connecting
	cwd string     // what was asked, then what the kernel runs in
	b   *bridge    // the last connection, which may have ended

	slot    chan struct{} // holds a token while a run or restart is under way
	running atomic.Bool
	// interrupted is set by Interrupt during a run.
	interrupted atomic.Bool
}

func (k *kctx) info() ContextInfo {
	k.cmu.Lock()
	cwd := k.cwd
	k.cmu.Unlock()
	return ContextInfo{ID: k.id, Language: Language, Cwd: cwd, EnvNames: k.envNames, Created: k.created,
		Running: k.running.Load()}
}

// failedStart reports whether k's start ended and failed.
func (k *kctx) failedStart() bool {
	select {
	case <-k.ready:
		return k.startErr != nil
	default:
		return false
	}
}

// current returns k's live connection, or nil.
func (k *kctx) current() *bridge {
	k.cmu.Lock()
	defer k.cmu.Unlock()
	if k.b != nil && k.b.alive() {
		return k.b
	}
	return nil
}

// detachedSince returns when k's connection ended, or zero if it is
// connected (or starting).
func (k *kctx) detachedSince() time.Time {
	k.cmu.Lock()
	defer k.cmu.Unlock()
	if k.b == nil || k.b.alive() {
		return time.Time{}
	}
	return k.b.endedAt
}

// bridge returns k's connection, connecting again to its process if the
// last one ended (a sandbox paused and woken keeps its processes, not its
// connections); errProcessGone if the process is not there any more.
func (k *kctx) bridge(ctx context.Context, g Guest) (*bridge, error) {
	k.cmu.Lock()
	defer k.cmu.Unlock()
	if k.b != nil && k.b.alive() {
		return k.b, nil
	}
	if !k.p.alive(ctx, g) {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, errProcessGone
	}
	b, err := k.p.connect(ctx, g, reconnectWait)
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		// A bridge that runs but does not answer cannot be used.
		k.p.kill(ctx, g)
		return nil, errProcessGone
	}
	k.b = b
	return b, nil
}

// notFound is the error of an unknown context.
func notFound(id string) error {
	return errdefs.New(errdefs.ErrNotFound, "context_not_found", "no interpreter context %q in this sandbox", id).
		WithHint("list them with GET …/interpreter/contexts; contexts end when the sandbox stops")
}

// Adopt gives sandbox dst, made from a memory snapshot of src (a fork's
// copy, a checkpoint's branch), the contexts src has: their bridges run
// in dst too, under the same process ids and start times, since dst's
// memory is src's. A context src started after the snapshot has no
// process in dst and is forgotten at its first use there, as any whose
// process is gone. dst's bridges are not strays: the first start there
// does not end them.
func (s *Service) Adopt(src, dst string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	from := s.boxes[src]
	if from == nil || src == dst {
		return
	}
	to := &box{contexts: map[string]*kctx{}}
	to.strays.Do(func() {})
	for id, k := range from.contexts {
		select {
		case <-k.ready:
		default:
			continue // still starting: its process may not be in the snapshot
		}
		if k.startErr != nil {
			continue
		}
		k.cmu.Lock()
		cwd := k.cwd
		k.cmu.Unlock()
		ready := make(chan struct{})
		close(ready)
		to.contexts[id] = &kctx{id: id, envNames: k.envNames, created: k.created, ready: ready, p: k.p,
			cwd: cwd, slot: make(chan struct{}, 1)}
	}
	if len(to.contexts) > 0 {
		s.boxes[dst] = to
	}
}

// lookup returns a context that started or is starting.
func (s *Service) lookup(sandboxID, id string) *kctx {
	s.mu.Lock()
	defer s.mu.Unlock()
	bx := s.boxes[sandboxID]
	if bx == nil {
		return nil
	}
	k := bx.contexts[id]
	if k != nil && k.failedStart() {
		s.forgetLocked(sandboxID, k)
		return nil
	}
	return k
}

// forget drops k if it is still the context of its id.
func (s *Service) forget(sandboxID string, k *kctx) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.forgetLocked(sandboxID, k)
}

func (s *Service) forgetLocked(sandboxID string, k *kctx) {
	if bx := s.boxes[sandboxID]; bx != nil && bx.contexts[k.id] == k {
		delete(bx.contexts, k.id)
	}
}

// sweepLocked forgets contexts detached for longer than maxDetached and
// boxes left empty, at most once per sweepEvery: a sandbox deleted while
// no one used its contexts would otherwise be remembered forever.
func (s *Service) sweepLocked(now time.Time) {
	if now.Sub(s.lastSweep) < sweepEvery {
		return
	}
	s.lastSweep = now
	for id, bx := range s.boxes {
		for cid, k := range bx.contexts {
			if since := k.detachedSince(); !since.IsZero() && now.Sub(since) > maxDetached {
				delete(bx.contexts, cid)
			}
		}
		if len(bx.contexts) == 0 {
			delete(s.boxes, id)
		}
	}
}

// boxFor returns sb's box once its strays are gone, with s.mu held.
func (s *Service) boxFor(ctx context.Context, sb *sandbox.Sandbox, g Guest) *box {
	for {
		s.mu.Lock()
		s.sweepLocked(time.Now())
		bx := s.boxes[sb.ID]
		if bx == nil {
			bx = &box{contexts: map[string]*kctx{}}
			s.boxes[sb.ID] = bx
		}
		s.mu.Unlock()
		bx.strays.Do(func() { s.killStrays(ctx, sb, g) })
		s.mu.Lock()
		if s.boxes[sb.ID] == bx {
			return bx
		}
		s.mu.Unlock() // swept meanwhile: take the new one
	}
}

// killStrays ends the bridges running in sb that this Service did not
// start; it runs before this Service starts any there.
func (s *Service) killStrays(ctx context.Context, sb *sandbox.Sandbox, g Guest) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	procs, err := g.Processes(ctx)
	if err != nil {
		s.log.Warn("listing the sandbox's processes for old interpreters", "sandbox", sb.ID, "err", err)
		return
	}
	for _, p := range procs {
		if p.EndedAt == nil && isBridge(p) {
			s.log.Info("ending an interpreter left by an earlier server", "sandbox", sb.ID, "process", p.ID)
			_, _ = g.Signal(ctx, p.ID, "KILL")
		}
	}
}

// open returns the context id of sb, starting it if it is the default
// one (or spec is given, to create it); it waits for a start under way.
func (s *Service) open(ctx context.Context, sb *sandbox.Sandbox, g Guest, id string, spec *CreateRequest) (*kctx, error) {
	bx := s.boxFor(ctx, sb, g) // s.mu held
	k := bx.contexts[id]
	if k != nil && k.failedStart() {
		s.forgetLocked(sb.ID, k)
		k = nil
	}
	if k != nil && spec != nil {
		s.mu.Unlock()
		return nil, errdefs.New(errdefs.ErrConflict, "context_exists", "an interpreter context %q exists already", id)
	}
	starter := false
	if k == nil {
		if spec == nil && id != DefaultContext {
			s.mu.Unlock()
			return nil, notFound(id)
		}
		if len(bx.contexts) >= MaxContexts {
			s.mu.Unlock()
			return nil, errdefs.New(errdefs.ErrConflict, "too_many_contexts",
				"the sandbox has %d interpreter contexts, the most it may have", MaxContexts).
				WithHint("delete one with DELETE …/interpreter/contexts/{id}")
		}
		if spec == nil {
			spec = &CreateRequest{}
		}
		k = &kctx{id: id, cwd: spec.Cwd, created: time.Now().UTC(), ready: make(chan struct{}), slot: make(chan struct{}, 1)}
		for name := range spec.Env {
			k.envNames = append(k.envNames, name)
		}
		sort.Strings(k.envNames)
		bx.contexts[id] = k
		starter = true
	}
	s.mu.Unlock()
	if starter {
		// Waiters share this start, so one caller's cancel must not end it.
		if err := s.start(context.WithoutCancel(ctx), g, k, spec); err != nil {
			k.startErr = err
			s.forget(sb.ID, k)
			close(k.ready)
			s.log.Warn("interpreter context did not start", "sandbox", sb.ID, "context", id, "err", err)
			return nil, err
		}
		close(k.ready)
		s.log.Info("interpreter context started", "sandbox", sb.ID, "context", id)
		return k, nil
	}
	select {
	case <-k.ready:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	if k.startErr != nil {
		return nil, k.startErr
	}
	return k, nil
}

// start starts k's bridge and connects to it.
func (s *Service) start(ctx context.Context, g Guest, k *kctx, spec *CreateRequest) error {
	p, cwd, err := spawnBridge(ctx, g, spec.Cwd, spec.Env)
	if err != nil {
		return err
	}
	b, err := p.connect(ctx, g, readyWait)
	if err != nil {
		p.kill(ctx, g)
		return err
	}
	k.cmu.Lock()
	k.p, k.cwd, k.b = p, cwd, b
	k.cmu.Unlock()
	return nil
}
