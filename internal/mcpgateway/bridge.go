package mcpgateway

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"sync"
)

// ProtocolVersion is what the gateway asks a server for; the server may
// answer an older one, which clients then get.
const ProtocolVersion = "2025-06-18"

// message is a JSON-RPC 2.0 message: a request (Method and ID), a
// notification (Method alone) or a response (ID alone).
type message struct {
	JSONRPC string          `json:"jsonrpc"`
	ID      json.RawMessage `json:"id,omitempty"`
	Method  string          `json:"method,omitempty"`
	Params  json.RawMessage `json:"params,omitempty"`
	Result  json.RawMessage `json:"result,omitempty"`
	Error   *rpcError       `json:"error,omitempty"`
}

type rpcError struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}

// JSON-RPC error codes the gateway answers with.
const (
	codeParse          = -32700
	codeInvalid        = -32600
	codeMethodNotFound = -32601
	codeServer         = -32000 // the server is not running, or ended
)

func (m *message) isRequest() bool      { return m.Method != "" && len(m.ID) > 0 }
func (m *message) isNotification() bool { return m.Method != "" && len(m.ID) == 0 }

// errorReply is the answer to request id that failed with code.
func errorReply(id json.RawMessage, code int, format string, args ...any) *message {
	if len(id) == 0 {
		id = json.RawMessage("null")
	}
	return &message{JSONRPC: "2.0", ID: id, Error: &rpcError{Code: code, Message: fmt.Sprintf(format, args...)}}
}

// errEnded is a call to a server whose stdout has ended.
var errEnded = errors.New("the server ended")

// bridge carries the JSON-RPC of many HTTP clients over one server's
// stdio. Each request gets an id of the bridge's own, so the ids of two
// clients never meet; the answer goes back under the client's id.
type bridge struct {
	w   io.Writer
	wmu sync.Mutex // one line at a time

	mu      sync.Mutex
	next    int64
	pending map[int64]chan *message
	ended   chan struct{} // closed when the server's stdout ends
}

func newBridge(w io.Writer) *bridge {
	return &bridge{w: w, pending: map[int64]chan *message{}, ended: make(chan struct{})}
}

// send writes one message as a line.
func (b *bridge) send(m *message) error {
	line, err := json.Marshal(m)
	if err != nil {
		return err
	}
	b.wmu.Lock()
	defer b.wmu.Unlock()
	_, err = b.w.Write(append(line, '\n'))
	return err
}

// call sends request m and waits for its answer, which carries m's id.
func (b *bridge) call(ctx context.Context, m *message) (*message, error) {
	ch := make(chan *message, 1)
	b.mu.Lock()
	select {
	case <-b.ended:
		b.mu.Unlock()
		return nil, errEnded
	default:
	}
	b.next++
	id := b.next
	b.pending[id] = ch
	b.mu.Unlock()
	defer func() {
		b.mu.Lock()
		delete(b.pending, id)
		b.mu.Unlock()
	}()

	out := *m
	out.JSONRPC = "2.0"
	out.ID = json.RawMessage(strconv.FormatInt(id, 10))
	if err := b.send(&out); err != nil {
		return nil, fmt.Errorf("writing to the server: %w", err)
	}
	select {
	case r := <-ch:
		r.ID = m.ID
		return r, nil
	case <-b.ended:
		return nil, errEnded
	case <-ctx.Done():
		// The server may still answer; the answer is dropped. Tell it.
		params, _ := json.Marshal(map[string]any{"requestId": id, "reason": "the client went away"})
		_ = b.send(&message{JSONRPC: "2.0", Method: "notifications/cancelled", Params: params})
		return nil, ctx.Err()
	}
}

// read delivers the server's messages until its stdout ends: answers to
// their callers; its own requests answered here (the gateway offers a
// server no client capabilities); its notifications dropped.
func (b *bridge) read(r io.Reader) error {
	defer func() {
		b.mu.Lock()
		close(b.ended)
		b.mu.Unlock()
	}()
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), maxMessage)
	for sc.Scan() {
		line := bytes.TrimSpace(sc.Bytes())
		if len(line) == 0 {
			continue
		}
		var m message
		if err := json.Unmarshal(line, &m); err != nil {
			continue // not JSON-RPC: a server that prints to stdout
		}
		switch {
		case m.isRequest():
			if m.Method == "ping" {
				_ = b.send(&message{JSONRPC: "2.0", ID: m.ID, Result: json.RawMessage("{}")})
			} else {
				_ = b.send(errorReply(m.ID, codeMethodNotFound, "the gateway's clients offer no %s", m.Method))
			}
		case m.Method != "":
			// A notification: logging, progress, list changes.
		default:
			id, err := strconv.ParseInt(string(m.ID), 10, 64)
			if err != nil {
				continue
			}
			b.mu.Lock()
			ch := b.pending[id]
			b.mu.Unlock()
			if ch != nil {
				select {
				case ch <- &m:
				default: // a second answer to one request
				}
			}
		}
	}
	return sc.Err()
}

// initialize does the MCP handshake for every client to come and returns
// the server's answer.
func (b *bridge) initialize(ctx context.Context) (json.RawMessage, error) {
	params, _ := json.Marshal(map[string]any{
		"protocolVersion": ProtocolVersion,
		"capabilities":    map[string]any{},
		"clientInfo":      map[string]any{"name": "emberbox-mcp-gateway", "version": "1"},
	})
	r, err := b.call(ctx, &message{Method: "initialize", ID: json.RawMessage("0"), Params: params})
	if err != nil {
		return nil, err
	}
	if r.Error != nil {
		return nil, fmt.Errorf("initialize: %s (%d)", r.Error.Message, r.Error.Code)
	}
	if len(r.Result) == 0 {
		return nil, errors.New("initialize: an empty answer")
	}
	if err := b.send(&message{JSONRPC: "2.0", Method: "notifications/initialized"}); err != nil {
		return nil, err
	}
	return r.Result, nil
}
