package guest

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/netip"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/yamux"

	"github.com/emberbox/emberbox/internal/agentproto"
	"github.com/emberbox/emberbox/internal/errdefs"
)

// fuzzFrame encodes one frame by hand.
func fuzzFrame(kind byte, payload string) []byte {
	b := append([]byte{kind}, binary.BigEndian.AppendUint32(nil, uint32(len(payload)))...)
	return append(b, payload...)
}

func jsonFrame(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return fuzzFrame(agentproto.KindJSON, string(b))
}

// serveFakeAgent answers a Hello on conn as an agent would, after writing
// stale, and starts the agent's end of the session. Without ready it writes
// only stale; without session it closes conn after writing.
func serveFakeAgent(conn net.Conn, stale []byte, ready, session bool) (*yamux.Session, error) {
	br := bufio.NewReader(conn)
	line, err := br.ReadString('\n')
	if err != nil {
		return nil, err
	}
	nonce := strings.TrimSuffix(strings.TrimPrefix(line, agentproto.HelloPrefix), "\n")
	out := append([]byte(nil), stale...)
	if ready {
		out = append(out, agentproto.ReadyPrefix+nonce+" 1\n"...)
	}
	if _, err := conn.Write(out); err != nil {
		return nil, err
	}
	if !session {
		conn.Close()
		return nil, nil
	}
	cfg := yamux.DefaultConfig()
	cfg.LogOutput = io.Discard
	return yamux.Server(struct {
		io.Reader
		io.Writer
		io.Closer
	}{br, conn, conn}, cfg)
}

// FuzzHandshake has a fake agent write stale bytes before (or instead of)
// its Ready line. The handshake must succeed exactly when the Ready line for
// this Hello starts a line, and the session it starts must then carry calls:
// no stale byte may leak into it.
func FuzzHandshake(f *testing.F) {
	f.Add([]byte(""), true)
	f.Add([]byte("old bytes\n"), true)
	f.Add([]byte("EMBERBOX-READY 0123456789abcdef01234567 1\n"), true)
	f.Add([]byte("half a line"), true)
	f.Add([]byte("\x00\x00\x00\x01\x02J\x00\x00\x00\x02{}\n"), true)
	f.Add([]byte("EMBERBOX-READY \n\n"), false)
	f.Add(bytes.Repeat([]byte("x"), 70<<10), true)
	f.Add(append(bytes.Repeat([]byte("y"), 64<<10), '\n'), true)
	f.Fuzz(func(t *testing.T, stale []byte, ready bool) {
		hostEnd, guestEnd := net.Pipe()
		defer hostEnd.Close()
		defer guestEnd.Close()
		type result struct {
			sess *yamux.Session
			err  error
		}
		done := make(chan result, 1)
		want := ready && (len(stale) == 0 || stale[len(stale)-1] == '\n')
		go func() {
			s, err := serveFakeAgent(guestEnd, stale, ready, want)
			done <- result{s, err}
		}()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		c, err := Handshake(ctx, hostEnd)
		if ctx.Err() != nil {
			t.Fatal("handshake still waiting after 10 s")
		}
		if err != nil {
			if want {
				t.Fatalf("handshake failed: %v", err)
			}
			return
		}
		defer c.Close()
		if !want {
			t.Fatal("handshake succeeded without a Ready line at a line start")
		}
		r := <-done
		if r.err != nil {
			t.Fatal(r.err)
		}
		defer r.sess.Close()
		go func() {
			st, err := r.sess.AcceptStream()
			if err != nil {
				return
			}
			defer st.Close()
			fc := agentproto.NewConn(st)
			var req agentproto.Request
			if fc.ReadJSON(&req) == nil && req.Method == agentproto.MethodInfo {
				_ = fc.WriteJSON(agentproto.Reply{Info: &agentproto.Info{Version: 7}})
			}
		}()
		info, err := c.Info(ctx)
		if err != nil || info.Version != 7 {
			t.Fatalf("call after the handshake: %+v, %v", info, err)
		}
	})
}

// fuzzSession is a client and its fake agent shared by the inputs of one
// fuzzing process: a session per input would cost more than the input.
type fuzzSession struct {
	c     *Client
	guest *yamux.Session
	h     *recordingEgress
}

