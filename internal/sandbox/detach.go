package sandbox

import (
	"context"
	"time"
)

// detachTimeout bounds the wait for the agent's answer to a detach.
const detachTimeout = 5 * time.Second

// detach ends the instance's guest session from the agent's side before
// its memory is saved (a pause, a memory snapshot): the saved agent then
// waits for a Hello, and the guest restored from it answers the next
// connection at once. A guest that does not answer in time is saved as it
// is; the host's repeated Hello still reaches it, later.
func (l guestLink) detach(ctx context.Context, in *instance) {
	in.mu.Lock()
	c := in.client
	in.client = nil
	in.mu.Unlock()
	if c == nil {
		return
	}
	in.detached.Store(true)
	ctx, cancel := context.WithTimeout(ctx, detachTimeout)
	defer cancel()
	if err := c.Detach(ctx); err != nil {
		l.conduct.warn(in, "detaching from the guest before saving it", "err", err)
	}
}
