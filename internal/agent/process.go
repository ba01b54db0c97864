package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/emberbox/emberbox/internal/agentproto"
)

const (
	// ringBytes is how much output the agent keeps per process for readers
	// that attach later (the API's processes/{id}/output).
	ringBytes = 1 << 20
	// keepEnded is how many ended processes stay listed.
	keepEnded = 256
	// drainAfterExit bounds how long the agent waits for the output pipes to
	// close after the process group is gone; a daemon that escaped the group
	// with setsid could otherwise hold them open forever.
	drainAfterExit = 2 * time.Second
)

// chunk is one piece of output at a cumulative offset across both streams.
type chunk struct {
	stream string
	offset int64
	data   []byte
}

// sink receives output as it is produced, in offset order. Returning an error
// detaches the sink; the process keeps running.
type sink func(ev agentproto.Event) error

// process is one command started by exec or spawn.
type process struct {
	id      string
	command string
	argv    []string
	cwd     string
	timeout time.Duration
	started time.Time
	pid     int    // set once under mu, after the process is listed
	user    string // the account's name
	// encoding is the host's choice of output encoding, kept for it.
	encoding string
	// in is the input of a StdinPipe or Pty process, else nil; tty is
	// the terminal's master of a Pty process, else nil.
	in  *stdin
	tty *os.File
	// ended closes when the process has ended (stops the input copier).
	done chan struct{}

	// emitMu serializes output delivery so offsets reach sinks in order.
	emitMu sync.Mutex

	mu       sync.Mutex
	chunks   []chunk // the last ringBytes of output
	kept     int64   // bytes in chunks
	next     int64   // offset of the next byte
	sink     sink
	capture  *capture
	ended    *time.Time
	exitCode *int
	state    string
	timedOut bool
	size     *agentproto.PtySize // the terminal's size, under mu
	changed  chan struct{}       // closed and replaced on every change
}

// capture keeps the head of each stream for a non-streamed exec.
type capture struct {
	max                  int64
	stdout, stderr       []byte
	stdoutTrunc, errTrun bool
}

func (c *capture) add(stream string, b []byte) {
	buf, trunc := &c.stdout, &c.stdoutTrunc
	if stream == agentproto.Stderr {
		buf, trunc = &c.stderr, &c.errTrun
	}
	room := c.max - int64(len(*buf))
	if int64(len(b)) > room {
		b = b[:max(room, 0)]
		*trunc = true
	}
	*buf = append(*buf, b...)
}

func (p *process) notifyLocked() {
	close(p.changed)
	p.changed = make(chan struct{})
}

// emit records output and hands it to the sink, if any.
func (p *process) emit(stream string, b []byte) {
	p.emitMu.Lock()
	defer p.emitMu.Unlock()
	data := append([]byte(nil), b...)

	p.mu.Lock()
	off := p.next
	p.next += int64(len(data))
	p.chunks = append(p.chunks, chunk{stream: stream, offset: off, data: data})
	p.kept += int64(len(data))
	for p.kept > ringBytes && len(p.chunks) > 1 {
		p.kept -= int64(len(p.chunks[0].data))
		p.chunks[0] = chunk{}
		p.chunks = p.chunks[1:]
	}
	if p.capture != nil {
		p.capture.add(stream, data)
	}
	s := p.sink
	p.notifyLocked()
	p.mu.Unlock()

	if s != nil {
		// Delivered outside p.mu but under emitMu: a slow reader blocks the
		// command's output (backpressure), never the process table.
		if err := s(agentproto.Event{Type: stream, Data: data, Offset: off}); err != nil {
			p.mu.Lock()
			p.sink = nil
			p.mu.Unlock()
		}
	}
}

func (p *process) info() agentproto.ProcessInfo {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.infoLocked()
}

func (p *process) infoLocked() agentproto.ProcessInfo {
	first := p.next - p.kept
	info := agentproto.ProcessInfo{
		ID: p.id, State: p.state, ExitCode: p.exitCode, Command: p.command, Argv: p.argv,
		Cwd: p.cwd, PID: p.pid, StartedAt: p.started, EndedAt: p.ended,
		TimeoutMs: p.timeout.Milliseconds(), OutputBytes: p.next, FirstOffset: first,
		User: p.user, OutputEncoding: p.encoding,
	}
	if p.size != nil {
		size := *p.size
		info.Pty = &size
	}
	if p.in != nil {
		info.StdinOpen, info.StdinOffset = p.in.state()
		info.StdinOpen = info.StdinOpen && p.ended == nil
	}
	return info
}

