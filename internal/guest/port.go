package guest

import (
	"context"
	"net"
	"sync"
	"time"

	"github.com/hashicorp/yamux"

	"github.com/emberbox/emberbox/internal/agentproto"
	"github.com/emberbox/emberbox/internal/errdefs"
)

// MaxPortConns bounds the connections to guest ports (DialPort) one
// sandbox carries at once, tunnels and previews together. Each holds at
// most MaxWindow of what the guest sent and the host has not read yet.
const MaxPortConns = 128

// DialPort connects to TCP port on the guest's loopback over a stream of
// the session: no network card is involved. The connection's Close ends
// the stream; CloseWrite half-closes it. ctx bounds the connect only.
func (c *Client) DialPort(ctx context.Context, port int) (net.Conn, error) {
	if port < 1 || port > 65535 {
		return nil, errdefs.New(errdefs.ErrInvalidArgument, "invalid_request", "port must be 1 to 65535")
	}
	select {
	case c.ports <- struct{}{}:
	default:
		return nil, errdefs.New(errdefs.ErrUnavailable, "too_many_connections",
			"the sandbox already carries %d connections to its ports", MaxPortConns).
			WithHint("close some connections, or retry later")
	}
	conn, err := c.dialPort(ctx, port)
	if err != nil {
		<-c.ports
		return nil, err
	}
	return conn, nil
}

func (c *Client) dialPort(ctx context.Context, port int) (net.Conn, error) {
	const method = agentproto.MethodPortConnect
	st, err := c.sess.OpenStream()
	if err != nil {
		return nil, c.unreachable()
	}
	stop := context.AfterFunc(ctx, func() { _ = st.SetDeadline(time.Unix(1, 0)) })
	fc := agentproto.NewConn(st)
	fail := func(err error) (net.Conn, error) {
		stop()
		_ = st.SetDeadline(time.Unix(1, 0))
		_ = st.Close()
		return nil, err
	}
	if err := fc.WriteJSON(&agentproto.Request{Method: method, Port: &agentproto.PortRequest{Port: port}}); err != nil {
		return fail(c.lost(ctx))
	}
	var rep agentproto.Reply
	if err := c.readJSON(ctx, fc, method, ordinaryReply, &rep); err != nil {
		return fail(err)
	}
	if rep.Error != nil {
		if rep.Error.Code == agentproto.CodePortRefused {
			return fail(errdefs.New(errdefs.ErrUnavailable, agentproto.CodePortRefused, "%s", guestText(rep.Error.Message)).
				WithHint("start a server listening on that port in the sandbox (0.0.0.0 or localhost)"))
		}
		return fail(wireError(rep.Error))
	}
	if !rep.OK {
		return fail(c.missing(method, "ok"))
	}
	if !stop() {
		return fail(c.lost(ctx))
	}
	// The guest's first bytes may have come with the reply, into fc's
	// buffer: the connection reads through it.
	return &portConn{Stream: st, r: fc.Reader(), release: func() { <-c.ports }}, nil
}

// portConn is a connection to a guest port: a yamux stream whose first
// bytes may sit in the framing reader's buffer.
type portConn struct {
	*yamux.Stream
	r       interface{ Read([]byte) (int, error) }
	once    sync.Once
	release func()
}

func (p *portConn) Read(b []byte) (int, error) { return p.r.Read(b) }

// CloseWrite half-closes the connection: the guest program reads EOF.
func (p *portConn) CloseWrite() error { return p.Stream.Close() }

// Close ends the connection at once: reads and writes in flight fail.
func (p *portConn) Close() error {
	p.once.Do(func() {
		_ = p.Stream.SetDeadline(time.Unix(1, 0))
		_ = p.Stream.Close()
		p.release()
	})
	return nil
}
