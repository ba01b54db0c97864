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
	return m.calls.guest(ctx, owner, id)
}

// guestCalls finds the guest of a sandbox for a call into it, waking the
// sandbox or waiting for its guest's connection as it must.
type guestCalls struct {
	host        guestCallHost
	records     Store
	bootTimeout time.Duration // how long a sandbox starting may take to run
	moving      func(id string) bool
}

// guestCallHost is what a guest call needs of the manager: a sandbox as
// its owner sees it, waited for and woken, its instance and the clock.
type guestCallHost interface {
	Get(ctx context.Context, owner, id string) (*Sandbox, error)
	WaitFor(ctx context.Context, owner, id string, states ...State) (*Sandbox, error)
	wake(ctx context.Context, id string, timeout *int) (*Sandbox, error)
	liveInstance(id string) *instance
	now() time.Time
}

// guest implements Manager.Guest.
func (gc guestCalls) guest(ctx context.Context, owner, id string) (*Sandbox, guest.Handle, error) {
	// A sandbox may pause again between its wake and the call (an idle
	// pause that was due): a few rounds, then the refusal.
	for range 3 {
		sb, err := gc.host.Get(ctx, owner, id)
		if err != nil {
			return nil, guest.Handle{}, err
		}
		if gc.moving != nil && gc.moving(id) {
			return nil, guest.Handle{}, errMoving(id)
		}
		if sb.State.Paused() && sb.AutoWake {
			if err := gc.wakeForCall(ctx, owner, sb); err != nil {
				return nil, guest.Handle{}, err
			}
			continue
		}
		if err := Refusal(sb); err != nil {
			return nil, guest.Handle{}, err
		}
		g, err := gc.liveGuest(ctx, sb)
		if errors.Is(err, errPausedMeanwhile) {
			continue
		}
		return sb, g, err
	}
	sb, err := gc.host.Get(ctx, owner, id)
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
func (gc guestCalls) liveGuest(ctx context.Context, sb *Sandbox) (guest.Handle, error) {
	in := gc.host.liveInstance(sb.ID)
	if in == nil {
		// Recorded running but not (yet) watched by this process: only
		// possible in the moment a stop or pause forgets it.
		return guest.Handle{}, gc.refuseGone(sb)
	}
	in.hold(ctx, gc.host.now)
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
				return guest.Handle{}, gc.refuseGone(sb)
			case <-t.C:
				e := errdefs.New(errdefs.ErrUnavailable, "guest_busy", "the sandbox's agent is reconnecting")
				e.Hint = "retry in a few seconds"
				return guest.Handle{}, e
			case <-tick.C:
				c = in.guest()
			}
		}
	}
	return activeGuest{Client: c, touch: func() { in.touch(gc.host.now()) }}.handle(), nil
}

// refuseGone answers a call whose sandbox lost its instance: paused
// meanwhile (the caller wakes it), or stopping.
func (gc guestCalls) refuseGone(sb *Sandbox) error {
	if now, err := gc.records.GetSandbox(context.Background(), sb.ID); err == nil && now.State.Paused() {
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

// wakeForCall wakes a paused sandbox whose autoWake is on for a guest call
// and waits until it runs or is paused again (the wake failed, or another
// pause came first); the caller looks again.
func (gc guestCalls) wakeForCall(ctx context.Context, owner string, sb *Sandbox) error {
	if sb.State == StatePaused {
		if _, err := gc.host.wake(ctx, sb.ID, nil); err != nil {
			return err
		}
	}
	wctx, cancel := context.WithTimeout(ctx, pauseTimeout+gc.bootTimeout)
	defer cancel()
	if _, err := gc.host.WaitFor(wctx, owner, sb.ID, StateRunning, StatePaused); err != nil {
		return err
	}
	return ctx.Err()
}