func (p *process) resultLocked() *agentproto.ExecResult {
	r := &agentproto.ExecResult{
		ProcessID: p.id, ExitCode: p.exitCode, TimedOut: p.timedOut, State: p.state,
	}
	end := time.Now()
	if p.ended != nil {
		end = *p.ended
	}
	r.DurationMs = end.Sub(p.started).Milliseconds()
	if c := p.capture; c != nil {
		r.Stdout, r.Stderr = c.stdout, c.stderr
		r.StdoutTruncated, r.StderrTruncated = c.stdoutTrunc, c.errTrun
	}
	return r
}

// processTable holds every process the agent started.
type processTable struct {
	mu    sync.Mutex
	seq   int
	procs map[string]*process
}

func (t *processTable) add(p *process) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.seq++
	p.id = "proc_" + strconv.Itoa(t.seq)
	t.procs[p.id] = p
	t.pruneLocked()
}

// pruneLocked forgets the oldest ended processes beyond keepEnded.
func (t *processTable) pruneLocked() {
	var ended []*process
	for _, p := range t.procs {
		p.mu.Lock()
		if p.ended != nil {
			ended = append(ended, p)
		}
		p.mu.Unlock()
	}
	if len(ended) <= keepEnded {
		return
	}
	sort.Slice(ended, func(i, j int) bool { return ended[i].started.Before(ended[j].started) })
	for _, p := range ended[:len(ended)-keepEnded] {
		delete(t.procs, p.id)
	}
}

func (t *processTable) get(id string) (*process, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	p, ok := t.procs[id]
	if !ok {
		return nil, &agentproto.Error{Code: agentproto.CodeProcessNotFound, Message: fmt.Sprintf("no process %q", id)}
	}
	return p, nil
}

func (t *processTable) list() []agentproto.ProcessInfo {
	t.mu.Lock()
	ps := make([]*process, 0, len(t.procs))
	for _, p := range t.procs {
		ps = append(ps, p)
	}
	t.mu.Unlock()
	sort.Slice(ps, func(i, j int) bool { return ps[i].started.Before(ps[j].started) })
	// The host refuses a longer list; the newest processes matter most.
	ps = ps[max(0, len(ps)-agentproto.MaxProcessList):]
	out := make([]agentproto.ProcessInfo, 0, len(ps))
	for _, p := range ps {
		out = append(out, p.info())
	}
	return out
}

// start launches req as a new process. sink, if set, receives the output
// from the first byte; capture, if set, keeps the head of each stream.
func (a *Agent) start(req *agentproto.ExecRequest, s sink, c *capture) (*process, error) {
	if err := checkExec(req); err != nil {
		return nil, err
	}
	acct, err := a.account(req.User)
	if err != nil {
		return nil, err
	}
	env := a.environ(acct, req.Env)
	cwd := resolvePath(acct.home, req.Cwd)

	var cmd *exec.Cmd
	var display string
	if req.Command != "" {
		cmd = &exec.Cmd{Path: a.bash, Args: []string{"bash", "-c", req.Command}}
		display = req.Command
	} else {
		path, err := lookPath(req.Argv[0], env)
		if err != nil {
			return a.startFailed(req, cwd, s, c, req.Argv[0]+": command not found\n", 127)
		}
		cmd = &exec.Cmd{Path: path, Args: req.Argv}
		display = strings.Join(req.Argv, " ")
	}
	cmd.Env = env
	cmd.Dir = cwd
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if acct.uid != os.Getuid() {
		cmd.SysProcAttr.Credential = &syscall.Credential{
			Uid: uint32(acct.uid), Gid: uint32(acct.gid), Groups: acct.groups,
		}
	}

	pio, err := openIO(req, cmd)
	if err != nil {
		return nil, err
	}
	p := &process{
		command: display, argv: req.Argv, cwd: cwd, user: acct.name, encoding: req.OutputEncoding,
		timeout: time.Duration(req.TimeoutMs) * time.Millisecond,
		state:   agentproto.StateRunning, sink: s, capture: c,
		changed: make(chan struct{}), done: make(chan struct{}),
		in: pio.in, tty: pio.tty,
	}
	if req.Pty != nil {
		size := *req.Pty
		p.size = &size
	}
	p.started = time.Now()
	a.procs.add(p)
	status, err := a.reaper.start(cmd)
	pio.closeChildEnds()
	if err != nil {
		pio.closeParentEnds()
		a.procs.mu.Lock()
		delete(a.procs.procs, p.id)
		a.procs.mu.Unlock()
		return nil, startError(err)
	}
	// Under p.mu: the process is listed (and may be signalled) already.
	p.mu.Lock()
	p.pid = cmd.Process.Pid
	p.mu.Unlock()
	if pio.stdinW != nil {
		go func() {
			_, _ = pio.stdinW.Write(req.Stdin)
			pio.stdinW.Close()
		}()
	}
	if p.in != nil {
		go p.in.run(p.done)
	}
	go a.supervise(p, status, pio.outputs)
	return p, nil
}

