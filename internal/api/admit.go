package api

import (
	"context"
	"net/http"
	"strings"
)

// Admit returns the gate a cluster's entry node runs on a request before
// it forwards it to the node that serves it (internal/cluster): the key of
// a Runtime API route is authenticated, and the request counted against
// its caller's buckets, here, where the client's address is the
// connection's own, so that failed authentications are limited per
// client and not per peer node. It answers in the error shape and
// returns false when the request may not pass. Requests of public routes,
// of no route, and of other protocols (E2B's, previews) pass: they are
// gated where they are served, under the client's address the entry node
// forwards. h must be a handler New returned.
func Admit(h http.Handler) func(w http.ResponseWriter, r *http.Request) bool {
	s, ok := h.(*server)
	if !ok {
		panic("api.Admit: not a handler made by api.New")
	}
	return s.admit
}

func (s *server) admit(w http.ResponseWriter, r *http.Request) bool {
	rt := s.routeOf(r)
	if rt == nil || rt.Public {
		return true
	}
	if err := s.gate(r, rt, &call{}); err != nil {
		rid := newRequestID()
		w.Header().Set("x-request-id", rid)
		s.writeError(w, r.WithContext(context.WithValue(r.Context(), reqInfoKey, &reqInfo{id: rid})), err)
		return false
	}
	return true
}

// routeOf is the table route that would serve r, or nil: the mux's group
// for its path, then the verb after the last ':' of its last segment and
// the method, as group.ServeHTTP picks it.
func (s *server) routeOf(r *http.Request) *route {
	if !strings.HasPrefix(r.URL.Path, "/v1/") {
		return nil
	}
	h, _ := s.mux.Handler(r)
	g, ok := h.(*group)
	if !ok {
		return nil
	}
	verb := ""
	if g.wild != "" {
		last := r.URL.Path[strings.LastIndexByte(r.URL.Path, '/')+1:]
		if i := strings.LastIndexByte(last, ':'); i >= 0 {
			verb = last[i+1:]
		}
	}
	methods := g.ops[verb]
	rt := methods[r.Method]
	if rt == nil && r.Method == http.MethodHead {
		rt = methods[http.MethodGet]
	}
	return rt
}
