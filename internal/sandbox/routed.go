package sandbox

import (
	"context"

	"github.com/emberbox/emberbox/internal/guest"
)

// Routed is the running sandbox a request was routed to by something other
// than the Runtime API's own paths (E2B's sandbox URL, where the sandbox is
// named by headers or the host name): its record and its guest. The router
// authenticates the request and resolves the sandbox (Manager.Guest) before
// it hands the request to a handler that reads it with RoutedFrom.
type Routed struct {
	Sandbox *Sandbox
	Guest   guest.Handle
	// Home, if set, is the sandbox user's home as the router's protocol
	// lays the sandbox out (E2B's /home/user): a command's default cwd
	// and $HOME, and what relative paths are under. "" keeps the guest's.
	Home string
}

type routedKey struct{}

// WithRouted returns ctx carrying r.
func WithRouted(ctx context.Context, r Routed) context.Context {
	return context.WithValue(ctx, routedKey{}, r)
}

// RoutedFrom returns the sandbox a request was routed to, if any.
func RoutedFrom(ctx context.Context) (Routed, bool) {
	r, ok := ctx.Value(routedKey{}).(Routed)
	return r, ok && r.Guest.Valid() && r.Sandbox != nil
}
