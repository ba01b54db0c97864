package api

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"

	"github.com/coder/websocket"

	"github.com/emberbox/emberbox/internal/errdefs"
)

// GET /v1/sandboxes/{id}/tunnel carries connections to the sandbox's
// loopback ports over one WebSocket, as withruntime's forward_port speaks
// it (withruntime/_tunnel.py). The server first sends the text message
// {"type":"ready"}; then every binary message is a kind byte, a 32-bit
// big-endian stream number the client picks, and a payload:
//
//	o "tcp <port>"  client: open a connection; server: opened (empty), or
//	                any other kind carrying why not, which ends the stream
//	d bytes         data, both ways
//	e               this side sends no more (half-close), both ways
//	c [why]         the stream is over, both ways
//	a uint64        server: the client's data bytes taken so far (credit)
//
// The client sends at most tunnelWindow data bytes past the last credit;
// the server credits bytes once written into the guest, so a tunnel holds
// at most that much of the client's data. What the guest sends is written
// as it comes: the client buffers per connection.

const (
	tunnelWindow = 1 << 20
	// tunnelMaxMessage bounds a client message: the client's chunks are
	// 64 KiB of data.
	tunnelMaxMessage = 128 << 10
	// tunnelMaxStreams bounds the connections one tunnel has open; the
	// sandbox's own bound (guest.MaxPortConns) applies across tunnels.
	tunnelMaxStreams = 64
	tunnelChunk      = 64 << 10
)

const (
	kindOpen  = 'o'
	kindData  = 'd'
	kindEnd   = 'e'
	kindClose = 'c'
	kindAck   = 'a'
)

func (s sockets) tunnel(w http.ResponseWriter, r *http.Request, c *call) error {
	id := r.PathValue("id")
	// Refusals of the sandbox's state are answered before the upgrade, in
	// the error shape.
	if _, _, err := s.mgr.Guest(r.Context(), c.owner, id); err != nil {
		return err
	}
	if !strings.EqualFold(r.Header.Get("Upgrade"), "websocket") {
		return newError(http.StatusUpgradeRequired, "websocket_required", "The tunnel is a WebSocket.").
			withHint("Open it with a WebSocket client, such as withruntime's sandbox.forward_port(port).")
	}
	ws, err := websocket.Accept(w, r, &websocket.AcceptOptions{Subprotocols: webSocketAccept})
	if err != nil {
		return nil // Accept answered the request
	}
	ws.SetReadLimit(tunnelMaxMessage)
	ctx, cancel := context.WithCancel(context.WithoutCancel(r.Context()))
	defer cancel()
	t := &tunnelConn{s: s.server, ws: ws, owner: c.owner, id: id, ctx: ctx, streams: map[uint32]*tunnelStream{}}
	defer t.closeAll()
	if err := ws.Write(ctx, websocket.MessageText, []byte(`{"type":"ready"}`)); err != nil {
		return nil
	}
	err = t.read()
	var ce websocket.CloseError
	switch {
	case err == nil, errors.As(err, &ce):
		_ = ws.Close(websocket.StatusNormalClosure, "")
	default:
		if ae := toAPIError(err); ae.Status != statusClientClosed {
			msg, _ := json.Marshal(map[string]any{"type": "error", "error": map[string]string{"code": ae.Code, "message": ae.Message}})
			_ = ws.Write(ctx, websocket.MessageText, msg)
		}
		_ = ws.Close(websocket.StatusPolicyViolation, "tunnel ended")
	}
	return nil
}

// tunnelConn is one tunnel WebSocket and its streams.
type tunnelConn struct {
	s         *server
	ws        *websocket.Conn
	owner, id string
	ctx       context.Context

	mu       sync.Mutex
	streams  map[uint32]*tunnelStream
	received uint64 // data bytes the client sent, all streams
	credited uint64 // of which written into the guest or dropped
}

// tunnelStream is one connection carried by a tunnel.
type tunnelStream struct {
	n      uint32
	closed chan struct{}
	once   sync.Once
	wake   chan struct{} // a token when queue or ended changed

	// Guarded by the tunnel's mu.
	conn  net.Conn // set once opened
	queue [][]byte // the client's data not yet written into the guest
	ended bool     // the client sends no more
}

var errTunnelProtocol = errdefs.New(errdefs.ErrInvalidArgument, "tunnel_protocol_error", "the tunnel client broke the protocol")

// read handles the client's messages until the WebSocket ends.
func (t *tunnelConn) read() error {
	for {
		typ, msg, err := t.ws.Read(t.ctx)
		if err != nil {
			return err
		}
		if typ != websocket.MessageBinary {
			continue // the client sends no text; ignore what a newer one might
		}
		if len(msg) < 5 {
			return errTunnelProtocol
		}
		kind, n, payload := msg[0], binary.BigEndian.Uint32(msg[1:5]), msg[5:]
		t.mu.Lock()
		st := t.streams[n]
		t.mu.Unlock()
		switch kind {
		case kindOpen:
			if st != nil {
				return errTunnelProtocol
			}
			t.open(n, string(payload))
		case kindData:
			if err := t.queue(st, payload); err != nil {
				return err
			}
		case kindEnd:
			if st != nil {
				t.mu.Lock()
				st.ended = true
				t.mu.Unlock()
				st.signal()
			}
		case kindClose:
			if st != nil {
				t.end(st, "")
			}
		default:
			return errTunnelProtocol
		}
	}
}

