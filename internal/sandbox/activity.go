package sandbox

import (
	"context"
	"net"
	"sync/atomic"
	"time"

	"github.com/emberbox/emberbox/internal/guest"
)

// activeGuest is a running sandbox's guest whose port connections (the
// tunnel, previews) count as API activity for as long as bytes flow over
// them, not only when they open: an idle pause must not cut a terminal-
// less dev server that someone is using through a preview.
type activeGuest struct {
	*guest.Client
	touch func()
}

// DialPort implements guest.PortDialer.
func (g activeGuest) DialPort(ctx context.Context, port int) (net.Conn, error) {
	c, err := g.Client.DialPort(ctx, port)
	if err != nil {
		return nil, err
	}
	return &activeConn{Conn: c, touch: g.touch}, nil
}

// activeConn marks its sandbox active on traffic, at most once a second.
type activeConn struct {
	net.Conn
	touch func()
	last  atomic.Int64 // unix seconds of the last mark
}

func (c *activeConn) mark() {
	now := time.Now().Unix()
	if last := c.last.Load(); now != last && c.last.CompareAndSwap(last, now) {
		c.touch()
	}
}

func (c *activeConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 {
		c.mark()
	}
	return n, err
}

func (c *activeConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	if n > 0 {
		c.mark()
	}
	return n, err
}

// CloseWrite half-closes the connection, as the guest's does.
func (c *activeConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return c.Conn.Close()
}

// clientOf returns the guest client behind g.
func clientOf(h guest.Handle) (*guest.Client, bool) {
	switch g := h.ProcessRunner.(type) {
	case *guest.Client:
		return g, true
	case activeGuest:
		return g.Client, true
	}
	return nil, false
}
