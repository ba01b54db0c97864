package guest_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/yamux"

	"github.com/emberbox/emberbox/internal/agentproto"
	"github.com/emberbox/emberbox/internal/errdefs"
	"github.com/emberbox/emberbox/internal/guest"
)

// answerWith makes the fake guest answer every call with the frames that
// answer returns for its request (raw bytes, frame headers included).
func answerWith(sess *yamux.Session, answer func(req agentproto.Request) []byte) {
	go func() {
		for {
			st, err := sess.AcceptStream()
			if err != nil {
				return
			}
			go func() {
				defer st.Close()
				var req agentproto.Request
				if err := agentproto.NewConn(st).ReadJSON(&req); err != nil {
					return
				}
				_, _ = st.Write(answer(req))
			}()
		}
	}()
}

func frame(kind byte, p []byte) []byte {
	var hdr [5]byte
	hdr[0] = kind
	binary.BigEndian.PutUint32(hdr[1:], uint32(len(p)))
	return append(hdr[:], p...)
}

func list(key string, n int, elem string) []byte {
	var b bytes.Buffer
	fmt.Fprintf(&b, `{%q:[`, key)
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(elem)
	}
	b.WriteString("]}")
	return b.Bytes()
}

// violations records what the client reports.
type violations struct {
	mu   sync.Mutex
	list []guest.Violation
}

func (v *violations) add(x guest.Violation) { v.mu.Lock(); v.list = append(v.list, x); v.mu.Unlock() }
func (v *violations) n() int                { v.mu.Lock(); defer v.mu.Unlock(); return len(v.list) }

func isProtocolError(err error) bool {
	return errdefs.Code(err) == guest.CodeProtocolError && errdefs.Code(err) != "" && err != nil &&
		strings.Contains(err.Error(), "breaks the protocol")
}

