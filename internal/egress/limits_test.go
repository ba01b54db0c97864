package egress

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"testing"
	"time"
)

// endlessConn is a client connection that sends prefix and then an endless
// header line (up to a cap, so that a proxy without a limit fails the test
// rather than hanging it). It records what it was sent.
type endlessConn struct {
	net.Conn // nil: only the methods below are used
	prefix   []byte
	read     int
	cap      int
	out      bytes.Buffer
}

func (c *endlessConn) Read(p []byte) (int, error) {
	if c.read >= c.cap {
		return 0, io.EOF
	}
	p = p[:min(len(p), c.cap-c.read)]
	n := 0
	if c.read < len(c.prefix) {
		n = copy(p, c.prefix[c.read:])
	}
	for i := n; i < len(p); i++ {
		p[i] = 'a'
	}
	c.read += len(p)
	return len(p), nil
}

func (c *endlessConn) Write(p []byte) (int, error)      { return c.out.Write(p) }
func (c *endlessConn) Close() error                     { return nil }
func (c *endlessConn) SetDeadline(time.Time) error      { return nil }
func (c *endlessConn) SetReadDeadline(time.Time) error  { return nil }
func (c *endlessConn) SetWriteDeadline(time.Time) error { return nil }
func (c *endlessConn) LocalAddr() net.Addr              { return &net.TCPAddr{} }
func (c *endlessConn) RemoteAddr() net.Addr             { return &net.TCPAddr{} }

func TestProxyRequestHeaderLimit(t *testing.T) {
	for _, prefix := range []string{
		"GET http://good.test/ HTTP/1.1\r\nHost: good.test\r\nX-Long: ", // endless header line
		"GET http://good.test/", // endless request line
	} {
		env := newTestEnv(t, Policy{Internet: true}, map[string]string{"good.test": "127.0.0.1"})
		c := &endlessConn{prefix: []byte(prefix), cap: 16 << 20}
		done := make(chan struct{})
		go func() { env.gate.ServeProxy(context.Background(), c, nil); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Fatal("ServeProxy still reading an endless header")
		}
		// The limit plus what one fill of the buffer may take beyond it.
		if c.read > MaxHeaderBytes+8<<10 {
			t.Errorf("%q: read %d bytes of an endless header, want at most about %d", prefix, c.read, MaxHeaderBytes)
		}
		if !strings.HasPrefix(c.out.String(), "HTTP/1.1 431 ") {
			t.Errorf("%q: answered %q, want 431", prefix, c.out.String())
		}
		if env.dials.Load() != 0 {
			t.Errorf("%q: the proxy dialed", prefix)
		}
	}
}

func TestProxyResponseHeaderLimit(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				buf := make([]byte, 4096)
				_, _ = c.Read(buf) // the request
				_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nX-Long: ")
				line := bytes.Repeat([]byte{'a'}, 32<<10)
				for range 512 { // 16 MiB, unless the proxy hangs up
					if _, err := c.Write(line); err != nil {
						return
					}
				}
			}()
		}
	}()
	env := newTestEnv(t, Policy{Internet: true}, map[string]string{"good.test": "127.0.0.1"})
	_, p, _ := net.SplitHostPort(ln.Addr().String())
	resp, err := env.client(nil).Get(fmt.Sprintf("http://good.test:%s/", p))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadGateway || !strings.Contains(string(body), "header larger") {
		t.Errorf("got %d %q, want 502 for an endless response header", resp.StatusCode, body)
	}
	if n := env.gate.Counters().BytesIn; n > MaxHeaderBytes+8<<10 {
		t.Errorf("read %d bytes of an endless response header, want at most about %d", n, MaxHeaderBytes)
	}
}

func TestSameIP(t *testing.T) {
	tcp := func(s string, port int) net.Addr { return &net.TCPAddr{IP: net.ParseIP(s), Port: port} }
	for _, tc := range []struct {
		local, remote net.Addr
		want          bool
	}{
		{tcp("203.0.113.7", 40000), tcp("203.0.113.7", 443), true},
		{tcp("::ffff:203.0.113.7", 40000), tcp("203.0.113.7", 443), true},
		{tcp("2001:db8::1", 40000), tcp("2001:db8::1", 80), true},
		{tcp("192.0.2.1", 40000), tcp("203.0.113.7", 443), false},
		{tcp("2001:db8::1", 40000), tcp("2001:db8::2", 80), false},
		{&net.UnixAddr{Name: "x", Net: "unix"}, &net.UnixAddr{Name: "x", Net: "unix"}, false},
		{nil, tcp("203.0.113.7", 443), false},
		{(*net.TCPAddr)(nil), (*net.TCPAddr)(nil), false},
	} {
		if got := sameIP(tc.local, tc.remote); got != tc.want {
			t.Errorf("sameIP(%v, %v) = %v, want %v", tc.local, tc.remote, got, tc.want)
		}
	}
}

// A dial that lands on the host itself (both ends of the connection share an
// address) is refused as address-forbidden unless the operator opened it.
func TestDialRefusesSelfConnection(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	port := ln.Addr().(*net.TCPAddr).Port
	// 198.51.100.1 stands for a public address added to the host after
	// startup: the dialer really lands on 127.0.0.1 from 127.0.0.1.
	d := &net.Dialer{}
	op := NewOperator(Operator{
		HostAddrs: []netip.Addr{},
		Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
			return d.DialContext(ctx, network, ln.Addr().String())
		},
	})
	g := NewGate(op, MustCompile(Policy{Internet: true}))
	defer g.Close()
	nc, err := g.Dial(context.Background(), "198.51.100.1", port)
	if r, ok := AsRefusal(err); !ok || r.Reason != ReasonAddressForbidden {
		if nc != nil {
			nc.Close()
		}
		t.Fatalf("dial landing on the host: %v, want address-forbidden refusal", err)
	}
	if c := g.Counters(); c.Refused != 1 || c.Open != 0 {
		t.Errorf("counters = %+v, want one refusal and nothing open", c)
	}
}
