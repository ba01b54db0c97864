package guest

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync/atomic"
	"time"

	"github.com/hashicorp/yamux"

	"github.com/emberbox/emberbox/internal/agentproto"
	"github.com/emberbox/emberbox/internal/errdefs"
)

// maxHandshakeSkip bounds the stale bytes skipped while waiting for Ready.
const maxHandshakeSkip = 16 << 20

// sessionCloseTimeout is how long a stream the host has closed may wait for
// the guest to close its side before yamux resets it; until then what the
// guest sends on it is buffered. The host closes a stream only when it
// wants nothing more from it, so this is short.
const sessionCloseTimeout = 5 * time.Second

// Client talks to one guest agent. It is safe for concurrent use.
type Client struct {
	sess *yamux.Session
	conn net.Conn

	onViolation atomic.Pointer[func(Violation)]
	// ending is why the session is about to end, when the host ends it on
	// purpose (Ending).
	ending atomic.Pointer[error]

	ports chan struct{} // a place per connection to a guest port (DialPort)
}

// Handshake performs the hello/ready exchange on conn and starts a session.
// Bytes the guest sent before its Ready line (left from an earlier host
// connection) are skipped. It gives up when ctx ends.
func Handshake(ctx context.Context, conn net.Conn) (*Client, error) {
	var b [12]byte
	_, _ = rand.Read(b[:])
	nonce := hex.EncodeToString(b[:])
	if d, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(d)
	}
	stop := context.AfterFunc(ctx, func() { _ = conn.SetDeadline(time.Unix(1, 0)) })
	defer stop()

	hello := agentproto.HelloPrefix + nonce + "\n"
	if _, err := io.WriteString(conn, hello); err != nil {
		return nil, fmt.Errorf("sending hello: %w", err)
	}
	endResend := resendHello(conn, hello)
	br := bufio.NewReaderSize(conn, 64<<10)
	if err := awaitReady(ctx, br, []byte(agentproto.ReadyPrefix+nonce+" "), endResend); err != nil {
		return nil, err
	}
	_ = conn.SetDeadline(time.Time{})
	sess, err := startSession(br, conn)
	if err != nil {
		return nil, fmt.Errorf("starting session: %w", err)
	}
	return &Client{sess: sess, conn: conn, ports: make(chan struct{}, MaxPortConns)}, nil
}

// resendHello repeats hello on conn until the returned func is called,
// which returns once the repeating has stopped.
//
// The Hello is repeated until the Ready line comes: a guest restored from
// saved memory can take the first one for traffic of the session it had
// when it was saved, end that session and wait for the next Hello. The
// agent skips repeats that follow its Ready, and they all come before the
// session's first frame, as the repeating stops (and is waited for) before
// the session starts.
func resendHello(conn net.Conn, hello string) (end func()) {
	stopResend := make(chan struct{})
	resent := make(chan struct{})
	go func() {
		defer close(resent)
		t := time.NewTicker(helloResend)
		defer t.Stop()
		for {
			select {
			case <-stopResend:
				return
			case <-t.C:
				if _, err := io.WriteString(conn, hello); err != nil {
					return
				}
			}
		}
	}()
	return func() { close(stopResend); <-resent }
}

// awaitReady reads br up to the start of a line beginning with want (the
// Ready line), skipping what comes before it. It calls endResend once,
// before it returns.
func awaitReady(ctx context.Context, br *bufio.Reader, want []byte, endResend func()) error {
	// The guest is not trusted: lines are read in bounded pieces, and only
	// so much is skipped before giving up.
	var skipped int
	atLineStart := true
	for {
		line, err := br.ReadSlice('\n')
		if err != nil && !errors.Is(err, bufio.ErrBufferFull) {
			endResend()
			if ctx.Err() != nil {
				return fmt.Errorf("waiting for agent: %w", ctx.Err())
			}
			return fmt.Errorf("waiting for agent: %w", err)
		}
		if atLineStart && bytes.HasPrefix(line, want) {
			endResend()
			return nil
		}
		atLineStart = err == nil
		if skipped += len(line); skipped > maxHandshakeSkip {
			endResend()
			return fmt.Errorf("waiting for agent: no ready line in %d bytes", skipped)
		}
	}
}

// startSession starts the host's yamux session on conn, reading through
// br (which may hold what the guest sent after its Ready line).
func startSession(br *bufio.Reader, conn net.Conn) (*yamux.Session, error) {
	cfg := yamux.DefaultConfig()
	cfg.LogOutput = io.Discard
	// What the guest sends is buffered up to the window per stream; see
	// GuestStreamBytes for the budget this keeps.
	cfg.MaxStreamWindowSize = MaxWindow
	cfg.AcceptBacklog = acceptBacklog
	cfg.ConnectionWriteTimeout = 30 * time.Second
	cfg.StreamOpenTimeout = 30 * time.Second
	cfg.StreamCloseTimeout = sessionCloseTimeout
	return yamux.Client(struct {
		io.Reader
		io.Writer
		io.Closer
	}{br, conn, conn}, cfg)
}

