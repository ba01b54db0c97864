package interpreter

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"log/slog"
	"regexp"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/emberbox/emberbox/internal/errdefs"
	"github.com/emberbox/emberbox/internal/sandbox"
)

// Bounds of contexts.
const (
	MaxContexts = 16 // per sandbox
	maxEnv      = 128
	maxEnvBytes = 64 << 10
	maxCwd      = 4096
)

// interruptGrace is how long an interrupted cell has to end before its
// context is given up (the bridge and kernel killed).
var interruptGrace = 15 * time.Second

// contextID is what a context may be called: Runtime's result paths
// allow these names only.
var contextID = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,62}$`)

// envName is a portable environment variable name.
var envName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// Service keeps the interpreter contexts of every sandbox. It holds no
// state that outlives the bridges' connections.
type Service struct {
	log   *slog.Logger
	mu    sync.Mutex
	boxes map[string]map[string]*kctx // sandbox id → context id → context
}

// New returns an empty Service.
func New(log *slog.Logger) *Service {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Service{log: log, boxes: map[string]map[string]*kctx{}}
}

// kctx is one context: its kernel's bridge and the run in progress.
type kctx struct {
	id, cwd  string
	envNames []string
	created  time.Time
	ready    chan struct{} // closed once the start ended
	startErr error         // read after ready
	b        *bridge       // set before ready closes, if the start worked
	slot     chan struct{} // holds a token while a run or restart is under way
	running  atomic.Bool
	// interrupted is set by Interrupt during a run.
	interrupted atomic.Bool
}

func (k *kctx) info() ContextInfo {
	return ContextInfo{ID: k.id, Language: Language, Cwd: k.cwd, EnvNames: k.envNames, Created: k.created,
		Running: k.running.Load()}
}

// started reports whether k's start ended, and if so whether it is alive.
func (k *kctx) state() (started, alive bool) {
	select {
	case <-k.ready:
		return true, k.startErr == nil && k.b.alive()
	default:
		return false, false
	}
}

// notFound is the error of an unknown context.
func notFound(id string) error {
	return errdefs.New(errdefs.ErrNotFound, "context_not_found", "no interpreter context %q in this sandbox", id).
		WithHint("list them with GET …/interpreter/contexts; contexts end when the sandbox stops")
}

// lookup returns a live or starting context, forgetting a dead one.
func (s *Service) lookup(sandboxID, id string) *kctx {
	s.mu.Lock()
	defer s.mu.Unlock()
	k := s.boxes[sandboxID][id]
	if k == nil {
		return nil
	}
	if started, alive := k.state(); started && !alive {
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
	box := s.boxes[sandboxID]
	if box[k.id] == k {
		delete(box, k.id)
	}
	if len(box) == 0 {
		delete(s.boxes, sandboxID)
	}
}

// open returns the context id of sb, starting it if it is the default
// one (or spec is given, to create it); it waits for a start under way.
func (s *Service) open(ctx context.Context, sb *sandbox.Sandbox, g sandbox.Guest, id string, spec *CreateRequest) (*kctx, error) {
	s.mu.Lock()
	box := s.boxes[sb.ID]
	k := box[id]
	if k != nil {
		if started, alive := k.state(); started && !alive {
			s.forgetLocked(sb.ID, k)
			box, k = s.boxes[sb.ID], nil
		}
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
		if len(box) >= MaxContexts {
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
		if box == nil {
			box = map[string]*kctx{}
			s.boxes[sb.ID] = box
		}
		box[id] = k
		starter = true
	}
	s.mu.Unlock()
	if starter {
		// Waiters share this start, so one caller's cancel must not end it.
		b, cwd, err := startBridge(context.WithoutCancel(ctx), g, spec.Cwd, spec.Env)
		if err != nil {
			k.startErr = err
			s.forget(sb.ID, k)
			close(k.ready)
			s.log.Warn("interpreter context did not start", "sandbox", sb.ID, "context", id, "err", err)
			return nil, err
		}
		k.b, k.cwd = b, cwd
		close(k.ready)
		go func() {
			<-b.done
			s.forget(sb.ID, k)
		}()
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

// Create starts a new context in sb.
func (s *Service) Create(ctx context.Context, sb *sandbox.Sandbox, g sandbox.Guest, req CreateRequest) (ContextInfo, error) {
	if err := checkLanguage(req.Language); err != nil {
		return ContextInfo{}, err
	}
	if req.ID == "" {
		var raw [6]byte
		_, _ = rand.Read(raw[:])
		req.ID = "ctx-" + hex.EncodeToString(raw[:])
	}
	if !contextID.MatchString(req.ID) {
		return ContextInfo{}, invalidArg("id", "must be 1 to 63 of a-z, 0-9 and -, starting with a letter or digit")
	}
	if req.Cwd != "" && (!strings.HasPrefix(req.Cwd, "/") || len(req.Cwd) > maxCwd || strings.ContainsRune(req.Cwd, 0)) {
		return ContextInfo{}, invalidArg("cwd", "must be an absolute path")
	}
	if err := checkEnv("env", req.Env); err != nil {
		return ContextInfo{}, err
	}
	k, err := s.open(ctx, sb, g, req.ID, &req)
	if err != nil {
		return ContextInfo{}, err
	}
	return k.info(), nil
}

// List returns sb's contexts, oldest first.
func (s *Service) List(sandboxID string) []ContextInfo {
	s.mu.Lock()
	var out []ContextInfo
	for _, k := range s.boxes[sandboxID] {
		if started, alive := k.state(); started && !alive {
			continue
		}
		out = append(out, k.info())
	}
	s.mu.Unlock()
	sort.Slice(out, func(i, j int) bool {
		if !out[i].Created.Equal(out[j].Created) {
			return out[i].Created.Before(out[j].Created)
		}
		return out[i].ID < out[j].ID
	})
	return out
}

// Get returns one context.
func (s *Service) Get(sandboxID, id string) (ContextInfo, error) {
	k := s.lookup(sandboxID, id)
	if k == nil {
		return ContextInfo{}, notFound(id)
	}
	return k.info(), nil
}

// Interrupt stops the cell running in a context, as Ctrl-C would; false
// if none was running.
func (s *Service) Interrupt(sandboxID, id string) (bool, error) {
	k := s.lookup(sandboxID, id)
	if k == nil {
		if id == DefaultContext {
			return false, nil
		}
		return false, notFound(id)
	}
	if !k.running.Load() {
		return false, nil
	}
	k.interrupted.Store(true)
	if err := k.b.send(map[string]string{"op": "interrupt"}); err != nil {
		return false, nil
	}
	return true, nil
}

// Restart starts a context's kernel again with empty state, interrupting
// a cell that runs. The default context is started if it was not.
func (s *Service) Restart(ctx context.Context, sb *sandbox.Sandbox, g sandbox.Guest, id string) (ContextInfo, error) {
	k := s.lookup(sb.ID, id)
	if k == nil {
		if id != DefaultContext {
			return ContextInfo{}, notFound(id)
		}
		k, err := s.open(ctx, sb, g, id, nil)
		if err != nil {
			return ContextInfo{}, err
		}
		return k.info(), nil
	}
	select {
	case <-k.ready:
	case <-ctx.Done():
		return ContextInfo{}, ctx.Err()
	}
	if k.startErr != nil {
		return ContextInfo{}, k.startErr
	}
	if k.running.Load() {
		k.interrupted.Store(true)
		_ = k.b.send(map[string]string{"op": "interrupt"})
	}
	select {
	case k.slot <- struct{}{}:
	case <-ctx.Done():
		return ContextInfo{}, ctx.Err()
	}
	defer func() { <-k.slot }()
	if err := k.b.send(map[string]string{"op": "restart"}); err != nil {
		s.forget(sb.ID, k)
		return ContextInfo{}, notFound(id)
	}
	wait, cancel := context.WithTimeout(context.WithoutCancel(ctx), readyWait)
	defer cancel()
	for {
		ev, err := k.b.next(wait)
		if err != nil {
			// A kernel that does not come back leaves a context that
			// cannot run: give it up.
			k.b.close()
			s.forget(sb.ID, k)
			if errors.Is(err, errBridgeGone) {
				return ContextInfo{}, failed("the interpreter ended while restarting")
			}
			return ContextInfo{}, failed("the interpreter's kernel did not restart within %s", readyWait)
		}
		switch ev.Ev {
		case "restarted":
			return k.info(), nil
		case "fatal":
			k.b.close()
			s.forget(sb.ID, k)
			return ContextInfo{}, failed("%s", clip(ev.Message, 2048))
		}
	}
}

// Delete ends a context and its kernel; false if there was none.
func (s *Service) Delete(sandboxID, id string) bool {
	s.mu.Lock()
	k := s.boxes[sandboxID][id]
	if k != nil {
		s.forgetLocked(sandboxID, k)
	}
	s.mu.Unlock()
	if k == nil {
		return false
	}
	go func() {
		<-k.ready
		if k.b != nil {
			_ = k.b.send(map[string]string{"op": "shutdown"})
			k.b.close()
		}
	}()
	return true
}

func checkLanguage(lang string) error {
	if lang == "" || lang == Language {
		return nil
	}
	return errdefs.New(errdefs.ErrInvalidArgument, "language_unsupported",
		"the interpreter runs python only, not %q", clip(lang, 64)).
		WithHint(`omit language or pass "python"; run other languages with exec`)
}

func checkEnv(field string, env map[string]string) error {
	if len(env) > maxEnv {
		return invalidArg(field, "must have at most 128 variables")
	}
	total := 0
	for k, v := range env {
		if !envName.MatchString(k) || strings.ContainsRune(v, 0) {
			return invalidArg(field, "names must be letters, digits and _, values without NUL")
		}
		total += len(k) + len(v)
	}
	if total > maxEnvBytes {
		return invalidArg(field, "must be at most 64 KiB")
	}
	return nil
}

// invalidArg is a request's field that cannot be used.
func invalidArg(field, msg string) error {
	return errdefs.New(errdefs.ErrInvalidArgument, "invalid_request", "%s %s", field, msg)
}
