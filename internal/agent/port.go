package agent

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"github.com/hashicorp/yamux"

	"github.com/emberbox/emberbox/internal/agentproto"
)

// maxPortConns bounds the port.connect streams the agent carries at once.
// The host bounds them per sandbox too; this keeps a confused host from
// spending the guest's descriptors.
const maxPortConns = 256

// portDialTimeout bounds the connect to a loopback port: it answers at once
// unless the listener's backlog is full.
const portDialTimeout = 10 * time.Second

// portSlots counts the port.connect streams being carried.
var portSlots = make(chan struct{}, maxPortConns)

// connectPort serves a port.connect stream: it connects to the port on the
// loopback, answers, and then carries bytes both ways until both sides
// have ended. A program listening on 127.0.0.1, ::1, 0.0.0.0 or :: is
// reached.
func (a *Agent) connectPort(ctx context.Context, c *agentproto.Conn, st *yamux.Stream, req *agentproto.PortRequest) {
	refuse := func(format string, args ...any) {
		_ = c.WriteJSON(agentproto.Reply{Error: &agentproto.Error{Code: agentproto.CodePortRefused, Message: fmt.Sprintf(format, args...)}})
	}
	if req == nil || req.Port < 1 || req.Port > 65535 {
		_ = c.WriteJSON(agentproto.Reply{Error: &agentproto.Error{Code: agentproto.CodeInvalid, Message: "port.connect: port must be 1 to 65535"}})
		return
	}
	select {
	case portSlots <- struct{}{}:
		defer func() { <-portSlots }()
	default:
		refuse("too many connections to guest ports at once (%d)", maxPortConns)
		return
	}
	conn, err := dialLoopback(ctx, req.Port)
	if err != nil {
		refuse("nothing accepts connections on port %d in the sandbox", req.Port)
		return
	}
	defer conn.Close()
	if err := c.WriteJSON(agentproto.Reply{OK: true}); err != nil {
		return
	}
	splice(conn, st, c.Reader())
}

// dialLoopback connects to port on the IPv4 loopback, then the IPv6 one.
func dialLoopback(ctx context.Context, port int) (net.Conn, error) {
	d := net.Dialer{Timeout: portDialTimeout}
	conn, err := d.DialContext(ctx, "tcp4", fmt.Sprintf("127.0.0.1:%d", port))
	if err == nil {
		return conn, nil
	}
	if c6, err6 := d.DialContext(ctx, "tcp6", fmt.Sprintf("[::1]:%d", port)); err6 == nil {
		return c6, nil
	}
	return nil, err
}

// splice carries bytes between a TCP connection and a stream (whose first
// bytes may already sit in br) until both directions have ended. The end
// of one direction is passed on as a half-close, so request/response
// protocols that close their sending side still get their answer.
func splice(conn net.Conn, st *yamux.Stream, br *bufio.Reader) {
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		_, err := io.Copy(conn, br)
		if tc, ok := conn.(*net.TCPConn); ok && err == nil {
			_ = tc.CloseWrite()
			return
		}
		// The stream failed (the host went away): end the connection.
		_ = conn.Close()
	}()
	_, err := io.Copy(st, conn)
	// Closing a yamux stream half-closes it: the host reads EOF.
	_ = st.Close()
	if err != nil && !errors.Is(err, net.ErrClosed) {
		_ = conn.Close()
	}
	wg.Wait()
}