// helloResend is how often Handshake repeats its Hello until answered.
const helloResend = 250 * time.Millisecond

// Close ends the session. Calls in flight fail.
func (c *Client) Close() error { return c.sess.Close() }

// Ending records why the session is about to end, before the host ends it
// on purpose (pausing the VM): a call that fails from then on for a lost
// connection answers cause, which tells its caller what happened, rather
// than guest_unavailable. The first cause recorded stands.
func (c *Client) Ending(cause error) { c.ending.CompareAndSwap(nil, &cause) }

// Done is closed when the session ends (the guest or its VM went away).
func (c *Client) Done() <-chan struct{} { return c.sess.CloseChan() }

// call opens a stream, sends req and returns the framed connection. The
// stream is closed when ctx ends, which unblocks any read on it.
func (c *Client) call(ctx context.Context, req *agentproto.Request) (*agentproto.Conn, func(), error) {
	st, err := c.sess.OpenStream()
	if err != nil {
		// The cause stays on the host: its text is yamux's, not the caller's.
		return nil, nil, c.unreachable()
	}
	// Close alone only half-closes a yamux stream; the past deadline
	// unblocks our own reads and writes at once.
	stop := context.AfterFunc(ctx, func() { _ = st.SetDeadline(time.Unix(1, 0)); st.Close() })
	done := func() { stop(); st.Close() }
	fc := agentproto.NewConn(st)
	if u := fileUser(ctx); u != "" {
		if req.File != nil && req.File.User == "" {
			req.File.User = u
		}
		if req.Watch != nil && req.Watch.User == "" {
			req.Watch.User = u
		}
	}
	if err := fc.WriteJSON(req); err != nil {
		done()
		return nil, nil, c.lost(ctx)
	}
	return fc, done, nil
}

// lost is the error of a call whose stream failed under it: ctx's if that
// ended, else the cause Ending recorded, else guest_unavailable. What the
// transport said stays on the host.
func (c *Client) lost(ctx context.Context) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if cause := c.ending.Load(); cause != nil {
		return *cause
	}
	return errdefs.New(errdefs.ErrUnavailable, "guest_unavailable", "lost the connection to the sandbox's agent")
}

// unreachable is the error of a call that could not open a stream: the
// cause Ending recorded, else guest_unavailable.
func (c *Client) unreachable() error {
	if cause := c.ending.Load(); cause != nil {
		return *cause
	}
	return errdefs.New(errdefs.ErrUnavailable, "guest_unavailable", "the sandbox's agent is not reachable")
}

// roundTrip sends req and reads one Reply within lim.
func (c *Client) roundTrip(ctx context.Context, req *agentproto.Request, lim readLimit) (*agentproto.Reply, error) {
	fc, done, err := c.call(ctx, req)
	if err != nil {
		return nil, err
	}
	defer done()
	var rep agentproto.Reply
	if err := c.readJSON(ctx, fc, req.Method, lim, &rep); err != nil {
		return nil, err
	}
	if rep.Error != nil {
		return nil, wireError(rep.Error)
	}
	return &rep, nil
}

// wireError maps an agent error to an errdefs error with the same code.
// Codes the host does not know become guest_error; the message is the
// guest's own text, bounded, as the guest is not trusted to keep it short.
func wireError(e *agentproto.Error) error {
	class := errdefs.ErrInternal
	code := e.Code
	switch e.Code {
	case agentproto.CodeFileNotFound, agentproto.CodeProcessNotFound, agentproto.CodeWatchNotFound:
		class = errdefs.ErrNotFound
	case agentproto.CodeIsADirectory, agentproto.CodeNotADirectory, agentproto.CodeExists,
		agentproto.CodeNotEmpty, agentproto.CodeNoSpace, agentproto.CodeCrossDevice,
		agentproto.CodeStdinClosed, agentproto.CodeStdinGap, agentproto.CodeNotATerminal, agentproto.CodeStdinFull,
		agentproto.CodeBusy:
		class = errdefs.ErrConflict
	case agentproto.CodePermission:
		class = errdefs.ErrPermission
	case agentproto.CodeInvalid, agentproto.CodeUnknownMethod, agentproto.CodeCommandNotFound:
		class = errdefs.ErrInvalidArgument
	case agentproto.CodeTooLarge, agentproto.CodeUnsafeArchive:
		class = errdefs.ErrInvalidArgument
	default:
		code = "guest_error"
	}
	return &errdefs.CodedError{Class: class, Code: code, Message: guestText(e.Message)}
}

