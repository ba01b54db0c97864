package api

import (
	"context"
	"net/http"

	"github.com/emberbox/emberbox/internal/guest"
)

// The skeleton most routes into a guest share, written once: decode and
// check the request, get the guest of the sandbox the path names, make
// one call, answer its result as JSON. Errors go back to serveRoute,
// which answers them in the one error shape, so a route keeps its status
// codes and error codes by returning what it returned before.

// decodeChecked decodes the call's JSON body strictly into a Req and
// checks it: a body that does not decode, or any issue check finds, is a
// 400 invalid_request.
func decodeChecked[Req any](c *call, check func(*Req) []issue) (Req, error) {
	var req Req
	if err := decode(c, &req); err != nil {
		return req, err
	}
	if issues := check(&req); len(issues) > 0 {
		return req, invalid(issues)
	}
	return req, nil
}

// guestJSON gets the guest of the sandbox the path names (or the refusal
// of its state), makes one call into it and answers the result, made
// wire-shaped by toJSON, as JSON with 200.
func guestJSON[T, J any](s *server, w http.ResponseWriter, r *http.Request, c *call,
	call func(ctx context.Context, g guest.Handle) (T, error), toJSON func(T) J) error {
	_, g, err := s.guest(r, c)
	if err != nil {
		return err
	}
	v, err := call(r.Context(), g)
	return reply(w, v, err, toJSON)
}
