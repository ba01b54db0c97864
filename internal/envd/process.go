package envd

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"sync"
	"syscall"
	"time"

	"connectrpc.com/connect"

	"github.com/emberbox/emberbox/internal/envd/proto/process"
	"github.com/emberbox/emberbox/internal/errdefs"
	"github.com/emberbox/emberbox/internal/guest"
	"github.com/emberbox/emberbox/internal/sandbox"
)

const (
	// processRunning is the guest's state of a process that has not ended.
	processRunning = "running"

	// Keep-alive events on a quiet output stream: every
	// Keepalive-Ping-Interval seconds as E2B's SDKs ask, within bounds.
	defaultKeepAlive = 50 * time.Second
	minKeepAlive     = time.Second
	maxKeepAlive     = 5 * time.Minute

	// Input goes to the guest in pieces, each taken whole, waiting while
	// the process's input buffer is full.
	inputPiece    = 64 << 10
	inputFullWait = 20 * time.Millisecond

	maxTagLen = 256
)

// processService is E2B's process.Process over the guest's processes. An
// E2B pid is the process's pid in the guest; a tag is remembered here.
type processService struct{ s *Server }

func (p *processService) Start(ctx context.Context, req *connect.Request[process.StartRequest], stream *connect.ServerStream[process.StartResponse]) error {
	rt, err := target(ctx)
	if err != nil {
		return err
	}
	user, err := userFrom(req.Header())
	if err != nil {
		return err
	}
	cfg := req.Msg.GetProcess()
	if cfg.GetCmd() == "" {
		return invalidArg("process.cmd is required")
	}
	if len(req.Msg.GetTag()) > maxTagLen {
		return invalidArg(fmt.Sprintf("tag is longer than %d bytes", maxTagLen))
	}
	er := guest.ExecRequest{
		Argv:      append([]string{cfg.GetCmd()}, cfg.GetArgs()...),
		Env:       cfg.GetEnvs(),
		Cwd:       cfg.GetCwd(),
		User:      user,
		Detach:    true,
		StdinPipe: req.Msg.GetStdin(),
	}
	layoutExec(rt, &er)
	if req.Msg.Pty != nil {
		size, err := ptySize(req.Msg.GetPty())
		if err != nil {
			return err
		}
		er.Pty = size
	}
	// envd ends the process when the request's deadline (Connect-Timeout-Ms)
	// passes, not when the client goes: a background command outlives its
	// stream, a command with a timeout does not outlive the timeout.
	if dl, ok := ctx.Deadline(); ok {
		er.TimeoutMs = max(1, time.Until(dl).Milliseconds())
	}
	send := func(ev *process.ProcessEvent) error { return stream.Send(&process.StartResponse{Event: ev}) }
	tagged := func(info *guest.ProcessInfo) {
		if req.Msg.Tag != nil {
			p.s.tags.put(rt.Sandbox.ID, req.Msg.GetTag(), info.ID)
		}
	}
	every := keepAliveEvery(req.Header())
	if !er.StdinPipe && er.Pty == nil {
		return startStreamed(ctx, rt.Guest, er, every, tagged, send)
	}
	// Input needs a spawned process; its output is followed from the
	// guest's ring, which keeps the last MiB for a reader that falls behind.
	info, err := rt.Guest.Spawn(ctx, er)
	if err != nil {
		return rpcError(err)
	}
	tagged(info)
	return follow(ctx, rt.Guest, info, 0, every, send)
}

// startStreamed runs a process without input as a streamed exec: its
// output reaches the client with backpressure, none lost however fast it
// comes, as with envd. A client that goes detaches from it; the process
// runs on, and is found by pid or tag as any other.
func startStreamed(ctx context.Context, g guest.Handle, er guest.ExecRequest, every time.Duration, started func(*guest.ProcessInfo), send func(*process.ProcessEvent) error) error {
	er.Stream = true
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()
	emit := newEmitter(ctx, cancel, &wg, send)
	ended := false
	res, err := g.Exec(ctx, er, func(ev guest.Event) error {
		switch ev.Type {
		case "start":
			info, err := g.Process(ctx, ev.ProcessID)
			if err != nil {
				return err
			}
			started(info)
			pid, _ := e2bPID(info.PID)
			if err := emit.start(pid, every); err != nil {
				return err
			}
		case "exit":
			ended = true
			return emit.send(endEvent(ev.Exit))
		default:
			if d := dataEvent(ev, false); d != nil {
				return emit.send(d)
			}
		}
		return nil
	})
	if err != nil {
		return rpcError(err)
	}
	if !ended {
		if err := emit.send(endEvent(res)); err != nil {
			return err
		}
	}
	// The guest ends the process at the request's deadline; the request
	// itself ends as envd's does then, deadline_exceeded, whichever of
	// the two timers fired first.
	if res != nil && res.TimedOut && er.TimeoutMs > 0 {
		return connect.NewError(connect.CodeDeadlineExceeded, errors.New("the request's deadline passed; the process was ended"))
	}
	return nil
}