func TestReplyLimits(t *testing.T) {
	ctx := context.Background()
	huge := list("processes", 0, "")
	for len(huge) < agentproto.MaxFrame-16 {
		huge = list("processes", (agentproto.MaxFrame-16)/3, "{}")
	}
	cases := []struct {
		name   string
		answer []byte
		call   func(c *guest.Client) error
		ok     bool
	}{
		{"1024 processes", frame('J', list("processes", 1024, `{"id":"proc_1"}`)),
			func(c *guest.Client) error { _, err := c.Processes(ctx); return err }, true},
		{"1025 processes", frame('J', list("processes", 1025, `{}`)),
			func(c *guest.Client) error { _, err := c.Processes(ctx); return err }, false},
		{"a frame of empty processes", frame('J', huge),
			func(c *guest.Client) error { _, err := c.Processes(ctx); return err }, false},
		{"the list's key in other case", frame('J', list("PROCESSES", 2000, `{}`)),
			func(c *guest.Client) error { _, err := c.Processes(ctx); return err }, false},
		{"the list's key twice", frame('J', []byte(`{"processes":[`+strings.Repeat(`{},`, 600)+`{}],"processes":[`+strings.Repeat(`{},`, 600)+`{}]}`)),
			func(c *guest.Client) error { _, err := c.Processes(ctx); return err }, false},
		{"a list where a list is due", frame('J', []byte(`{"processes":{"a":1}}`)),
			func(c *guest.Client) error { _, err := c.Processes(ctx); return err }, false},
		{"entries within the limit asked", frame('J', list("entries", 10, `{"name":"a"}`)),
			func(c *guest.Client) error {
				_, err := c.List(ctx, agentproto.FileRequest{Path: "/", Limit: 10})
				return err
			}, true},
		{"entries over the limit asked", frame('J', list("entries", 11, `{"name":"a"}`)),
			func(c *guest.Client) error {
				_, err := c.List(ctx, agentproto.FileRequest{Path: "/", Limit: 10})
				return err
			}, false},
		{"entries over the default limit", frame('J', list("entries", agentproto.DefaultListLimit+1, `{}`)),
			func(c *guest.Client) error { _, err := c.List(ctx, agentproto.FileRequest{Path: "/"}); return err }, false},
		{"a frame header of 1 GiB", append([]byte{'J', 0x40, 0, 0, 0}, bytes.Repeat([]byte{'['}, 1<<10)...),
			func(c *guest.Client) error { _, err := c.Processes(ctx); return err }, false},
		{"an unknown frame kind", frame('X', []byte(`{}`)),
			func(c *guest.Client) error { _, err := c.Info(ctx); return err }, false},
		{"a data frame for a reply", frame('D', []byte(`{}`)),
			func(c *guest.Client) error { _, err := c.Info(ctx); return err }, false},
		{"an info over 1 MiB", frame('J', []byte(`{"info":{"kernelRelease":"`+strings.Repeat("x", guest.MaxReply)+`"}}`)),
			func(c *guest.Client) error { _, err := c.Info(ctx); return err }, false},
		{"deep nesting", frame('J', append([]byte(`{"entry":`), bytes.Repeat([]byte{'['}, 512<<10)...)),
			func(c *guest.Client) error { _, err := c.Stat(ctx, "/"); return err }, false},
		{"a long argv", frame('J', []byte(`{"process":{"argv":[`+strings.Repeat(`"",`, 70000)+`""]}}`)),
			func(c *guest.Client) error { _, err := c.Process(ctx, "proc_1"); return err }, false},
		{"trailing data", frame('J', []byte(`{"info":{}} {}`)),
			func(c *guest.Client) error { _, err := c.Info(ctx); return err }, false},
		{"not JSON", frame('J', []byte(`{"info":`)),
			func(c *guest.Client) error { _, err := c.Info(ctx); return err }, false},
		{"no result", frame('J', []byte(`{}`)),
			func(c *guest.Client) error { _, err := c.Info(ctx); return err }, false},
		{"an event over 1 MiB", frame('J', []byte(`{"type":"stdout","data":"`+strings.Repeat("A", guest.MaxEventFrame)+`"}`)),
			func(c *guest.Client) error {
				_, err := c.Exec(ctx, agentproto.ExecRequest{Command: "x", Stream: true}, func(agentproto.Event) error { return nil })
				return err
			}, false},
		{"a file data frame over a chunk", append(frame('J', []byte(`{"entry":{"name":"f"}}`)), frame('D', make([]byte, agentproto.DataChunk+1))...),
			func(c *guest.Client) error {
				_, rc, err := c.ReadFile(ctx, "/f")
				if err != nil {
					return err
				}
				defer rc.Close()
				_, err = rc.Read(make([]byte, 10))
				return err
			}, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c, sess := newFakeGuest(t)
			var v violations
			c.SetViolationHandler(v.add)
			answerWith(sess, func(agentproto.Request) []byte { return tc.answer })
			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			err := tc.call(c)
			runtime.ReadMemStats(&after)
			if tc.ok {
				if err != nil || v.n() != 0 {
					t.Fatalf("err %v, violations %v; want an answer", err, v.list)
				}
				return
			}
			if !isProtocolError(err) || !errorsIsUnavailable(err) {
				t.Fatalf("err %v (code %q), want %s of class unavailable", err, errdefs.Code(err), guest.CodeProtocolError)
			}
			if v.n() != 1 {
				t.Errorf("violations %v, want one", v.list)
			}
			// The answer is refused before it is built: what the call
			// allocated (both ends of it, as the fake guest runs here) is
			// a few times the frame, not the ~235 MiB of 1.4 million
			// ProcessInfo structs.
			if got := after.TotalAlloc - before.TotalAlloc; got > 16*agentproto.MaxFrame {
				t.Errorf("the call allocated %d MiB", got>>20)
			}
		})
	}
}

func errorsIsUnavailable(err error) bool {
	var ce *errdefs.CodedError
	return err != nil && fmt.Sprint(err) != "" && asCoded(err, &ce) && ce.Class == errdefs.ErrUnavailable
}

func asCoded(err error, ce **errdefs.CodedError) bool {
	c, ok := err.(*errdefs.CodedError)
	*ce = c
	return ok
}

// An agent's error message reaches callers bounded.
func TestWireErrorBounded(t *testing.T) {
	c, sess := newFakeGuest(t)
	answerWith(sess, func(agentproto.Request) []byte {
		b, _ := jsonMarshal(agentproto.Reply{Error: &agentproto.Error{Code: agentproto.CodePermission, Message: strings.Repeat("x", 512<<10)}})
		return frame('J', b)
	})
	_, err := c.Stat(context.Background(), "/")
	if errdefs.Code(err) != agentproto.CodePermission || len(err.Error()) > 5<<10 {
		t.Fatalf("err code %q, %d bytes of text; want %s, at most ~4 KiB", errdefs.Code(err), len(err.Error()), agentproto.CodePermission)
	}
}

