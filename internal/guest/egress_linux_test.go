package guest_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/yamux"

	"github.com/emberbox/emberbox/internal/agentproto"
	"github.com/emberbox/emberbox/internal/guest"
)

// fakeEgress is an EgressHandler made of functions; a method whose function
// is nil counts an unexpected call.
type fakeEgress struct {
	proxy      func(ctx context.Context, c net.Conn, br *bufio.Reader)
	dns        func(ctx context.Context, q []byte) []byte
	tcp        func(ctx context.Context, dst netip.AddrPort, c net.Conn, br *bufio.Reader, accept func(error) error)
	unexpected atomic.Int32
}

func (f *fakeEgress) ServeProxy(ctx context.Context, c net.Conn, br *bufio.Reader) {
	if f.proxy == nil {
		f.unexpected.Add(1)
		return
	}
	f.proxy(ctx, c, br)
}

func (f *fakeEgress) AnswerDNS(ctx context.Context, q []byte) []byte {
	if f.dns == nil {
		f.unexpected.Add(1)
		return nil
	}
	return f.dns(ctx, q)
}

func (f *fakeEgress) ServeTCP(ctx context.Context, dst netip.AddrPort, c net.Conn, br *bufio.Reader, accept func(error) error) {
	if f.tcp == nil {
		f.unexpected.Add(1)
		return
	}
	f.tcp(ctx, dst, c, br, accept)
}

// openEgress opens a stream from the guest and writes req followed, in the
// same write, by extra bytes.
func openEgress(t *testing.T, sess *yamux.Session, req agentproto.Request, extra []byte) (*yamux.Stream, *agentproto.Conn) {
	t.Helper()
	st, err := sess.OpenStream()
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := agentproto.NewConn(&buf).WriteJSON(req); err != nil {
		t.Fatal(err)
	}
	buf.Write(extra)
	if _, err := st.Write(buf.Bytes()); err != nil {
		t.Fatal(err)
	}
	_ = st.SetDeadline(time.Now().Add(10 * time.Second))
	t.Cleanup(func() { st.Close() })
	return st, agentproto.NewConn(st)
}

func readReply(t *testing.T, fc *agentproto.Conn) agentproto.Reply {
	t.Helper()
	var rep agentproto.Reply
	if err := fc.ReadJSON(&rep); err != nil {
		t.Fatalf("reading the reply: %v", err)
	}
	return rep
}

// Bytes the guest sent right after the request reach the handler.
func TestEgressProxy(t *testing.T) {
	c, sess := newFakeGuest(t)
	c.ServeGuestStreams(&fakeEgress{proxy: func(_ context.Context, conn net.Conn, br *bufio.Reader) {
		line, err := br.ReadString('\n')
		if err != nil {
			return
		}
		_, _ = io.WriteString(conn, "got "+line)
	}})
	st, _ := openEgress(t, sess, agentproto.Request{Method: agentproto.MethodEgressProxy}, []byte("CONNECT example.com:443\n"))
	got, err := bufio.NewReader(st).ReadString('\n')
	if err != nil || got != "got CONNECT example.com:443\n" {
		t.Errorf("got %q, %v", got, err)
	}
}

func TestEgressDNS(t *testing.T) {
	c, sess := newFakeGuest(t)
	var calls atomic.Int32
	h := &fakeEgress{dns: func(_ context.Context, q []byte) []byte {
		calls.Add(1)
		if string(q) == "no answer" {
			return nil
		}
		return append([]byte("answer to "), q...)
	}}
	c.ServeGuestStreams(h)
	exchange := func(q []byte) (byte, []byte, error) {
		_, fc := openEgress(t, sess, agentproto.Request{Method: agentproto.MethodEgressDNS}, nil)
		if err := fc.WriteFrame(agentproto.KindData, q); err != nil {
			return 0, nil, err
		}
		return fc.ReadFrame()
	}
	if kind, a, err := exchange([]byte("q1")); err != nil || kind != agentproto.KindData || string(a) != "answer to q1" {
		t.Errorf("answer %c %q %v", kind, a, err)
	}
	if kind, a, err := exchange([]byte("no answer")); err != nil || kind != agentproto.KindData || len(a) != 0 {
		t.Errorf("no answer: %c %q %v, want an empty data frame", kind, a, err)
	}
	if _, a, err := exchange(make([]byte, guest.MaxDNSMessage)); err != nil || len(a) != len("answer to ")+guest.MaxDNSMessage {
		t.Errorf("largest query: %d bytes, %v", len(a), err)
	}

	// A query longer than any DNS message, or not in a data frame, is
	// dropped without reaching the handler.
	st, fc := openEgress(t, sess, agentproto.Request{Method: agentproto.MethodEgressDNS}, nil)
	_ = fc.WriteFrame(agentproto.KindData, make([]byte, guest.MaxDNSMessage+1))
	if !closedSoon(st, 5*time.Second) {
		t.Error("an oversized query was not refused")
	}
	st, fc = openEgress(t, sess, agentproto.Request{Method: agentproto.MethodEgressDNS}, nil)
	_ = fc.WriteJSON(map[string]string{"query": "x"})
	if !closedSoon(st, 5*time.Second) {
		t.Error("a JSON frame as query was not refused")
	}
	if n := calls.Load(); n != 3 {
		t.Errorf("the handler answered %d queries, want the 3 accepted", n)
	}
}

