package mcpgateway

import (
	"bytes"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
)

// ServeHTTP serves MCP's streamable HTTP transport at /mcp/<id>: a POST
// carries one JSON-RPC message (or a batch); requests are answered with
// application/json, notifications and responses with 202. The gateway
// opens no server-to-client stream (GET answers 405), which the transport
// allows, and keeps no sessions.
func (g *Gateway) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if g.cfg.Key != "" && subtle.ConstantTimeCompare([]byte(r.Header.Get(KeyHeader)), []byte(g.cfg.Key)) != 1 {
		httpError(w, http.StatusUnauthorized, "this gateway needs its key in the "+KeyHeader+" header")
		return
	}
	id, ok := strings.CutPrefix(r.URL.Path, "/mcp/")
	id = strings.TrimSuffix(id, "/")
	s := g.servers[id]
	if !ok || s == nil {
		httpError(w, http.StatusNotFound, "no MCP server at "+r.URL.Path+"; the gateway serves /mcp/<id>")
		return
	}
	if r.Method != http.MethodPost {
		// No stream to open (GET) and no session to end (DELETE).
		w.Header().Set("Allow", "POST")
		httpError(w, http.StatusMethodNotAllowed, "this gateway answers POST only")
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxRequest))
	if err != nil {
		httpError(w, http.StatusRequestEntityTooLarge, "a message is at most 4 MiB")
		return
	}
	body = bytes.TrimSpace(body)
	if len(body) > 0 && body[0] == '[' {
		g.serveBatch(w, r, s, body)
		return
	}
	var m message
	if err := json.Unmarshal(body, &m); err != nil {
		writeMessage(w, http.StatusBadRequest, errorReply(nil, codeParse, "not a JSON-RPC message: %v", err))
		return
	}
	reply, status := g.handle(r, s, &m)
	if reply == nil {
		w.WriteHeader(http.StatusAccepted)
		return
	}
	writeMessage(w, status, reply)
}

// serveBatch answers a batch (protocol 2025-03-26) message by message.
func (g *Gateway) serveBatch(w http.ResponseWriter, r *http.Request, s *server, body []byte) {
	var batch []message
	if err := json.Unmarshal(body, &batch); err != nil || len(batch) == 0 || len(batch) > 100 {
		writeMessage(w, http.StatusBadRequest, errorReply(nil, codeInvalid, "a batch is 1 to 100 JSON-RPC messages"))
		return
	}
	var replies []*message
	for i := range batch {
		if reply, _ := g.handle(r, s, &batch[i]); reply != nil {
			replies = append(replies, reply)
		}
	}
	if len(replies) == 0 {
		w.WriteHeader(http.StatusAccepted)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(replies)
}

// handle answers one message of a client: nil for none (202).
func (g *Gateway) handle(r *http.Request, s *server, m *message) (*message, int) {
	b, init, state := s.ready()
	switch {
	case m.Method == "" || m.Method == "notifications/initialized":
		// A response (the gateway asks clients nothing), or the end of
		// a handshake the gateway did for every client.
		return nil, 0
	case b == nil || state != StateRunning:
		if !m.isRequest() {
			return nil, 0
		}
		return errorReply(m.ID, codeServer, "the MCP server %s is %s", s.spec.ID, state), http.StatusServiceUnavailable
	case m.isNotification():
		_ = b.send(&message{JSONRPC: "2.0", Method: m.Method, Params: m.Params})
		return nil, 0
	case m.Method == "initialize":
		return &message{JSONRPC: "2.0", ID: m.ID, Result: init}, http.StatusOK
	case m.Method == "ping":
		return &message{JSONRPC: "2.0", ID: m.ID, Result: json.RawMessage("{}")}, http.StatusOK
	}
	reply, err := b.call(r.Context(), m)
	switch {
	case errors.Is(err, errEnded):
		return errorReply(m.ID, codeServer, "the MCP server %s ended", s.spec.ID), http.StatusBadGateway
	case err != nil:
		return errorReply(m.ID, codeServer, "%v", err), http.StatusBadGateway
	}
	return reply, http.StatusOK
}

func writeMessage(w http.ResponseWriter, status int, m *message) {
	m.JSONRPC = "2.0"
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(m)
}

func httpError(w http.ResponseWriter, status int, text string) {
	writeMessage(w, status, errorReply(nil, codeInvalid, "%s", text))
}