// checkExec refuses a request that names no command or both forms of
// one, or whose input and terminal settings contradict each other.
func checkExec(req *agentproto.ExecRequest) error {
	if (req.Command == "") == (len(req.Argv) == 0) {
		return invalid("exactly one of command and argv is required")
	}
	if req.Pty != nil {
		if err := checkPtySize(req.Pty); err != nil {
			return err
		}
		if len(req.Stdin) > 0 {
			return invalid("give a pty process its input with process.write, not stdin")
		}
	}
	if req.StdinPipe && len(req.Stdin) > 0 {
		return invalid("give stdin or stdinPipe, not both")
	}
	return nil
}

// startError is the answer to a command the kernel would not start: a
// missing program or directory is file_not_found.
func startError(err error) *agentproto.Error {
	if errors.Is(err, os.ErrNotExist) || errors.Is(err, syscall.ENOTDIR) {
		return &agentproto.Error{Code: agentproto.CodeFileNotFound, Message: fmt.Sprintf("starting command: %v", err)}
	}
	return &agentproto.Error{Code: agentproto.CodeInvalid, Message: fmt.Sprintf("starting command: %v", err)}
}

// startFailed records a process that could not start, the way a shell
// reports it, so callers see an ordinary result rather than an error.
func (a *Agent) startFailed(req *agentproto.ExecRequest, cwd string, s sink, c *capture, msg string, code int) (*process, error) {
	now := time.Now()
	p := &process{
		command: strings.Join(req.Argv, " "), argv: req.Argv, cwd: cwd, started: now,
		state: agentproto.StateRunning, sink: s, capture: c, changed: make(chan struct{}),
	}
	a.procs.add(p)
	go func() {
		p.emit(agentproto.Stderr, []byte(msg))
		p.mu.Lock()
		p.ended, p.exitCode, p.state = &now, &code, agentproto.StateExited
		p.notifyLocked()
		p.mu.Unlock()
	}()
	return p, nil
}

// supervise copies output, enforces the timeout and records the exit.
func (a *Agent) supervise(p *process, status <-chan unix.WaitStatus, outputs []output) {
	var readers sync.WaitGroup
	for _, r := range outputs {
		readers.Add(1)
		go func() {
			defer readers.Done()
			buf := make([]byte, 32<<10)
			for {
				n, err := r.f.Read(buf)
				if n > 0 {
					p.emit(r.stream, buf[:n])
				}
				if err != nil {
					// A terminal's master reads EIO once no process
					// has the terminal open: its end of file.
					return
				}
			}
		}()
	}
	closeOutputs := func() {
		for _, r := range outputs {
			r.f.Close()
		}
	}

	var timer <-chan time.Time
	if p.timeout > 0 {
		t := time.NewTimer(p.timeout)
		defer t.Stop()
		timer = t.C
	}
	var ws unix.WaitStatus
	timedOut := false
	select {
	case ws = <-status:
	case <-timer:
		timedOut = true
		_ = unix.Kill(-p.pid, unix.SIGKILL)
		ws = <-status
	}
	// Whatever the command left behind in its group ends with it.
	_ = unix.Kill(-p.pid, unix.SIGKILL)
	// Its input ends too: a blocked copy into the pipe is released.
	close(p.done)
	if p.in != nil {
		p.in.close()
	}

	done := make(chan struct{})
	go func() { readers.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(drainAfterExit):
		closeOutputs()
		<-done
	}
	closeOutputs()

	now := time.Now()
	p.mu.Lock()
	p.ended = &now
	p.timedOut = timedOut
	switch {
	case timedOut:
		p.state = agentproto.StateTimedOut
	case ws.Exited():
		code := ws.ExitStatus()
		p.exitCode = &code
		p.state = agentproto.StateExited
	case ws.Signaled():
		code := -int(ws.Signal())
		p.exitCode = &code
		p.state = agentproto.StateKilled
	}
	p.notifyLocked()
	p.mu.Unlock()
}