func TestEgressTCP(t *testing.T) {
	c, sess := newFakeGuest(t)
	var gotDst atomic.Value
	c.ServeGuestStreams(&fakeEgress{tcp: func(_ context.Context, dst netip.AddrPort, conn net.Conn, br *bufio.Reader, accept func(error) error) {
		gotDst.Store(dst)
		var err error
		switch dst.Port() {
		case 1:
			err = fmt.Errorf("checking: %w", &guest.RefusedError{Reason: "rule-not-allowed"})
		case 2:
			err = errors.New("dial tcp 10.1.2.3:2: connect: connection refused")
		}
		if accept(err) != nil || err != nil {
			return
		}
		line, _ := br.ReadString('\n')
		_, _ = io.WriteString(conn, "pong "+line)
	}})
	tcp := func(addr string) (*yamux.Stream, *agentproto.Conn) {
		return openEgress(t, sess, agentproto.Request{Method: agentproto.MethodEgressTCP, Egress: &agentproto.EgressRequest{Addr: addr}}, []byte("ping\n"))
	}

	_, fc := tcp("[2001:db8::1]:443")
	if rep := readReply(t, fc); !rep.OK || rep.Error != nil {
		t.Fatalf("accepted: %+v", rep)
	}
	if got, err := fc.Reader().ReadString('\n'); err != nil || got != "pong ping\n" {
		t.Errorf("relayed %q, %v", got, err)
	}
	if d, _ := gotDst.Load().(netip.AddrPort); d != netip.MustParseAddrPort("[2001:db8::1]:443") {
		t.Errorf("destination %v", d)
	}

	_, fc = tcp("198.19.0.7:1")
	if rep := readReply(t, fc); rep.Error == nil || rep.Error.Code != agentproto.CodeEgressRefused || rep.Error.Message != "rule-not-allowed" {
		t.Errorf("refused: %+v", rep.Error)
	}
	_, fc = tcp("198.19.0.7:2")
	if rep := readReply(t, fc); rep.Error == nil || rep.Error.Code != agentproto.CodeEgressFailed || strings.Contains(rep.Error.Message, "10.1.2.3") {
		t.Errorf("failed: %+v, want egress_failed naming no host address", rep.Error)
	}
}

func TestEgressBadRequests(t *testing.T) {
	c, sess := newFakeGuest(t)
	h := &fakeEgress{}
	c.ServeGuestStreams(h)
	for _, tc := range []struct {
		name string
		req  agentproto.Request
		code string
	}{
		{"no destination", agentproto.Request{Method: agentproto.MethodEgressTCP}, agentproto.CodeInvalid},
		{"not an address", agentproto.Request{Method: agentproto.MethodEgressTCP, Egress: &agentproto.EgressRequest{Addr: "nonsense"}}, agentproto.CodeInvalid},
		{"a name", agentproto.Request{Method: agentproto.MethodEgressTCP, Egress: &agentproto.EgressRequest{Addr: "example.com:80"}}, agentproto.CodeInvalid},
		{"no port", agentproto.Request{Method: agentproto.MethodEgressTCP, Egress: &agentproto.EgressRequest{Addr: "192.0.2.1"}}, agentproto.CodeInvalid},
		{"port 0", agentproto.Request{Method: agentproto.MethodEgressTCP, Egress: &agentproto.EgressRequest{Addr: "192.0.2.1:0"}}, agentproto.CodeInvalid},
		{"zone", agentproto.Request{Method: agentproto.MethodEgressTCP, Egress: &agentproto.EgressRequest{Addr: "[fe80::1%eth0]:80"}}, agentproto.CodeInvalid},
		{"unknown method", agentproto.Request{Method: "egress.udp"}, agentproto.CodeUnknownMethod},
		{"a host call", agentproto.Request{Method: agentproto.MethodExec, Exec: &agentproto.ExecRequest{Command: "true"}}, agentproto.CodeUnknownMethod},
	} {
		_, fc := openEgress(t, sess, tc.req, nil)
		if rep := readReply(t, fc); rep.Error == nil || rep.Error.Code != tc.code {
			t.Errorf("%s: %+v, want %s", tc.name, rep, tc.code)
		}
	}
	if n := h.unexpected.Load(); n != 0 {
		t.Errorf("the handler was called %d times for bad requests", n)
	}
}

// A handler's context ends with the session, so its work does not outlive
// the guest connection.
func TestEgressContextEndsWithSession(t *testing.T) {
	c, sess := newFakeGuest(t)
	started, ended := make(chan struct{}), make(chan struct{})
	c.ServeGuestStreams(&fakeEgress{proxy: func(ctx context.Context, _ net.Conn, _ *bufio.Reader) {
		close(started)
		<-ctx.Done()
		close(ended)
	}})
	openEgress(t, sess, agentproto.Request{Method: agentproto.MethodEgressProxy}, nil)
	select {
	case <-started:
	case <-time.After(5 * time.Second):
		t.Fatal("handler not called")
	}
	c.Close()
	select {
	case <-ended:
	case <-time.After(5 * time.Second):
		t.Fatal("the handler's context did not end with the session")
	}
}
