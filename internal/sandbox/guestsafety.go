package sandbox

import (
	"context"
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/emberbox/emberbox/internal/guest"
)

// A guest is not trusted (root in it can take over the agent's channel), so
// what it does wrong is counted: answers over their limits or that do not
// decode, streams it opens that break the protocol, and sessions that end
// within minSessionLife of their handshake. maxViolations of those within
// violationWindow are "repeated": the sandbox is stopped with reason
// guest_protocol_violation. An agent that works never commits one; one
// lost session can come from a VM that is exiting, hence more than one.
const (
	maxViolations   = 10
	violationWindow = 10 * time.Minute
	minSessionLife  = 10 * time.Second
	// maxViolationEvents bounds the violation events of one run of a
	// sandbox; the stop event says how many there were.
	maxViolationEvents = 20
)

// Reconnecting to a guest backs off: after a failed attempt, or a session
// that ended within minSessionLife, the next attempt waits a random time in
// [d/2, d], d doubling from reconnectBackoffMin to reconnectBackoffMax, so
// a guest that drops its session right after the handshake costs the host
// a few attempts a minute, not hundreds a second.
const (
	reconnectBackoffMin = 250 * time.Millisecond
	reconnectBackoffMax = 10 * time.Second
)

// backoff returns the wait before reconnect attempt n (n ≥ 1 failures).
func backoff(n int) time.Duration {
	d := reconnectBackoffMax
	if n < 16 {
		d = min(reconnectBackoffMin<<(n-1), reconnectBackoffMax)
	}
	return d/2 + rand.N(d/2+1)
}

// Log lines a guest can cause are rate-limited per sandbox: at most
// guestLogBurst per guestLogWindow, then one line saying how many were
// left out.
const (
	guestLogBurst  = 10
	guestLogWindow = time.Minute
)

// guestSafety is the per-sandbox state of the above.
type guestSafety struct {
	mu         sync.Mutex
	violations []time.Time // within violationWindow, oldest first
	total      int         // in this run
	stopping   bool
	logStart   time.Time
	logged     int
	suppressed int
}

// conduct keeps each guest to the protocol: it rate-limits the warnings a
// guest causes and stops a sandbox whose guest breaks the protocol
// repeatedly.
type conduct struct {
	host conductHost
	log  *slog.Logger
}

// conductHost is what conduct needs of the manager: goroutines it owns,
// sandbox events and a stop.
type conductHost interface {
	spawn(f func()) bool
	event(id, typ, msg string, data map[string]any)
	stop(ctx context.Context, id, reason string, wait bool) (*Sandbox, error)
}

// warn logs a warning caused by the guest of in, within the rate limit.
func (c conduct) warn(in *instance, msg string, args ...any) {
	now := time.Now()
	gs := &in.safety
	gs.mu.Lock()
	var summary int
	if now.Sub(gs.logStart) >= guestLogWindow {
		summary = gs.suppressed
		gs.logStart, gs.logged, gs.suppressed = now, 0, 0
	}
	ok := gs.logged < guestLogBurst
	if ok {
		gs.logged++
	} else {
		gs.suppressed++
	}
	first := !ok && gs.suppressed == 1
	gs.mu.Unlock()
	if summary > 0 {
		c.log.Warn("guest warnings left out of the log", "sandbox_id", in.id, "count", summary, "window", guestLogWindow)
	}
	if ok {
		c.log.Warn(msg, append([]any{"sandbox_id", in.id}, args...)...)
	} else if first {
		c.log.Warn("rate-limiting this sandbox's guest warnings", "sandbox_id", in.id, "max_per_window", guestLogBurst)
	}
}

// violation counts a violation of the guest of in, records it, and stops
// the sandbox when violations repeat.
func (c conduct) violation(in *instance, v guest.Violation) {
	now := time.Now()
	gs := &in.safety
	gs.mu.Lock()
	gs.total++
	total := gs.total
	keep := gs.violations[:0]
	for _, t := range gs.violations {
		if now.Sub(t) < violationWindow {
			keep = append(keep, t)
		}
	}
	gs.violations = append(keep, now)
	repeated := len(gs.violations) >= maxViolations && !gs.stopping
	if repeated {
		gs.stopping = true
	}
	gs.mu.Unlock()

	c.warn(in, "guest protocol violation", "violation", v.String(), "count", total)
	data := map[string]any{"method": v.Method, "problem": v.Problem, "count": total}
	if total <= maxViolationEvents {
		c.host.spawn(func() {
			c.host.event(in.id, "guest_protocol_violation", "the guest broke the protocol: "+v.String(), data)
		})
	}
	if !repeated {
		return
	}
	c.log.Error("stopping sandbox after repeated guest protocol violations", "sandbox_id", in.id,
		"violations", maxViolations, "window", violationWindow, "last", v.String())
	c.host.spawn(func() {
		c.host.event(in.id, "guest_protocol_violation", "stopping: the guest broke the protocol repeatedly",
			map[string]any{"method": v.Method, "problem": v.Problem, "count": total, "stopping": true})
		if _, err := c.host.stop(context.Background(), in.id, ReasonGuestProtocolViolation, false); err != nil {
			c.log.Error("stopping sandbox", "sandbox_id", in.id, "err", err)
		}
	})
}
