package interpreter

import (
	"context"
	"errors"
	"strings"
	"time"

	"github.com/emberbox/emberbox/internal/errdefs"
	"github.com/emberbox/emberbox/internal/sandbox"
)

// Bounds of what a result may carry, as the guest sent it.
const (
	maxMIMETypes = 32
	maxMIMEName  = 128
	// MaxCode bounds the code of one execution.
	MaxCode = 1 << 20
)

// Run executes req.Code in a context of sb (the default one, started on
// first use, when req.Context is ""), telling emit of each output as it
// comes. It returns when the cell has ended: an error in the code is the
// execution's Error, not Run's; Run's errors are about the context (not
// found, cannot start, busy past ctx). An error from emit stops further
// calls to it and counts as the client gone.
func (s *Service) Run(ctx context.Context, sb *sandbox.Sandbox, g Guest, req RunRequest, emit func(Event) error) (*Execution, error) {
	if err := checkLanguage(req.Language); err != nil {
		return nil, err
	}
	if len(req.Code) > MaxCode {
		return nil, invalidArg("code", "must be at most 1 MiB")
	}
	if err := checkEnv("env", req.Env); err != nil {
		return nil, err
	}
	id := req.Context
	if id == "" {
		id = DefaultContext
	}
	for attempt := 0; ; attempt++ {
		k, err := s.open(ctx, sb, g, id, nil)
		if err != nil {
			return nil, err
		}
		ex, err := s.runIn(ctx, g, k, req, emit)
		if errors.Is(err, errProcessGone) {
			// The sandbox restarted, or the bridge was killed: the
			// context is gone. The default one starts again.
			s.forget(sb.ID, k)
			if id == DefaultContext && attempt == 0 {
				continue
			}
			return nil, notFound(id)
		}
		return ex, err
	}
}

// runIn runs req in k once it has k's slot and a connection to its bridge.
func (s *Service) runIn(ctx context.Context, g Guest, k *kctx, req RunRequest, emit func(Event) error) (*Execution, error) {
	select {
	case k.slot <- struct{}{}:
	case <-ctx.Done():
		return nil, errdefs.New(errdefs.ErrConflict, "context_busy",
			"interpreter context %q was running another cell until this request ended", k.id)
	}
	defer func() { <-k.slot }()
	k.interrupted.Store(false)
	k.running.Store(true)
	defer k.running.Store(false)
	start := time.Now()
	// A connection found cut at the first write (the sandbox was paused
	// and woken since) is replaced once.
	for attempt := 0; ; attempt++ {
		b, err := k.bridge(ctx, g)
		if err != nil {
			return nil, err
		}
		ex := s.drive(ctx, g, k, b, req, emit)
		if ex == nil && attempt == 0 {
			b.close()
			<-b.done
			continue
		}
		if ex == nil {
			ex = &Execution{Status: StatusLost}
		}
		ex.Context, ex.Duration = k.id, time.Since(start)
		return ex, nil
	}
}

// drive sends one execution to k's bridge and collects its events.
// A connection that ends during the cell ends the run as lost; the
// context stays (its kernel may well go on: a paused sandbox). It returns
// nil if the cell could not be sent.
func (s *Service) drive(ctx context.Context, g Guest, k *kctx, b *bridge, req RunRequest, emit func(Event) error) *Execution {
	env := req.Env
	if env == nil {
		env = map[string]string{}
	}
	rid := nextID()
	if err := b.send(map[string]any{"op": "execute", "id": rid, "code": req.Code, "env": env}); err != nil {
		return nil
	}
	c := &cell{s: s, k: k, b: b, req: req, emit: emit, rid: rid, ex: &Execution{}}
	defer func() { s.held.Add(-int64(c.kept)) }()
	var timeout <-chan time.Time
	if req.Timeout > 0 {
		t := time.NewTimer(req.Timeout)
		defer t.Stop()
		timeout = t.C
	}
	done := ctx.Done()
	status := ""
	for status == "" {
		select {
		case w, ok := <-b.events:
			if !ok {
				status = StatusLost
				break
			}
			status = c.event(w)
		case <-done:
			done = nil
			c.clientLeft()
		case <-timeout:
			timeout = nil
			c.timedOut = true
			c.interrupt()
		case <-c.grace:
			// The cell would not stop: give up the context, kernel and all.
			s.log.Warn("interpreter cell ignored its interrupt; ending the context", "context", k.id)
			b.close()
			k.p.kill(context.WithoutCancel(ctx), g)
			status = StatusLost
		}
	}
	return c.result(status)
}