var (
	fuzzOnce sync.Once
	fuzzSess *fuzzSession
	fuzzErr  error
)

func sharedSession(t *testing.T) *fuzzSession {
	fuzzOnce.Do(func() {
		hostEnd, guestEnd := net.Pipe()
		agent := make(chan *yamux.Session, 1)
		go func() {
			s, _ := serveFakeAgent(guestEnd, nil, true, true)
			agent <- s
		}()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		c, err := Handshake(ctx, hostEnd)
		if err != nil {
			fuzzErr = err
			return
		}
		s := <-agent
		if s == nil {
			fuzzErr = errors.New("fake agent failed")
			return
		}
		h := &recordingEgress{}
		c.ServeGuestStreams(h)
		fuzzSess = &fuzzSession{c: c, guest: s, h: h}
	})
	if fuzzErr != nil {
		t.Fatal(fuzzErr)
	}
	return fuzzSess
}

// recordingEgress records what the client hands it.
type recordingEgress struct {
	mu     sync.Mutex
	method string
	dst    netip.AddrPort
	data   []byte
	err    error
}

func (h *recordingEgress) reset() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.method, h.dst, h.data, h.err = "", netip.AddrPort{}, nil, nil
}

func (h *recordingEgress) record(method string, dst netip.AddrPort, br *bufio.Reader) {
	var data []byte
	var err error
	if br != nil {
		data, err = io.ReadAll(br)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.method, h.dst, h.data, h.err = method, dst, data, err
}

func (h *recordingEgress) ServeProxy(ctx context.Context, c net.Conn, br *bufio.Reader) {
	h.record(agentproto.MethodEgressProxy, netip.AddrPort{}, br)
}

// dnsAnswer is what the fake handler answers a query with.
func dnsAnswer(q []byte) []byte { return append([]byte("answer:"), q...) }

func (h *recordingEgress) AnswerDNS(ctx context.Context, q []byte) []byte {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.method, h.data = agentproto.MethodEgressDNS, bytes.Clone(q)
	return dnsAnswer(q)
}

// ServeTCP refuses destinations on odd ports, to check both answers.
func (h *recordingEgress) ServeTCP(ctx context.Context, dst netip.AddrPort, c net.Conn, br *bufio.Reader, accept func(error) error) {
	if dst.Port()%2 == 1 {
		_ = accept(&RefusedError{Reason: "rule-not-allowed"})
		h.record(agentproto.MethodEgressTCP, dst, nil)
		return
	}
	if accept(nil) != nil {
		return
	}
	h.record(agentproto.MethodEgressTCP, dst, br)
}

// fuzzInputMax keeps a fuzzed reply within one yamux window, so the fake
// agent's write never waits for a host that stopped reading.
const fuzzInputMax = 128 << 10

// The host's calls, selected by the fuzzed mode; modes past the last one
// have the guest open a stream instead.
var fuzzCalls = []string{
	agentproto.MethodInfo, agentproto.MethodConfigure, agentproto.MethodExec, "exec.stream",
	agentproto.MethodSpawn, agentproto.MethodProcessList, agentproto.MethodProcessGet,
	agentproto.MethodProcessSignal, agentproto.MethodProcessOutput, agentproto.MethodFileStat,
	agentproto.MethodFileList, agentproto.MethodFileMkdir, agentproto.MethodFileRemove,
	agentproto.MethodFileChmod, agentproto.MethodFileWrite, agentproto.MethodFileRead,
}

// FuzzClient has a fake agent answer each kind of call with fuzzed bytes, or
// open a stream to the host and send them, and checks the client against a
// plain decoding of those bytes: a result is returned only for a reply that
// carries it, and it is exactly what the reply carried (events in order,
// file bytes whole); an agent error keeps its code and class; a stream
// opened by the guest reaches the handler only with a known method, a valid
// destination or a DNS message of bounded size; and nothing waits once the
// agent has finished.
func FuzzClient(f *testing.F) {
	entry := agentproto.FileEntry{Name: "a", Path: "/workspace/a", Type: "file", Size: 3, Mode: "644", ModifiedAt: time.Date(2024, 1, 2, 3, 4, 5, 0, time.UTC)}
	zero := 0
	exit := &agentproto.ExecResult{ProcessID: "proc_1", ExitCode: &zero, Stdout: []byte("hi\n"), State: "exited"}
	proc := &agentproto.ProcessInfo{ID: "proc_1", State: "running", Command: "sleep 9", Cwd: "/workspace", PID: 42}
	removed := true
	for i, method := range fuzzCalls {
		var rep []byte
		switch method {
		case agentproto.MethodInfo:
			rep = jsonFrame(agentproto.Reply{Info: &agentproto.Info{Version: 1, KernelRelease: "6.1.0", CPUs: 2}})
		case agentproto.MethodConfigure:
			rep = jsonFrame(agentproto.Reply{OK: true})
		case agentproto.MethodExec:
			rep = jsonFrame(agentproto.Reply{Exit: exit})
		case "exec.stream", agentproto.MethodProcessOutput:
			rep = append(jsonFrame(agentproto.Event{Type: "start", ProcessID: "proc_1"}),
				append(jsonFrame(agentproto.Event{Type: "stdout", Data: []byte("hi\n")}),
					jsonFrame(agentproto.Event{Type: "exit", Offset: 3, Exit: exit})...)...)
		case agentproto.MethodSpawn, agentproto.MethodProcessGet, agentproto.MethodProcessSignal:
			rep = jsonFrame(agentproto.Reply{Process: proc})
		case agentproto.MethodProcessList:
			rep = jsonFrame(agentproto.Reply{Processes: []agentproto.ProcessInfo{*proc, *proc}})
		case agentproto.MethodFileList:
			rep = jsonFrame(agentproto.Reply{Entries: []agentproto.FileEntry{entry, entry}})
		case agentproto.MethodFileRemove:
			rep = jsonFrame(agentproto.Reply{Removed: &removed})
		case agentproto.MethodFileRead:
			rep = append(jsonFrame(agentproto.Reply{Entry: &entry}),
				append(fuzzFrame(agentproto.KindData, "abc"), jsonFrame(agentproto.Reply{OK: true})...)...)
		default:
			rep = jsonFrame(agentproto.Reply{Entry: &entry})
		}
		f.Add(uint8(i), rep)
		f.Add(uint8(i), jsonFrame(agentproto.Reply{Error: &agentproto.Error{Code: agentproto.CodeFileNotFound, Message: "no such file"}}))
	}
	f.Add(uint8(0), jsonFrame(agentproto.Reply{}))
	f.Add(uint8(0), fuzzFrame(agentproto.KindData, "{}"))
	f.Add(uint8(3), jsonFrame(agentproto.Event{Type: "exit"}))
	f.Add(uint8(8), jsonFrame(agentproto.Event{Type: "stdout", Data: []byte("x")}))
	f.Add(uint8(15), append(jsonFrame(agentproto.Reply{Entry: &entry}), jsonFrame(agentproto.Reply{Error: &agentproto.Error{Code: "io", Message: "disk gone"}})...))
	g := len(fuzzCalls)
	f.Add(uint8(g), append(jsonFrame(agentproto.Request{Method: agentproto.MethodEgressProxy}), "CONNECT example.com:443 HTTP/1.1\r\n\r\n"...))
	f.Add(uint8(g), append(jsonFrame(agentproto.Request{Method: agentproto.MethodEgressDNS}), fuzzFrame(agentproto.KindData, "\x12\x34\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00\x07example\x03com\x00\x00\x01\x00\x01")...))
	f.Add(uint8(g), append(jsonFrame(agentproto.Request{Method: agentproto.MethodEgressTCP, Egress: &agentproto.EgressRequest{Addr: "93.184.216.34:80"}}), "GET / HTTP/1.0\r\n\r\n"...))
	f.Add(uint8(g), jsonFrame(agentproto.Request{Method: agentproto.MethodEgressTCP, Egress: &agentproto.EgressRequest{Addr: "[fe80::1%eth0]:443"}}))
	f.Add(uint8(g), jsonFrame(agentproto.Request{Method: agentproto.MethodEgressTCP, Egress: &agentproto.EgressRequest{Addr: "1.2.3.4:443"}}))
	f.Add(uint8(g), jsonFrame(agentproto.Request{Method: "egress.other"}))
	f.Fuzz(func(t *testing.T, mode uint8, data []byte) {
		if len(data) > fuzzInputMax {
			return
		}
		s := sharedSession(t)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if int(mode) >= len(fuzzCalls) {
			checkGuestStream(t, ctx, s, data)
			return
		}
		// The fake agent reads the call's Request and answers with data.
		go func() {
			st, err := s.guest.AcceptStream()
			if err != nil {
				return
			}
			defer st.Close()
			var req agentproto.Request
			if agentproto.NewConn(st).ReadJSON(&req) != nil {
				return
			}
			_, _ = st.Write(data)
		}()
		checkCall(t, ctx, s.c, fuzzCalls[mode], data)
		if ctx.Err() != nil {
			t.Fatal("call still waiting after 10 s, though the agent had ended its stream")
		}
	})
}

// frames reads data as the client's reader would.
func frames(data []byte) *agentproto.Conn {
	return agentproto.NewConn(struct {
		io.Reader
		io.Writer
	}{bytes.NewReader(data), io.Discard})
}

// checkWireError checks that err is what the agent's error e maps to.
func checkWireError(t *testing.T, err error, e *agentproto.Error) {
	t.Helper()
	var ce *errdefs.CodedError
	if !errors.As(err, &ce) {
		t.Fatalf("agent error %+v came back as %T %v", e, err, err)
	}
	want := wireError(e).(*errdefs.CodedError)
	if ce.Code != want.Code || ce.Class != want.Class || !strings.Contains(err.Error(), e.Message) {
		t.Fatalf("agent error %+v came back as %+v, want %+v", e, ce, want)
	}
}

// checkCall makes the call named by method and checks its outcome against
// the reply data.
func checkCall(t *testing.T, ctx context.Context, c *Client, method string, data []byte) {
	switch method {
	case "exec.stream", agentproto.MethodProcessOutput:
		checkStream(t, ctx, c, method, data)
		return
	case agentproto.MethodFileRead:
		checkReadFile(t, ctx, c, data)
		return
	}
	var got any
	var err error
	switch method {
	case agentproto.MethodInfo:
		got, err = c.Info(ctx)
	case agentproto.MethodConfigure:
		got, err = struct{}{}, c.Configure(ctx, agentproto.ConfigureRequest{Hostname: "h"})
	case agentproto.MethodExec:
		got, err = c.Exec(ctx, agentproto.ExecRequest{Command: "true"}, nil)
	case agentproto.MethodSpawn:
		got, err = c.Spawn(ctx, agentproto.ExecRequest{Command: "true"})
	case agentproto.MethodProcessList:
		got, err = c.Processes(ctx)
	case agentproto.MethodProcessGet:
		got, err = c.Process(ctx, "proc_1")
	case agentproto.MethodProcessSignal:
		got, err = c.Signal(ctx, "proc_1", "TERM")
	case agentproto.MethodFileStat:
		got, err = c.Stat(ctx, "a")
	case agentproto.MethodFileList:
		got, err = c.List(ctx, agentproto.FileRequest{Path: "a"})
	case agentproto.MethodFileMkdir:
		got, err = c.Mkdir(ctx, "a", true)
	case agentproto.MethodFileRemove:
		got, err = c.Remove(ctx, "a", true)
	case agentproto.MethodFileChmod:
		got, err = c.Chmod(ctx, "a", 0o755)
	case agentproto.MethodFileWrite:
		got, err = c.WriteFile(ctx, "a", 0o644, 3, strings.NewReader("abc"))
	}

	var rep agentproto.Reply
	if rerr := frames(data).ReadJSON(&rep); rerr != nil {
		if err == nil {
			t.Fatalf("%s: reply %q does not decode (%v), yet the call returned %+v", method, data, rerr, got)
		}
		return
	}
	if rep.Error != nil {
		checkWireError(t, err, rep.Error)
		return
	}
	var want any
	switch method {
	case agentproto.MethodInfo:
		want = rep.Info
	case agentproto.MethodConfigure:
		want = struct{}{}
	case agentproto.MethodExec:
		want = rep.Exit
	case agentproto.MethodSpawn, agentproto.MethodProcessGet, agentproto.MethodProcessSignal:
		want = rep.Process
	case agentproto.MethodProcessList:
		want = rep.Processes
		if rep.Processes == nil {
			want = []agentproto.ProcessInfo{}
		}
	case agentproto.MethodFileList:
		want = rep.Entries
		if rep.Entries == nil {
			want = []agentproto.FileEntry{}
		}
	case agentproto.MethodFileRemove:
		want = rep.Removed != nil && *rep.Removed
	default:
		want = rep.Entry
	}
	if v := reflect.ValueOf(want); v.Kind() == reflect.Pointer && v.IsNil() {
		if err == nil {
			t.Fatalf("%s: reply %q carries no result, yet the call returned %+v", method, data, got)
		}
		return
	}
	if err != nil {
		// A valid reply may still be refused, but only as a classified
		// error (a cap on its size, say), never a raw one.
		if errdefs.Code(err) == "" {
			t.Fatalf("%s: valid reply %q refused with an unclassified error: %v", method, data, err)
		}
		return
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("%s: got %+v, want %+v", method, got, want)
	}
}

// checkStream checks a streamed exec or process output: the events passed
// on are those the agent sent, in order, up to the one that ends the call.
func checkStream(t *testing.T, ctx context.Context, c *Client, method string, data []byte) {
	var got []agentproto.Event
	onEvent := func(ev agentproto.Event) error {
		got = append(got, ev)
		return nil
	}
	var res *agentproto.ExecResult
	var err error
	if method == agentproto.MethodProcessOutput {
		err = c.ProcessOutput(ctx, agentproto.ProcessRequest{ID: "proc_1", Follow: true}, onEvent)
	} else {
		res, err = c.Exec(ctx, agentproto.ExecRequest{Command: "true", Stream: true}, onEvent)
	}

	var want []agentproto.Event
	fc := frames(data)
	for {
		var ev agentproto.Event
		if rerr := fc.ReadJSON(&ev); rerr != nil {
			// A clean end between frames ends process output, not exec.
			if method == agentproto.MethodProcessOutput && rerr == io.EOF {
				if err != nil {
					t.Fatalf("%s: stream ended cleanly, got %v", method, err)
				}
			} else if err == nil {
				t.Fatalf("%s: stream %q ends badly (%v), yet the call succeeded", method, data, rerr)
			}
			return
		}
		if ev.Error != nil {
			checkWireError(t, err, ev.Error)
			return
		}
		if ev.Type == "exit" && ev.Exit == nil && method != agentproto.MethodProcessOutput {
			if err == nil {
				t.Fatalf("%s: exit without result accepted", method)
			}
			return
		}
		want = append(want, ev)
		if ev.Type == "exit" {
			break
		}
	}
	if err != nil {
		if errdefs.Code(err) == "" {
			t.Fatalf("%s: valid stream %q refused with an unclassified error: %v", method, data, err)
		}
		return
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("%s: events\n%+v\nwant\n%+v", method, got, want)
	}
	if method != agentproto.MethodProcessOutput && !reflect.DeepEqual(res, want[len(want)-1].Exit) {
		t.Fatalf("%s: result %+v, want %+v", method, res, want[len(want)-1].Exit)
	}
}

// checkReadFile checks that a file's reader yields exactly the data frames
// between the entry and the reply that ends them, and fails unless that
// reply is a success.
func checkReadFile(t *testing.T, ctx context.Context, c *Client, data []byte) {
	ent, r, err := c.ReadFile(ctx, "a")
	fc := frames(data)
	var rep agentproto.Reply
	if rerr := fc.ReadJSON(&rep); rerr != nil || rep.Error != nil || rep.Entry == nil {
		if err == nil {
			r.Close()
			t.Fatalf("read: bad first reply %q accepted", data)
		}
		if rerr == nil && rep.Error != nil {
			checkWireError(t, err, rep.Error)
		}
		return
	}
	if err != nil {
		if errdefs.Code(err) == "" {
			t.Fatalf("read: valid reply refused with an unclassified error: %v", err)
		}
		return
	}
	defer r.Close()
	if !reflect.DeepEqual(ent, rep.Entry) {
		t.Fatalf("read: entry %+v, want %+v", ent, rep.Entry)
	}
	got, err := io.ReadAll(io.LimitReader(r, int64(len(data))+1))
	var want []byte
	var clean bool
	for {
		kind, p, rerr := fc.ReadFrame()
		if rerr != nil {
			break
		}
		if kind == agentproto.KindData {
			want = append(want, p...)
			continue
		}
		var end agentproto.Reply
		clean = json.Unmarshal(p, &end) == nil && end.Error == nil
		break
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("read: got %d bytes %q, want %d %q", len(got), got, len(want), want)
	}
	if clean != (err == nil) {
		t.Fatalf("read: ended with %v, want a clean end: %v", err, clean)
	}
}

// checkGuestStream has the guest open a stream and send data, then checks
// what the handler saw and what the guest got back.
func checkGuestStream(t *testing.T, ctx context.Context, s *fuzzSession, data []byte) {
	s.h.reset()
	st, err := s.guest.OpenStream()
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if _, err := st.Write(data); err != nil {
		t.Fatal(err)
	}
	st.Close() // half-close: the host reads EOF after data
	_ = st.SetReadDeadline(time.Now().Add(10 * time.Second))
	back, err := io.ReadAll(st)
	if err != nil {
		t.Fatalf("the host did not end the stream: %v", err)
	}
	s.h.mu.Lock()
	method, dst, seen := s.h.method, s.h.dst, s.h.data
	s.h.mu.Unlock()

	fc := frames(data)
	var req agentproto.Request
	if fc.ReadJSONMax(&req, maxGuestRequest) != nil {
		if method != "" || len(back) != 0 {
			t.Fatalf("bad first frame %q reached the handler (%s) or got %q", data, method, back)
		}
		return
	}
	// rest is what follows the request: the connection's bytes.
	rest := func() []byte { b, _ := io.ReadAll(fc.Reader()); return b }
	switch req.Method {
	case agentproto.MethodEgressProxy:
		if method != req.Method || !bytes.Equal(seen, rest()) || len(back) != 0 {
			t.Fatalf("proxy: handler %q saw %q; guest got %q", method, seen, back)
		}
	case agentproto.MethodEgressDNS:
		kind, q, err := fc.ReadFrameMax(MaxDNSMessage)
		if err != nil || kind != agentproto.KindData {
			if method != "" || len(back) != 0 {
				t.Fatalf("dns: bad query frame reached the handler (%s) or got %q", method, back)
			}
			return
		}
		if method != req.Method || !bytes.Equal(seen, q) || len(q) > MaxDNSMessage {
			t.Fatalf("dns: handler %q saw %q, want %q", method, seen, q)
		}
		if want := fuzzFrame(agentproto.KindData, string(dnsAnswer(q))); !bytes.Equal(back, want) {
			t.Fatalf("dns: guest got %q, want %q", back, want)
		}
	case agentproto.MethodEgressTCP:
		want, ok := egressDst(req.Egress)
		if ok {
			if p, err := netip.ParseAddrPort(req.Egress.Addr); err != nil || p != want {
				t.Fatalf("tcp: %q parsed as %v", req.Egress.Addr, want)
			}
		}
		if !ok || !want.IsValid() || want.Addr().Zone() != "" || want.Port() == 0 {
			if method != "" || !replyCode(back, agentproto.CodeInvalid) {
				t.Fatalf("tcp: bad address %+v reached the handler (%s) or got %q", req.Egress, method, back)
			}
			return
		}
		if method != req.Method || dst != want {
			t.Fatalf("tcp: handler %q got %v, want %v", method, dst, want)
		}
		if want.Port()%2 == 1 {
			if !replyCode(back, agentproto.CodeEgressRefused) {
				t.Fatalf("tcp: refusal answered %q", back)
			}
			return
		}
		if want := rest(); !bytes.Equal(back, jsonFrame(agentproto.Reply{OK: true})) || !bytes.Equal(seen, want) {
			t.Fatalf("tcp: guest got %q; handler saw %q, want %q", back, seen, want)
		}
	default:
		if method != "" || !replyCode(back, agentproto.CodeUnknownMethod) {
			t.Fatalf("unknown method %q reached the handler (%s) or got %q", req.Method, method, back)
		}
	}
}

// replyCode reports whether b is exactly one Reply frame with an error of
// the given code.
func replyCode(b []byte, code string) bool {
	fc := frames(b)
	var rep agentproto.Reply
	if fc.ReadJSON(&rep) != nil || rep.Error == nil || rep.Error.Code != code {
		return false
	}
	_, _, err := fc.ReadFrame()
	return err == io.EOF
}