// A DNS frame over 64 KiB is a violation and gets no answer; one at the
// limit is answered.
func TestGuestDNSFrameLimit(t *testing.T) {
	c, sess := newFakeGuest(t)
	var v violations
	c.SetViolationHandler(v.add)
	var answered atomic.Int32
	c.ServeGuestStreams(&fakeEgress{dns: func(_ context.Context, q []byte) []byte {
		answered.Add(1)
		return []byte("answer")
	}})
	ask := func(n int) ([]byte, error) {
		st, err := sess.OpenStream()
		if err != nil {
			t.Fatal(err)
		}
		defer st.Close()
		_ = st.SetDeadline(time.Now().Add(10 * time.Second))
		fc := agentproto.NewConn(st)
		if err := fc.WriteJSON(agentproto.Request{Method: agentproto.MethodEgressDNS}); err != nil {
			t.Fatal(err)
		}
		if err := fc.WriteFrame(agentproto.KindData, make([]byte, n)); err != nil {
			t.Fatal(err)
		}
		_, p, err := fc.ReadFrame()
		return p, err
	}
	if p, err := ask(guest.MaxDNSMessage); err != nil || string(p) != "answer" {
		t.Fatalf("a query of %d bytes: %q, %v", guest.MaxDNSMessage, p, err)
	}
	if p, err := ask(guest.MaxDNSMessage + 1); err == nil {
		t.Fatalf("a query of %d bytes was answered: %q", guest.MaxDNSMessage+1, p)
	}
	if answered.Load() != 1 || v.n() != 1 {
		t.Errorf("answered %d, violations %v; want 1 and 1", answered.Load(), v.list)
	}
}

// Streams the host has finished with but the guest never closes, full of
// data, count against the budget until yamux has dropped them: past it, the
// host accepts nothing more for a while, so their number, and the bytes
// they buffer, stay bounded.
func TestHalfClosedStreamsHeld(t *testing.T) {
	c, sess := newFakeGuest(t)
	var mu sync.Mutex
	var times []time.Time
	c.ServeGuestStreams(&fakeEgress{dns: func(context.Context, []byte) []byte {
		mu.Lock()
		times = append(times, time.Now())
		mu.Unlock()
		return []byte("a")
	}})
	open := func() {
		st, err := sess.OpenStream()
		if err != nil {
			t.Fatal(err)
		}
		fc := agentproto.NewConn(st)
		_ = fc.WriteJSON(agentproto.Request{Method: agentproto.MethodEgressDNS})
		_ = fc.WriteFrame(agentproto.KindData, []byte("q"))
		go func() {
			// Keep sending, never close.
			_ = st.SetWriteDeadline(time.Now().Add(20 * time.Second))
			for {
				if _, err := st.Write(make([]byte, 32<<10)); err != nil {
					return
				}
			}
		}()
	}
	// The first stream beyond the budget waits until a held one is gone,
	// which is no sooner than the close timeout after the first was
	// answered. The streams are opened one at a time, each once the one
	// before was served: opened all at once they would overrun yamux's
	// accept backlog, which resets the excess by design.
	n := guest.MaxHeldGuestStreams + 1
	served := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(times)
	}
	waitServed := func(want int, d time.Duration) {
		deadline := time.Now().Add(d)
		for served() < want && time.Now().Before(deadline) {
			time.Sleep(5 * time.Millisecond)
		}
	}
	for i := range n {
		open()
		if i < n-1 {
			waitServed(i+1, 10*time.Second)
		}
	}
	waitServed(n, 30*time.Second)
	mu.Lock()
	defer mu.Unlock()
	if len(times) < n {
		t.Fatalf("only %d of %d streams were served", len(times), n)
	}
	if d := times[n-1].Sub(times[0]); d < guest.SessionCloseTimeout-time.Second {
		t.Errorf("stream %d was served %s after the first; want the held budget to make it wait about %s",
			n, d, guest.SessionCloseTimeout)
	}
}

func jsonMarshal(v any) ([]byte, error) { return json.Marshal(v) }