// Connect streams a running process's output from now on, as envd does.
func (p *processService) Connect(ctx context.Context, req *connect.Request[process.ConnectRequest], stream *connect.ServerStream[process.ConnectResponse]) error {
	rt, err := target(ctx)
	if err != nil {
		return err
	}
	info, err := p.s.lookup(ctx, rt, req.Msg.GetProcess())
	if err != nil {
		return err
	}
	send := func(ev *process.ProcessEvent) error { return stream.Send(&process.ConnectResponse{Event: ev}) }
	return follow(ctx, rt.Guest, info, info.OutputBytes, keepAliveEvery(req.Header()), send)
}

func (p *processService) List(ctx context.Context, _ *connect.Request[process.ListRequest]) (*connect.Response[process.ListResponse], error) {
	rt, err := target(ctx)
	if err != nil {
		return nil, err
	}
	list, err := rt.Guest.Processes(ctx)
	if err != nil {
		return nil, rpcError(err)
	}
	tagOf := map[string]string{}
	for tag, id := range p.s.tags.entries(rt.Sandbox.ID) {
		tagOf[id] = tag
	}
	out := &process.ListResponse{}
	for i := range list {
		info := &list[i]
		pid, ok := e2bPID(info.PID)
		if info.State != processRunning || !ok {
			continue
		}
		cfg := &process.ProcessConfig{}
		switch {
		case len(info.Argv) > 0:
			cfg.Cmd, cfg.Args = info.Argv[0], info.Argv[1:]
		default:
			cfg.Cmd, cfg.Args = "/bin/bash", []string{"-c", info.Command}
		}
		if info.Cwd != "" {
			cfg.Cwd = &info.Cwd
		}
		pi := &process.ProcessInfo{Config: cfg, Pid: pid}
		if tag, ok := tagOf[info.ID]; ok {
			pi.Tag = &tag
		}
		out.Processes = append(out.Processes, pi)
	}
	return connect.NewResponse(out), nil
}

