package sandbox

import (
	"context"
	"errors"

	"time"

	"github.com/emberbox/emberbox/internal/errdefs"
	"github.com/emberbox/emberbox/internal/guest"
)

// Guest returns a sandbox of owner's together with its guest, or the one
// refusal (see Refusal) for a sandbox that has no guest to call in its
// state. A paused sandbox whose autoWake is on is woken first, and one
// pausing or resuming waited for. It is the only way from the API into a
// guest, so it also counts as the sandbox's activity (idle pause): the
// sandbox is busy, never idle, until ctx ends, so a caller passes the
// context of the work it does with the guest (a request's, a stream's)
// and never one that outlives it.
func (m *Manager) Guest(ctx context.Context, owner, id string) (*Sandbox, guest.Handle, error) {
	// A sandbox may pause again between its wake and the call (an idle
	// pause that was due): a few rounds, then the refusal.
	for range 3 {
		sb, err := m.Get(ctx, owner, id)
		if err != nil {
			return nil, guest.Handle{}, err
		}
		if sb.State.Paused() && sb.AutoWake {
			if err := m.wakeForCall(ctx, owner, sb); err != nil {
				return nil, guest.Handle{}, err
			}
			continue
		}
		if err := Refusal(sb); err != nil {
			return nil, guest.Handle{}, err
		}
		g, err := m.liveGuest(ctx, sb)
		if errors.Is(err, errPausedMeanwhile) {
			continue
		}
		return sb, g, err
	}
	sb, err := m.Get(ctx, owner, id)
	if err != nil {
		return nil, guest.Handle{}, err
	}
	if sb.State.Paused() && sb.AutoWake {
		return nil, guest.Handle{}, errdefs.New(errdefs.ErrUnavailable, "wake_failed",
			"sandbox %s was paused again, or its wake failed, each time it was woken for this call", id).
			WithHint("see GET /v1/sandboxes/{id}/events, and retry")
	}
	if err := Refusal(sb); err != nil {
		return nil, guest.Handle{}, err
	}
	return nil, guest.Handle{}, errdefs.New(errdefs.ErrUnavailable, "guest_busy", "the sandbox paused again while being woken").
		WithHint("retry in a few seconds")
}

// errPausedMeanwhile: the running sandbox's instance ended under the
// call, and the sandbox is being paused.
var errPausedMeanwhile = errors.New("paused meanwhile")

// liveGuest returns the connected guest of a sandbox recorded running.
func (m *Manager) liveGuest(ctx context.Context, sb *Sandbox) (guest.Handle, error) {
	m.mu.Lock()
	in := m.live[sb.ID]
	m.mu.Unlock()
	if in == nil {
		// Recorded running but not (yet) watched by this process: only
		// possible in the moment a stop or pause forgets it.
		return guest.Handle{}, m.refuseGone(sb)
	}
	in.hold(ctx, m.now)
	// Right after a restart or a dropped connection the watcher is still
	// reconnecting; a short wait beats an error the caller must retry.
	c := in.guest()
	if c == nil {
		t := time.NewTimer(reconnectWait)
		defer t.Stop()
		tick := time.NewTicker(25 * time.Millisecond)
		defer tick.Stop()
		for c == nil {
			select {
			case <-ctx.Done():
				return guest.Handle{}, ctx.Err()
			case <-in.ctx.Done():
				return guest.Handle{}, m.refuseGone(sb)
			case <-t.C:
				e := errdefs.New(errdefs.ErrUnavailable, "guest_busy", "the sandbox's agent is reconnecting")
				e.Hint = "retry in a few seconds"
				return guest.Handle{}, e
			case <-tick.C:
				c = in.guest()
			}
		}
	}
	return activeGuest{Client: c, touch: func() { in.touch(m.now()) }}.handle(), nil
}

// refuseGone answers a call whose sandbox lost its instance: paused
// meanwhile (the caller wakes it), or stopping.
func (m *Manager) refuseGone(sb *Sandbox) error {
	if now, err := m.cfg.Store.GetSandbox(context.Background(), sb.ID); err == nil && now.State.Paused() {
		return errPausedMeanwhile
	}
	return refuse(sb, StateStopping)
}

// handle returns g as a guest handle whose port connections count as the
// sandbox's activity.
func (g activeGuest) handle() guest.Handle {
	h := g.Client.Handle()
	h.PortDialer = g
	return h
}
