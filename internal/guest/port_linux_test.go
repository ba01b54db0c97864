package guest_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/emberbox/emberbox/internal/agentproto"
	"github.com/emberbox/emberbox/internal/errdefs"
	"github.com/emberbox/emberbox/internal/guest"
)

// echoServer listens on the loopback (the in-process agent's "guest") and
// echoes each connection until its writer half-closes, then closes.
func echoServer(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_, _ = io.Copy(c, c)
			}()
		}
	}()
	return l.Addr().(*net.TCPAddr).Port
}

func TestDialPortEchoesAndHalfCloses(t *testing.T) {
	c, _ := newPair(t)
	port := echoServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := c.DialPort(ctx, port)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	// More than a window each way, to cross yamux's flow control.
	want := make([]byte, 3<<20)
	_, _ = rand.Read(want)
	go func() {
		_, _ = conn.Write(want)
		_ = conn.(interface{ CloseWrite() error }).CloseWrite()
	}()
	got, err := io.ReadAll(conn)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("echoed %d bytes, want the %d sent", len(got), len(want))
	}
}

func TestDialPortRefusals(t *testing.T) {
	c, _ := newPair(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	l, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := l.Addr().(*net.TCPAddr).Port
	l.Close()
	_, err = c.DialPort(ctx, closed)
	if errdefs.Code(err) != agentproto.CodePortRefused || !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("closed port: %v, want port_refused", err)
	}
	for _, p := range []int{0, -1, 65536} {
		if _, err := c.DialPort(ctx, p); !errdefs.IsInvalidArgument(err) {
			t.Errorf("port %d: %v, want invalid", p, err)
		}
	}
}

func TestDialPortBoundsConnections(t *testing.T) {
	c, _ := newPair(t)
	port := echoServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var conns []net.Conn
	for range guest.MaxPortConns {
		conn, err := c.DialPort(ctx, port)
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, conn)
	}
	if _, err := c.DialPort(ctx, port); errdefs.Code(err) != "too_many_connections" {
		t.Fatalf("connection %d: %v, want too_many_connections", guest.MaxPortConns+1, err)
	}
	conns[0].Close()
	conn, err := c.DialPort(ctx, port)
	if err != nil {
		t.Fatalf("after one closed: %v", err)
	}
	conn.Close()
	for _, c := range conns[1:] {
		c.Close()
	}
}