func (p *processService) Update(ctx context.Context, req *connect.Request[process.UpdateRequest]) (*connect.Response[process.UpdateResponse], error) {
	rt, err := target(ctx)
	if err != nil {
		return nil, err
	}
	info, err := p.s.lookup(ctx, rt, req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	if req.Msg.Pty != nil {
		size, err := ptySize(req.Msg.GetPty())
		if err != nil {
			return nil, err
		}
		if _, err := rt.Guest.Resize(ctx, info.ID, *size); err != nil {
			return nil, rpcError(err)
		}
	}
	return connect.NewResponse(&process.UpdateResponse{}), nil
}

func (p *processService) SendInput(ctx context.Context, req *connect.Request[process.SendInputRequest]) (*connect.Response[process.SendInputResponse], error) {
	rt, err := target(ctx)
	if err != nil {
		return nil, err
	}
	info, err := p.s.lookup(ctx, rt, req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	if err := typeInto(ctx, rt.Guest, info.ID, inputBytes(req.Msg.GetInput())); err != nil {
		return nil, rpcError(err)
	}
	return connect.NewResponse(&process.SendInputResponse{}), nil
}

// StreamInput takes a start event naming the process, then its input.
// Over HTTP/1.1 the request body streams while nothing is answered, which
// is all a client stream needs.
func (p *processService) StreamInput(ctx context.Context, cs *connect.ClientStream[process.StreamInputRequest]) (*connect.Response[process.StreamInputResponse], error) {
	rt, err := target(ctx)
	if err != nil {
		return nil, err
	}
	id := ""
	for cs.Receive() {
		switch ev := cs.Msg().GetEvent().(type) {
		case *process.StreamInputRequest_Start:
			if id != "" {
				return nil, invalidArg("the stream was already started")
			}
			info, err := p.s.lookup(ctx, rt, ev.Start.GetProcess())
			if err != nil {
				return nil, err
			}
			id = info.ID
		case *process.StreamInputRequest_Data:
			if id == "" {
				return nil, invalidArg("input before the start event")
			}
			if err := typeInto(ctx, rt.Guest, id, inputBytes(ev.Data.GetInput())); err != nil {
				return nil, rpcError(err)
			}
		}
	}
	if err := cs.Err(); err != nil {
		return nil, err
	}
	return connect.NewResponse(&process.StreamInputResponse{}), nil
}

func (p *processService) SendSignal(ctx context.Context, req *connect.Request[process.SendSignalRequest]) (*connect.Response[process.SendSignalResponse], error) {
	rt, err := target(ctx)
	if err != nil {
		return nil, err
	}
	var sig string
	switch req.Msg.GetSignal() {
	case process.Signal_SIGNAL_SIGKILL:
		sig = "SIGKILL"
	case process.Signal_SIGNAL_SIGTERM:
		sig = "SIGTERM"
	default:
		return nil, invalidArg("signal must be SIGNAL_SIGKILL or SIGNAL_SIGTERM")
	}
	info, err := p.s.lookup(ctx, rt, req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	if _, err := rt.Guest.Signal(ctx, info.ID, sig); err != nil {
		return nil, rpcError(err)
	}
	return connect.NewResponse(&process.SendSignalResponse{}), nil
}

func (p *processService) CloseStdin(ctx context.Context, req *connect.Request[process.CloseStdinRequest]) (*connect.Response[process.CloseStdinResponse], error) {
	rt, err := target(ctx)
	if err != nil {
		return nil, err
	}
	info, err := p.s.lookup(ctx, rt, req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	if _, err := rt.Guest.Write(ctx, info.ID, nil, nil, true); err != nil {
		return nil, rpcError(err)
	}
	return connect.NewResponse(&process.CloseStdinResponse{}), nil
}

// lookup finds the running process a selector names: by its pid in the
// guest (the newest running one, should a pid have been reused), or by a
// tag given at its start.
func (s *Server) lookup(ctx context.Context, rt sandbox.Routed, sel *process.ProcessSelector) (*guest.ProcessInfo, error) {
	switch v := sel.GetSelector().(type) {
	case *process.ProcessSelector_Pid:
		list, err := rt.Guest.Processes(ctx)
		if err != nil {
			return nil, rpcError(err)
		}
		var found *guest.ProcessInfo
		for i := range list {
			p := &list[i]
			pid, ok := e2bPID(p.PID)
			if ok && pid == v.Pid && p.State == processRunning &&
				(found == nil || p.StartedAt.After(found.StartedAt)) {
				found = p
			}
		}
		if found == nil {
			return nil, notFound(fmt.Sprintf("process with pid %d not found", v.Pid))
		}
		return found, nil
	case *process.ProcessSelector_Tag:
		id, ok := s.tags.get(rt.Sandbox.ID, v.Tag)
		if !ok {
			return nil, notFound(fmt.Sprintf("process with tag %q not found", v.Tag))
		}
		info, err := rt.Guest.Process(ctx, id)
		if err != nil {
			return nil, rpcError(err)
		}
		if info.State != processRunning {
			return nil, notFound(fmt.Sprintf("process with tag %q not found", v.Tag))
		}
		return info, nil
	}
	return nil, invalidArg("a process selector (pid or tag) is required")
}

// follow sends a process's start event, then its output from cursor and
// its end, with keep-alive events while it is quiet. A process on a
// terminal has its output as pty data.
func follow(ctx context.Context, g guest.Handle, info *guest.ProcessInfo, cursor int64, every time.Duration, send func(*process.ProcessEvent) error) error {
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()
	emit := newEmitter(ctx, cancel, &wg, send)
	pid, _ := e2bPID(info.PID)
	if err := emit.start(pid, every); err != nil {
		return err
	}
	pty := info.Pty != nil
	ended := false
	err := g.ProcessOutput(ctx, guest.ProcessRequest{ID: info.ID, Cursor: cursor, Follow: true}, func(ev guest.Event) error {
		if ev.Type == "exit" {
			ended = true
			return emit.send(endEvent(ev.Exit))
		}
		if d := dataEvent(ev, pty); d != nil {
			return emit.send(d)
		}
		return nil // "truncated": what left the guest's buffer is gone
	})
	if err != nil {
		return rpcError(err)
	}
	if !ended {
		return connect.NewError(connect.CodeUnavailable, fmt.Errorf("the output of process %d ended before the process did", pid))
	}
	return nil
}

// emitter sends a stream's events one at a time, keep-alives among them.
type emitter struct {
	mu     sync.Mutex
	out    func(*process.ProcessEvent) error
	ctx    context.Context
	cancel context.CancelFunc
	wg     *sync.WaitGroup
}

// newEmitter returns the emitter of a stream; its start sends the start
// event, then keep-alives (in a goroutine of wg) until ctx ends. A failed
// keep-alive cancels ctx.
func newEmitter(ctx context.Context, cancel context.CancelFunc, wg *sync.WaitGroup, out func(*process.ProcessEvent) error) *emitter {
	return &emitter{out: out, ctx: ctx, cancel: cancel, wg: wg}
}

func (e *emitter) send(ev *process.ProcessEvent) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.out(ev)
}

func (e *emitter) start(pid uint32, every time.Duration) error {
	if err := e.send(&process.ProcessEvent{Event: &process.ProcessEvent_Start{Start: &process.ProcessEvent_StartEvent{Pid: pid}}}); err != nil {
		return err
	}
	e.wg.Go(func() {
		t := time.NewTicker(every)
		defer t.Stop()
		keep := &process.ProcessEvent{Event: &process.ProcessEvent_Keepalive{Keepalive: &process.ProcessEvent_KeepAlive{}}}
		for {
			select {
			case <-e.ctx.Done():
				return
			case <-t.C:
				if e.send(keep) != nil {
					e.cancel()
					return
				}
			}
		}
	})
	return nil
}

// dataEvent is a guest's output event as envd's, or nil for none.
func dataEvent(ev guest.Event, pty bool) *process.ProcessEvent {
	if len(ev.Data) == 0 {
		return nil
	}
	var data process.ProcessEvent_DataEvent
	switch {
	case ev.Type == guest.EventStdout && pty:
		data.Output = &process.ProcessEvent_DataEvent_Pty{Pty: ev.Data}
	case ev.Type == guest.EventStdout:
		data.Output = &process.ProcessEvent_DataEvent_Stdout{Stdout: ev.Data}
	case ev.Type == guest.EventStderr:
		data.Output = &process.ProcessEvent_DataEvent_Stderr{Stderr: ev.Data}
	default:
		return nil
	}
	return &process.ProcessEvent{Event: &process.ProcessEvent_Data{Data: &data}}
}

// endEvent is envd's end of a process: Go's ProcessState as it reports
// it. A process the guest ended (timeout, kill) died of SIGKILL.
func endEvent(r *guest.ExecResult) *process.ProcessEvent {
	end := &process.ProcessEvent_EndEvent{ExitCode: -1, Status: "signal: " + syscall.SIGKILL.String()}
	if r != nil && r.ExitCode != nil {
		switch c := *r.ExitCode; {
		case c >= 0:
			end.ExitCode, end.Exited, end.Status = int32(min(c, math.MaxInt32)), true, fmt.Sprintf("exit status %d", c)
		case c > -256:
			end.Status = "signal: " + syscall.Signal(-c).String()
		}
	}
	if !end.Exited || end.ExitCode != 0 {
		msg := end.Status
		end.Error = &msg
	}
	return &process.ProcessEvent{Event: &process.ProcessEvent_End{End: end}}
}

// e2bPID is a guest pid as E2B's uint32.
func e2bPID(pid int) (uint32, bool) {
	if pid <= 0 || pid > math.MaxUint32 {
		return 0, false
	}
	return uint32(pid), true
}

func ptySize(p *process.PTY) (*guest.PtySize, error) {
	cols, rows := p.GetSize().GetCols(), p.GetSize().GetRows()
	if cols < 1 || rows < 1 || cols > guest.MaxPtySide || rows > guest.MaxPtySide {
		return nil, invalidArg(fmt.Sprintf("pty size must be from 1 to %d on each side", guest.MaxPtySide))
	}
	return &guest.PtySize{Cols: int(cols), Rows: int(rows)}, nil
}

func inputBytes(in *process.ProcessInput) []byte {
	if b := in.GetPty(); b != nil {
		return b
	}
	return in.GetStdin()
}

// keepAliveEvery is the keep-alive interval a request asks for.
func keepAliveEvery(h http.Header) time.Duration {
	n, err := strconv.Atoi(h.Get("Keepalive-Ping-Interval"))
	if err != nil || n <= 0 {
		return defaultKeepAlive
	}
	return min(max(time.Duration(n)*time.Second, minKeepAlive), maxKeepAlive)
}

// typeInto appends data to a process's input in pieces, each taken whole
// by the guest, waiting while its input buffer is full.
func typeInto(ctx context.Context, g guest.Handle, id string, data []byte) error {
	for len(data) > 0 {
		piece := data[:min(len(data), inputPiece)]
		_, err := g.Write(ctx, id, piece, nil, false)
		if errdefs.Code(err) == guest.CodeStdinFull {
			t := time.NewTimer(inputFullWait)
			select {
			case <-t.C:
				continue
			case <-ctx.Done():
				t.Stop()
				return ctx.Err()
			}
		}
		if err != nil {
			return err
		}
		data = data[len(piece):]
	}
	return nil
}
