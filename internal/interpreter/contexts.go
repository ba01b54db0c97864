package interpreter

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"sort"
	"strings"
	"sync/atomic"
	"time"

	"github.com/emberbox/emberbox/internal/errdefs"
	"github.com/emberbox/emberbox/internal/sandbox"
)

// The operations on contexts the routes call; service.go keeps them.

// Create starts a new context in sb.
func (s *Service) Create(ctx context.Context, sb *sandbox.Sandbox, g Guest, req CreateRequest) (ContextInfo, error) {
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

// List returns sb's contexts, oldest first. A context whose connection
// ended is connected again first, and forgotten if its process is gone.
func (s *Service) List(ctx context.Context, sb *sandbox.Sandbox, g Guest) []ContextInfo {
	s.mu.Lock()
	var ks []*kctx
	if bx := s.boxes[sb.ID]; bx != nil {
		for _, k := range bx.contexts {
			ks = append(ks, k)
		}
	}
	s.mu.Unlock()
	out := []ContextInfo{}
	for _, k := range ks {
		if k.failedStart() {
			continue
		}
		if !k.detachedSince().IsZero() && !k.running.Load() {
			if _, err := k.bridge(ctx, g); errors.Is(err, errProcessGone) {
				s.forget(sb.ID, k)
				continue
			}
		}
		out = append(out, k.info())
	}
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
	b := k.current()
	if !k.running.Load() || b == nil {
		return false, nil
	}
	k.interrupted.Store(true)
	if err := b.send(map[string]string{"op": "interrupt"}); err != nil {
		return false, nil
	}
	return true, nil
}

// Restart starts a context's kernel again with empty state, interrupting
// a cell that runs. The default context is started if it was not.
func (s *Service) Restart(ctx context.Context, sb *sandbox.Sandbox, g Guest, id string) (ContextInfo, error) {
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
	if b := k.current(); b != nil && k.running.Load() {
		k.interrupted.Store(true)
		_ = b.send(map[string]string{"op": "interrupt"})
	}
	select {
	case k.slot <- struct{}{}:
	case <-ctx.Done():
		return ContextInfo{}, ctx.Err()
	}
	defer func() { <-k.slot }()
	b, err := k.bridge(ctx, g)
	if errors.Is(err, errProcessGone) {
		s.forget(sb.ID, k)
		return s.Restart(ctx, sb, g, id) // the default one starts afresh; another is not found
	}
	if err != nil {
		return ContextInfo{}, err
	}
	rid := nextID()
	if err := b.send(map[string]any{"op": "restart", "id": rid}); err != nil {
		return ContextInfo{}, failed("the interpreter's connection ended while restarting; retry")
	}
	wait, cancel := context.WithTimeout(context.WithoutCancel(ctx), readyWait)
	defer cancel()
	for {
		ev, err := b.next(wait)
		if err != nil {
			if errors.Is(err, errBridgeGone) {
				return ContextInfo{}, failed("the interpreter's connection ended while restarting; retry")
			}
			// A kernel that does not come back leaves a context that
			// cannot run: give it up.
			b.close()
			k.p.kill(ctx, g)
			s.forget(sb.ID, k)
			return ContextInfo{}, failed("the interpreter's kernel did not restart within %s", readyWait)
		}
		switch {
		case ev.Ev == "restarted" && ev.ID == rid:
			return k.info(), nil
		case ev.Ev == "fatal":
			b.close()
			k.p.kill(ctx, g)
			s.forget(sb.ID, k)
			return ContextInfo{}, failed("%s", clip(ev.Message, 2048))
		}
	}
}

// Delete ends a context and its kernel; false if there was none.
func (s *Service) Delete(ctx context.Context, sb *sandbox.Sandbox, g Guest, id string) bool {
	s.mu.Lock()
	var k *kctx
	if bx := s.boxes[sb.ID]; bx != nil {
		k = bx.contexts[id]
	}
	if k != nil {
		s.forgetLocked(sb.ID, k)
	}
	s.mu.Unlock()
	if k == nil || k.failedStart() {
		return false
	}
	go func() {
		<-k.ready
		if k.startErr != nil {
			return
		}
		if b := k.current(); b != nil {
			_ = b.send(map[string]string{"op": "shutdown"})
			b.close()
			return
		}
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		if k.p.alive(ctx, g) {
			k.p.kill(ctx, g)
		}
	}()
	return true
}

// requestIDs numbers the requests sent to bridges, so events left from an
// earlier request (on a connection that ended) are told apart.
var requestIDs atomic.Int64

func nextID() int64 { return requestIDs.Add(1) }

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
