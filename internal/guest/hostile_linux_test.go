package guest_test

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/yamux"

	"github.com/emberbox/emberbox/internal/agentproto"
	"github.com/emberbox/emberbox/internal/guest"
)

// newFakeGuest handshakes like an agent on one end of a socket pair and
// returns the host's client and the guest's yamux session, for tests of
// guests that misbehave.
func newFakeGuest(t *testing.T) (*guest.Client, *yamux.Session) {
	t.Helper()
	hostEnd, guestEnd := socketPair(t)
	type result struct {
		sess *yamux.Session
		err  error
	}
	done := make(chan result, 1)
	go func() {
		br := bufio.NewReader(guestEnd)
		line, err := br.ReadString('\n')
		if err != nil {
			done <- result{err: err}
			return
		}
		nonce := strings.TrimPrefix(strings.TrimSpace(line), agentproto.HelloPrefix)
		if _, err := io.WriteString(guestEnd, agentproto.ReadyPrefix+nonce+" 1\n"); err != nil {
			done <- result{err: err}
			return
		}
		cfg := yamux.DefaultConfig()
		cfg.LogOutput = io.Discard
		sess, err := yamux.Server(struct {
			io.Reader
			io.Writer
			io.Closer
		}{br, guestEnd, guestEnd}, cfg)
		done <- result{sess, err}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := guest.Handshake(ctx, hostEnd)
	if err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.err != nil {
		t.Fatal(r.err)
	}
	t.Cleanup(func() { c.Close(); r.sess.Close(); guestEnd.Close() })
	return c, r.sess
}

// A reply without the entry or process it must carry is an error, not a
// nil result the API would dereference.
func TestRepliesMissingTheirResult(t *testing.T) {
	c, sess := newFakeGuest(t)
	answerWith(sess, func(agentproto.Request) []byte {
		return frame(agentproto.KindJSON, []byte("{}")) // a Reply with no error and no result
	})
	ctx := context.Background()
	calls := map[string]func() (any, error){
		"stat":      func() (any, error) { return c.Stat(ctx, "/x") },
		"mkdir":     func() (any, error) { return c.Mkdir(ctx, "/x", false) },
		"chmod":     func() (any, error) { return c.Chmod(ctx, "/x", 0o755) },
		"writeFile": func() (any, error) { return c.WriteFile(ctx, "/x", 0o644, 0, strings.NewReader("")) },
		"spawn":     func() (any, error) { return c.Spawn(ctx, agentproto.ExecRequest{Command: "true"}) },
		"process":   func() (any, error) { return c.Process(ctx, "proc_1") },
		"signal":    func() (any, error) { return c.Signal(ctx, "proc_1", "TERM") },
	}
	for name, call := range calls {
		v, err := call()
		if err == nil {
			t.Errorf("%s: got %v and no error", name, v)
		}
	}
}

// openGuestStream opens a stream from the guest and sends a request frame
// of size about n.
func openGuestStream(t *testing.T, sess *yamux.Session, n int) *yamux.Stream {
	t.Helper()
	st, err := sess.OpenStream()
	if err != nil {
		t.Fatal(err)
	}
	req := agentproto.Request{Method: agentproto.MethodEgressProxy, Exec: &agentproto.ExecRequest{Command: strings.Repeat("x", n)}}
	if err := agentproto.NewConn(st).WriteJSON(req); err != nil {
		t.Fatal(err)
	}
	return st
}

// closedSoon reports whether the host ends st within d.
func closedSoon(st *yamux.Stream, d time.Duration) bool {
	_ = st.SetReadDeadline(time.Now().Add(d))
	_, err := st.Read(make([]byte, 1))
	return errors.Is(err, io.EOF) || errors.Is(err, yamux.ErrConnectionReset)
}

func TestGuestStreamLimits(t *testing.T) {
	c, sess := newFakeGuest(t)
	release := make(chan struct{})
	served := make(chan struct{}, 2*guest.MaxGuestStreams)
	c.ServeGuestStreams(&fakeEgress{proxy: func(context.Context, net.Conn, *bufio.Reader) {
		served <- struct{}{}
		<-release
	}})
	defer close(release)

	// An oversized first frame is refused without calling the handler.
	big := openGuestStream(t, sess, 100<<10)
	if !closedSoon(big, 5*time.Second) {
		t.Error("a stream whose first frame is over the limit was not closed")
	}

	// One at a time, each served (and held) before the next opens: opened
	// all at once they would overrun yamux's accept backlog, which resets
	// the excess by design.
	streams := make([]*yamux.Stream, guest.MaxGuestStreams)
	for i := range streams {
		streams[i] = openGuestStream(t, sess, 10)
		select {
		case <-served:
		case <-time.After(10 * time.Second):
			t.Fatalf("the handler was not called for stream %d, under the limit", i+1)
		}
	}
	extra := openGuestStream(t, sess, 10)
	if !closedSoon(extra, 5*time.Second) {
		t.Errorf("stream %d was not closed at once", guest.MaxGuestStreams+1)
	}
	select {
	case <-served:
		t.Error("the handler ran for a stream over the limit")
	default:
	}
	if closedSoon(streams[0], 100*time.Millisecond) {
		t.Error("a stream under the limit was closed")
	}
}