// A cell is one execution under way: what drive has collected of it, and
// what it did about a client gone or a timeout.
type cell struct {
	s    *Service
	k    *kctx
	b    *bridge
	req  RunRequest
	emit func(Event) error
	rid  int64 // the execute request's id; events of others are stale

	ex             *Execution
	stdout, stderr strings.Builder
	kept           int // output bytes kept, counted in s.held too

	clientGone  bool
	timedOut    bool
	interrupted bool             // sent by us: timeout or a gone client
	grace       <-chan time.Time // after an interrupt: how long the cell has to stop
}

// interrupt asks the kernel to stop the cell, once.
func (c *cell) interrupt() {
	if !c.interrupted {
		c.interrupted = true
		_ = c.b.send(map[string]string{"op": "interrupt"})
		c.grace = time.After(interruptGrace)
	}
}

// clientLeft notes the client is gone; the cell is interrupted unless the
// request asked to keep it running.
func (c *cell) clientLeft() {
	c.clientGone = true
	if !c.req.KeepOnDisconnect {
		c.interrupt()
	}
}

// tell passes ev to the client while it listens.
func (c *cell) tell(ev Event) {
	if c.clientGone || c.emit == nil {
		return
	}
	if err := c.emit(ev); err != nil {
		c.clientLeft()
	}
}

// event takes one event from the bridge, and returns the cell's status
// once it has ended ("" until then). Output past the bounds is dropped
// and the execution marked truncated.
func (c *cell) event(w wireEvent) string {
	if w.Ev == "fatal" {
		c.s.log.Warn("interpreter bridge failed", "context", c.k.id, "message", clip(w.Message, 512))
		return ""
	}
	if w.ID != c.rid {
		return "" // left from a request before
	}
	if w.Ev == "end" {
		return w.Status
	}
	if w.Ev != "error" && w.Ev != "count" &&
		(c.kept+w.size > MaxOutput || c.s.held.Load()+int64(w.size) > maxHeld) {
		c.ex.Truncated = true
		return ""
	}
	c.kept += w.size
	c.s.held.Add(int64(w.size))
	ev, ok := toEvent(w)
	if !ok {
		return ""
	}
	c.record(ev)
	c.tell(ev)
	return ""
}

// record adds ev to the execution.
func (c *cell) record(ev Event) {
	switch ev.Kind {
	case KindStdout:
		c.stdout.WriteString(ev.Text)
	case KindStderr:
		c.stderr.WriteString(ev.Text)
	case KindResult:
		c.ex.Results = append(c.ex.Results, *ev.Result)
	case KindError:
		c.ex.Error = ev.Error
	case KindCount:
		c.ex.ExecutionCount = ev.Count
	}
}

// result completes the execution once the cell ended with status: lost,
// timed out and interrupted say so before the kernel's own status.
func (c *cell) result(status string) *Execution {
	ex := c.ex
	ex.Stdout, ex.Stderr = c.stdout.String(), c.stderr.String()
	switch {
	case status == StatusLost:
		ex.Status = StatusLost
	case c.timedOut:
		ex.Status = StatusTimeout
	case c.interrupted || c.k.interrupted.Load():
		ex.Status = StatusInterrupted
	}
	if (ex.Status == StatusTimeout || ex.Status == StatusInterrupted) && ex.Error == nil {
		// An interrupt that lands before the kernel starts the cell aborts
		// it without a traceback; the caller still learns why it ended.
		ex.Error = &ExecError{Name: "KeyboardInterrupt", Value: "the cell was interrupted before it ran"}
	}
	switch {
	case ex.Status != "":
	case ex.Error != nil || status != StatusOK:
		ex.Status = StatusError
	default:
		ex.Status = StatusOK
	}
	return ex
}

// toEvent checks a bridge event and turns it into an Event.
func toEvent(w wireEvent) (Event, bool) {
	switch w.Ev {
	case "stdout":
		return Event{Kind: KindStdout, Text: w.Text}, true
	case "stderr":
		return Event{Kind: KindStderr, Text: w.Text}, true
	case "count":
		if w.N < 0 {
			return Event{}, false
		}
		return Event{Kind: KindCount, Count: w.N}, true
	case "error":
		return Event{Kind: KindError, Error: &ExecError{Name: clip(w.Name, 1024), Value: w.Value, Traceback: w.Traceback}}, true
	case "result":
		if len(w.Data) == 0 || len(w.Data) > maxMIMETypes {
			return Event{}, false
		}
		for mime := range w.Data {
			if mime == "" || len(mime) > maxMIMEName {
				return Event{}, false
			}
		}
		return Event{Kind: KindResult, Result: &Result{Main: w.Main, Data: w.Data}}, true
	}
	return Event{}, false
}

// IsNotFound reports whether err is an unknown context.
func IsNotFound(err error) bool {
	return errors.Is(err, errdefs.ErrNotFound)
}