// maxGuestMessage bounds the text of a guest's error that reaches a caller.
const maxGuestMessage = 4 << 10

// guestText bounds a message from the guest and makes it valid UTF-8.
func guestText(s string) string {
	if len(s) > maxGuestMessage {
		s = s[:maxGuestMessage] + "…"
	}
	return strings.ToValidUTF8(s, "\uFFFD")
}

// missing reports a reply without the result its method must carry.
func (c *Client) missing(method, what string) error {
	return c.violation(method, "reply carries no %s", what)
}

// Info describes the guest.
func (c *Client) Info(ctx context.Context) (*agentproto.Info, error) {
	rep, err := c.roundTrip(ctx, &agentproto.Request{Method: agentproto.MethodInfo}, ordinaryReply)
	if err != nil {
		return nil, err
	}
	if rep.Info == nil {
		return nil, c.missing(agentproto.MethodInfo, "info")
	}
	return rep.Info, nil
}

// Configure sets the sandbox-wide env and hostname.
func (c *Client) Configure(ctx context.Context, req agentproto.ConfigureRequest) error {
	_, err := c.roundTrip(ctx, &agentproto.Request{Method: agentproto.MethodConfigure, Configure: &req}, ordinaryReply)
	return err
}

// SetSecretEnv replaces the placeholders of the sandbox's egress secrets
// in every command's environment.
func (c *Client) SetSecretEnv(ctx context.Context, env map[string]string) error {
	_, err := c.roundTrip(ctx, &agentproto.Request{Method: agentproto.MethodSecretEnv,
		SecretEnv: &agentproto.SecretEnvRequest{Env: env}}, ordinaryReply)
	return err
}

// SetTrust replaces the extra CAs the guest trusts besides its own roots.
func (c *Client) SetTrust(ctx context.Context, caCerts string) error {
	_, err := c.roundTrip(ctx, &agentproto.Request{Method: agentproto.MethodTrust,
		Trust: &agentproto.TrustRequest{CACerts: caCerts}}, ordinaryReply)
	return err
}

// Renew renews a restored guest's randomness, clock and identity (see
// agentproto.RenewRequest).
func (c *Client) Renew(ctx context.Context, req agentproto.RenewRequest) error {
	_, err := c.roundTrip(ctx, &agentproto.Request{Method: agentproto.MethodRenew, Renew: &req}, ordinaryReply)
	return err
}

// Detach asks the agent to end this session and wait for a new Hello: the
// host detaches before it saves a guest, so that a restored guest is ready
// for a new connection. The client is closed after it. The agent ends the
// session as soon as it has answered, and its answer can be lost with the
// session: a connection lost under the call ended the session all the
// same, so it is a detach too.
func (c *Client) Detach(ctx context.Context) error {
	defer c.Close()
	_, err := c.roundTrip(ctx, &agentproto.Request{Method: agentproto.MethodDetach}, ordinaryReply)
	if err != nil && ctx.Err() == nil && c.ending.Load() == nil && errdefs.Code(err) == "guest_unavailable" {
		return nil
	}
	return err
}

// Exec runs a command. See api.Manager.Exec for the streaming contract.
func (c *Client) Exec(ctx context.Context, req agentproto.ExecRequest, onEvent func(agentproto.Event) error) (*agentproto.ExecResult, error) {
	fc, done, err := c.call(ctx, &agentproto.Request{Method: agentproto.MethodExec, Exec: &req})
	if err != nil {
		return nil, err
	}
	defer done()
	if !req.Stream {
		// The result carries the captured output: up to a frame.
		var rep agentproto.Reply
		if err := c.readJSON(ctx, fc, agentproto.MethodExec, readLimit{bytes: maxListReply}, &rep); err != nil {
			return nil, err
		}
		if rep.Error != nil {
			return nil, wireError(rep.Error)
		}
		if rep.Exit == nil {
			return nil, c.missing(agentproto.MethodExec, "result")
		}
		return rep.Exit, nil
	}
	for {
		// A streaming call's frames are Events, except a Reply error sent
		// before the process started; both decode into Event's shape.
		var ev agentproto.Event
		if err := c.readJSON(ctx, fc, agentproto.MethodExec, eventFrame, &ev); err != nil {
			return nil, err
		}
		switch {
		case ev.Error != nil:
			return nil, wireError(ev.Error)
		case ev.Type == "exit":
			if ev.Exit == nil {
				return nil, c.missing(agentproto.MethodExec, "result in its exit event")
			}
			if onEvent != nil {
				if err := onEvent(ev); err != nil {
					return ev.Exit, err
				}
			}
			return ev.Exit, nil
		}
		if onEvent != nil {
			if err := onEvent(ev); err != nil {
				return nil, err
			}
		}
	}
}