// open starts stream n to the port the payload names, answering "o" or
// a close with the reason.
func (t *tunnelConn) open(n uint32, what string) {
	port, err := strconv.Atoi(strings.TrimPrefix(what, "tcp "))
	if !strings.HasPrefix(what, "tcp ") || err != nil || port < 1 || port > 65535 {
		t.send(kindClose, n, []byte("only tcp <port> with a port of 1 to 65535 can be opened"))
		return
	}
	t.mu.Lock()
	if len(t.streams) >= tunnelMaxStreams {
		t.mu.Unlock()
		t.send(kindClose, n, []byte("this tunnel has "+strconv.Itoa(tunnelMaxStreams)+" connections open already"))
		return
	}
	st := &tunnelStream{n: n, closed: make(chan struct{}), wake: make(chan struct{}, 1)}
	t.streams[n] = st
	t.mu.Unlock()
	go t.carry(st, port)
}

// carry connects stream st and moves its bytes both ways.
func (t *tunnelConn) carry(st *tunnelStream, port int) {
	// Each connection goes through Manager.Guest: it finds the guest
	// after a reconnect, and the stream's context holds the sandbox busy
	// (never idle) until the stream ends.
	ctx, cancel := context.WithCancel(t.ctx)
	defer cancel()
	_, g, err := t.s.mgr.Guest(ctx, t.owner, t.id)
	var conn net.Conn
	if err == nil {
		conn, err = g.DialPort(ctx, port)
	}
	if err != nil {
		t.end(st, toAPIError(err).Message)
		return
	}
	t.mu.Lock()
	select {
	case <-st.closed: // the client closed it meanwhile
		t.mu.Unlock()
		_ = conn.Close()
		return
	default:
		st.conn = conn
	}
	t.mu.Unlock()
	if err := t.send(kindOpen, st.n, nil); err != nil {
		t.end(st, "")
		return
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		t.toGuest(st)
	}()
	buf := make([]byte, tunnelChunk)
	for {
		k, err := conn.Read(buf)
		if k > 0 {
			if t.send(kindData, st.n, buf[:k]) != nil {
				t.end(st, "")
				break
			}
		}
		if err != nil {
			select {
			case <-st.closed:
			default:
				_ = t.send(kindEnd, st.n, nil)
			}
			break
		}
	}
	wg.Wait()
	t.end(st, "")
}

// queue takes data the client sent for stream st (nil: one already over,
// whose bytes are dropped and credited at once).
func (t *tunnelConn) queue(st *tunnelStream, b []byte) error {
	t.mu.Lock()
	t.received += uint64(len(b))
	if t.received-t.credited > tunnelWindow {
		t.mu.Unlock()
		return errTunnelProtocol // the client ignored its credit
	}
	if st == nil || st.ended {
		t.mu.Unlock()
		t.credit(uint64(len(b)))
		return nil
	}
	st.queue = append(st.queue, b)
	t.mu.Unlock()
	st.signal()
	return nil
}

func (st *tunnelStream) signal() {
	select {
	case st.wake <- struct{}{}:
	default:
	}
}

// credit counts n more bytes as taken and tells the client.
func (t *tunnelConn) credit(n uint64) {
	if n == 0 {
		return
	}
	t.mu.Lock()
	t.credited += n
	c := t.credited
	t.mu.Unlock()
	var p [8]byte
	binary.BigEndian.PutUint64(p[:], c)
	_ = t.send(kindAck, 0, p[:])
}

// toGuest writes the client's data into the guest and credits it, until
// the client ends its side or the stream is over.
func (t *tunnelConn) toGuest(st *tunnelStream) {
	for {
		select {
		case <-st.closed:
			return
		case <-st.wake:
		}
		t.mu.Lock()
		q, ended := st.queue, st.ended
		st.queue = nil
		t.mu.Unlock()
		for i, b := range q {
			if _, err := st.conn.Write(b); err != nil {
				var rest uint64
				for _, r := range q[i:] {
					rest += uint64(len(r))
				}
				t.credit(rest)
				t.end(st, "")
				return
			}
			t.credit(uint64(len(b)))
		}
		if ended {
			if cw, ok := st.conn.(interface{ CloseWrite() error }); ok {
				_ = cw.CloseWrite()
			}
			return
		}
	}
}

// end closes stream st once, telling the client; data still queued for
// it is credited.
func (t *tunnelConn) end(st *tunnelStream, why string) {
	st.once.Do(func() {
		close(st.closed)
		t.mu.Lock()
		conn, q := st.conn, st.queue
		st.queue, st.ended = nil, true
		if t.streams[st.n] == st {
			delete(t.streams, st.n)
		}
		t.mu.Unlock()
		if conn != nil {
			_ = conn.Close()
		}
		var rest uint64
		for _, b := range q {
			rest += uint64(len(b))
		}
		t.credit(rest)
		_ = t.send(kindClose, st.n, []byte(why))
	})
}

// send writes one message; coder/websocket serializes concurrent writes.
func (t *tunnelConn) send(kind byte, n uint32, payload []byte) error {
	msg := make([]byte, 5+len(payload))
	msg[0] = kind
	binary.BigEndian.PutUint32(msg[1:5], n)
	copy(msg[5:], payload)
	return t.ws.Write(t.ctx, websocket.MessageBinary, msg)
}

// closeAll ends every stream when the WebSocket is over.
func (t *tunnelConn) closeAll() {
	t.mu.Lock()
	all := make([]*tunnelStream, 0, len(t.streams))
	for _, st := range t.streams {
		all = append(all, st)
	}
	t.mu.Unlock()
	for _, st := range all {
		st.once.Do(func() {
			close(st.closed)
			t.mu.Lock()
			conn := st.conn
			t.mu.Unlock()
			if conn != nil {
				_ = conn.Close()
			}
		})
	}
}