// wait blocks until p has ended or ctx is done.
func (p *process) wait(ctx context.Context) error {
	for {
		p.mu.Lock()
		ended, ch := p.ended != nil, p.changed
		p.mu.Unlock()
		if ended {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// signal sends sig to p's process group.
func (p *process) signal(sig unix.Signal) error {
	p.mu.Lock()
	ended, pid := p.ended != nil, p.pid
	p.mu.Unlock()
	// A pid of 0 is a process not yet started; -0 would be the agent's
	// own group.
	if ended || pid == 0 {
		return nil
	}
	if err := unix.Kill(-pid, sig); err != nil && err != unix.ESRCH {
		return internal(err)
	}
	return nil
}

// output sends p's kept output from cursor through send. With follow it
// continues until the process ends; otherwise it waits up to wait for the
// first byte. It ends with an "exit" event once the process has ended and
// everything kept was sent.
func (p *process) output(ctx context.Context, cursor int64, follow bool, wait time.Duration, send func(agentproto.Event) error) error {
	deadline := time.Now().Add(wait)
	for {
		p.mu.Lock()
		first := p.next - p.kept
		var pending []chunk
		for _, c := range p.chunks {
			if c.offset+int64(len(c.data)) <= cursor {
				continue
			}
			if c.offset < cursor {
				c.data = c.data[cursor-c.offset:]
				c.offset = cursor
			}
			pending = append(pending, c)
		}
		ended, ch := p.ended != nil, p.changed
		var res *agentproto.ExecResult
		if ended {
			res = p.resultLocked()
		}
		p.mu.Unlock()

		if cursor < first {
			if err := send(agentproto.Event{Type: "truncated", Offset: first, Dropped: first - cursor}); err != nil {
				return err
			}
			cursor = first
		}
		for _, c := range pending {
			if err := send(agentproto.Event{Type: c.stream, Data: c.data, Offset: c.offset}); err != nil {
				return err
			}
			cursor = c.offset + int64(len(c.data))
		}
		if ended {
			return send(agentproto.Event{Type: "exit", Offset: cursor, Exit: res})
		}
		if !follow && (len(pending) > 0 || !time.Now().Before(deadline)) {
			return nil
		}
		var timeout <-chan time.Time
		if !follow {
			t := time.NewTimer(time.Until(deadline))
			defer t.Stop()
			timeout = t.C
		}
		select {
		case <-ch:
		case <-timeout:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// lookPath finds file in the PATH of env, as the command would see it.
func lookPath(file string, env []string) (string, error) {
	if strings.Contains(file, "/") {
		return file, nil
	}
	path := ""
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "PATH="); ok {
			path = v
		}
	}
	for _, dir := range filepath.SplitList(path) {
		if dir == "" {
			continue
		}
		f := filepath.Join(dir, file)
		if st, err := os.Stat(f); err == nil && !st.IsDir() && st.Mode()&0o111 != 0 {
			return f, nil
		}
	}
	return "", io.EOF
}

// parseSignal accepts "SIGTERM", "TERM", "term" or a number.
func parseSignal(s string) (unix.Signal, error) {
	if s == "" {
		return unix.SIGTERM, nil
	}
	if n, err := strconv.Atoi(s); err == nil && n > 0 && n < 65 {
		return unix.Signal(n), nil
	}
	name := strings.ToUpper(s)
	if !strings.HasPrefix(name, "SIG") {
		name = "SIG" + name
	}
	if sig := unix.SignalNum(name); sig != 0 {
		return sig, nil
	}
	return 0, invalid(fmt.Sprintf("unknown signal %q", s))
}