// Spawn starts a process that outlives the call.
func (c *Client) Spawn(ctx context.Context, req agentproto.ExecRequest) (*agentproto.ProcessInfo, error) {
	req.Stream = false
	rep, err := c.roundTrip(ctx, &agentproto.Request{Method: agentproto.MethodSpawn, Exec: &req}, processReply)
	if err != nil {
		return nil, err
	}
	if rep.Process == nil {
		return nil, c.missing(agentproto.MethodSpawn, "process")
	}
	return rep.Process, nil
}

// processReply bounds a reply carrying a ProcessInfo, whose command may be
// as long as a request body.
var processReply = readLimit{bytes: maxListReply}

// Processes lists the processes the agent knows.
func (c *Client) Processes(ctx context.Context) ([]agentproto.ProcessInfo, error) {
	rep, err := c.roundTrip(ctx, &agentproto.Request{Method: agentproto.MethodProcessList},
		readLimit{bytes: maxListReply, listKey: "processes", maxItems: agentproto.MaxProcessList})
	if err != nil {
		return nil, err
	}
	if rep.Processes == nil {
		return []agentproto.ProcessInfo{}, nil
	}
	return rep.Processes, nil
}

// Process describes one process.
func (c *Client) Process(ctx context.Context, id string) (*agentproto.ProcessInfo, error) {
	rep, err := c.roundTrip(ctx, &agentproto.Request{Method: agentproto.MethodProcessGet, Process: &agentproto.ProcessRequest{ID: id}}, processReply)
	if err != nil {
		return nil, err
	}
	if rep.Process == nil {
		return nil, c.missing(agentproto.MethodProcessGet, "process")
	}
	return rep.Process, nil
}

// Signal sends a signal to a process's group.
func (c *Client) Signal(ctx context.Context, id, signal string) (*agentproto.ProcessInfo, error) {
	rep, err := c.roundTrip(ctx, &agentproto.Request{Method: agentproto.MethodProcessSignal, Process: &agentproto.ProcessRequest{ID: id, Signal: signal}}, processReply)
	if err != nil {
		return nil, err
	}
	if rep.Process == nil {
		return nil, c.missing(agentproto.MethodProcessSignal, "process")
	}
	return rep.Process, nil
}

// Write sends input to a process started with StdinPipe or Pty: data at
// offset (nil: after what was accepted), ending its input with eof. The
// answer's StdinOffset is how far input was accepted, which may be short
// of the data's end when the process's input buffer is full.
func (c *Client) Write(ctx context.Context, id string, data []byte, offset *int64, eof bool) (*agentproto.ProcessInfo, error) {
	req := &agentproto.Request{Method: agentproto.MethodProcessWrite,
		Process: &agentproto.ProcessRequest{ID: id, Input: data, InputOffset: offset, EOF: eof}}
	rep, err := c.roundTrip(ctx, req, processReply)
	if err != nil {
		return nil, err
	}
	if rep.Process == nil {
		return nil, c.missing(agentproto.MethodProcessWrite, "process")
	}
	return rep.Process, nil
}

// Resize sets the window size of a Pty process's terminal.
func (c *Client) Resize(ctx context.Context, id string, size agentproto.PtySize) (*agentproto.ProcessInfo, error) {
	req := &agentproto.Request{Method: agentproto.MethodProcessResize,
		Process: &agentproto.ProcessRequest{ID: id, Size: &size}}
	rep, err := c.roundTrip(ctx, req, processReply)
	if err != nil {
		return nil, err
	}
	if rep.Process == nil {
		return nil, c.missing(agentproto.MethodProcessResize, "process")
	}
	return rep.Process, nil
}

// ProcessOutput streams a process's kept output from req.Cursor to onEvent.
func (c *Client) ProcessOutput(ctx context.Context, req agentproto.ProcessRequest, onEvent func(agentproto.Event) error) error {
	fc, done, err := c.call(ctx, &agentproto.Request{Method: agentproto.MethodProcessOutput, Process: &req})
	if err != nil {
		return err
	}
	defer done()
	for {
		// The exit event carries what a non-streamed exec captured:
		// up to a frame.
		var ev agentproto.Event
		if err := c.readJSON(ctx, fc, agentproto.MethodProcessOutput, readLimit{bytes: maxListReply, eofOK: true}, &ev); err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
		if ev.Error != nil {
			return wireError(ev.Error)
		}
		if err := onEvent(ev); err != nil {
			return err
		}
		if ev.Type == "exit" {
			return nil
		}
	}
}
