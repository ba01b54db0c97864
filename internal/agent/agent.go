package agent

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/yamux"
	"golang.org/x/sys/unix"

	"github.com/emberbox/emberbox/internal/agentproto"
)

// Config configures an Agent.
type Config struct {
	// Root is where /etc/passwd and /etc/group are read from ("/" in a guest).
	Root string
	// User is the account commands run as by default ("user" in a guest).
	User   string
	Logger *slog.Logger
	// System is what renew changes besides files under Root. Nil means
	// the running kernel's when the agent is PID 1 (a guest's init) and
	// none otherwise: renew is then refused.
	System System
	// TrimCachesAfter, if positive, drops the kernel's page cache once
	// the host has sent no work for that long (trim.go). Only for a
	// guest's agent: it acts on the whole kernel.
	TrimCachesAfter time.Duration
}

// Agent serves the host's calls.
type Agent struct {
	log      *slog.Logger
	accounts map[string]*account
	names    names
	user     *account
	bash     string
	reaper   *reaper
	procs    *processTable
	watches  *watchSet
	bootedAt time.Time
	root     string // where renew writes /etc/hostname and the like
	sys      System // nil: renew is refused
	renewMu  sync.Mutex
	trim     *cacheTrimmer // nil: never trims

	mu  sync.Mutex
	env map[string]string // sandbox-wide env from configure
	// secretEnv holds the egress secrets' placeholders (secrets.env),
	// under env: the sandbox's own variables win.
	secretEnv map[string]string
	caSet     bool // configure installed extra CA certificates
	relay     bool // the egress relay runs: commands get proxy env
	sessMu    sync.Mutex
	sess      *yamux.Session // the host session egress streams are opened on

	volMu sync.Mutex
	vols  map[string]*volume // attached volumes by attachment id
}

// New returns an Agent. It must be the only code in the process that waits
// for children.
func New(cfg Config) (*Agent, error) {
	if cfg.Root == "" {
		cfg.Root = "/"
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	accts, names, err := readAccounts(cfg.Root)
	if err != nil {
		return nil, fmt.Errorf("reading accounts: %w", err)
	}
	u, ok := accts[cfg.User]
	if !ok {
		return nil, fmt.Errorf("no account %q", cfg.User)
	}
	sys := cfg.System
	if sys == nil {
		sys = defaultSystem()
	}
	bash, err := exec.LookPath("bash")
	if err != nil {
		bash = "/bin/bash"
	}
	a := &Agent{
		log: log, accounts: accts, names: names, user: u, bash: bash,
		reaper: theReaper(), procs: &processTable{procs: map[string]*process{}}, watches: newWatchSet(),
		bootedAt: time.Now(), root: cfg.Root, sys: sys,
	}
	if cfg.TrimCachesAfter > 0 {
		a.trim = &cacheTrimmer{after: cfg.TrimCachesAfter, drop: dropCaches}
		a.trim.last.Store(time.Now().UnixNano())
	}
	return a, nil
}

// Run runs cmd through the agent's reaper and waits for it. Use it instead
// of cmd.Run for housekeeping commands.
func (a *Agent) Run(cmd *exec.Cmd) error { return a.reaper.run(cmd) }

// ServePort serves host connections on a virtio-serial port device forever.
// A host that disconnects (the server restarted) may connect again: each
// connection starts with a fresh handshake and yamux session.
func (a *Agent) ServePort(ctx context.Context, dev string) error {
	if a.trim != nil {
		go a.trim.run(ctx, a.log.Info)
	}
	for ctx.Err() == nil {
		f, err := openPort(ctx, dev)
		if err != nil {
			return err
		}
		err = a.ServeConn(ctx, f)
		f.Close()
		if err != nil && !errors.Is(err, io.EOF) {
			a.log.Warn("host connection ended", "err", err)
		}
	}
	return ctx.Err()
}

// portBusyWait bounds how long openPort waits for the port's last file to
// be released.
const portBusyWait = 30 * time.Second

// openPort opens the virtio-serial port dev, which takes one open file at
// a time (EBUSY otherwise). The file of the session that just ended can
// outlive its Close for a moment: a child forked at that instant holds it
// until its exec closes it, and under emulation, or in a guest saved and
// restored in that window, the moment is long. So EBUSY is waited out.
func openPort(ctx context.Context, dev string) (*os.File, error) {
	deadline := time.Now().Add(portBusyWait)
	for {
		f, err := os.OpenFile(dev, os.O_RDWR, 0)
		if err == nil {
			return f, nil
		}
		if !errors.Is(err, unix.EBUSY) || time.Now().After(deadline) {
			return nil, fmt.Errorf("opening %s: %w", dev, err)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// ServeConn runs one handshake and yamux session on rwc until the host goes
// away. While no host is connected a virtio-serial port reads as EOF, so the
// handshake wait polls gently.
func (a *Agent) ServeConn(ctx context.Context, rwc io.ReadWriteCloser) error {
	br := bufio.NewReaderSize(rwc, 64<<10)
	if err := handshake(ctx, br, rwc); err != nil {
		return err
	}
	if err := skipHellos(br); err != nil {
		return err
	}
	a.log.Info("host connected")
	cfg := yamux.DefaultConfig()
	cfg.LogOutput = io.Discard
	cfg.MaxStreamWindowSize = 1 << 20
	cfg.ConnectionWriteTimeout = 30 * time.Second
	sess, err := yamux.Server(struct {
		io.Reader
		io.Writer
		io.Closer
	}{br, rwc, rwc}, cfg)
	if err != nil {
		return fmt.Errorf("starting session: %w", err)
	}
	defer a.closeSession(sess)
	a.setSession(sess)
	defer a.setSession(nil)
	stop := context.AfterFunc(ctx, func() { sess.Close() })
	defer stop()
	ctx = context.WithValue(ctx, sessionKey{}, sess) // for detach
	for {
		st, err := sess.AcceptStream()
		if err != nil {
			return err
		}
		go a.handle(ctx, st)
	}
}

// handshake skips everything until a Hello line and answers Ready with the
// same nonce. Stale bytes from an earlier connection are thereby ignored.
func handshake(ctx context.Context, br *bufio.Reader, w io.Writer) error {
	for ctx.Err() == nil {
		line, err := br.ReadString('\n')
		if err != nil {
			if errors.Is(err, io.EOF) {
				// No host connected: a virtio-serial port reads EOF.
				time.Sleep(100 * time.Millisecond)
				continue
			}
			return fmt.Errorf("waiting for hello: %w", err)
		}
		nonce, ok := strings.CutPrefix(strings.TrimRight(line, "\r\n"), agentproto.HelloPrefix)
		if !ok || len(nonce) == 0 || len(nonce) > 64 {
			continue
		}
		_, err = fmt.Fprintf(w, "%s%s %d\n", agentproto.ReadyPrefix, nonce, agentproto.Version)
		return err
	}
	return ctx.Err()
}

// slowTeardown is how long ending a session may take before the agent
// reports what its goroutines are doing: a session that does not end keeps
// the agent from the next host's Hello, and its stacks say why.
const slowTeardown = 5 * time.Second

// closeSession ends sess, and logs every goroutine's stack if that takes
// longer than slowTeardown (once per session).
func (a *Agent) closeSession(sess *yamux.Session) {
	t := time.AfterFunc(slowTeardown, func() {
		buf := make([]byte, 256<<10)
		buf = buf[:runtime.Stack(buf, true)]
		a.log.Warn("ending the host session is slow; goroutines follow", "after", slowTeardown, "stacks", string(buf))
	})
	defer t.Stop()
	_ = sess.Close()
}

// sessionKey is the context key of the session a call came on.
type sessionKey struct{}

// skipHellos drops the repeats of the Hello just answered: the host repeats
// it until the Ready line reaches it, and every repeat comes before the
// session's first frame, which starts with yamux's version byte, 0.
func skipHellos(br *bufio.Reader) error {
	for {
		b, err := br.Peek(1)
		if err != nil {
			return fmt.Errorf("waiting for the session: %w", err)
		}
		if b[0] != agentproto.HelloPrefix[0] {
			return nil
		}
		line, err := br.ReadSlice('\n')
		if err != nil && !errors.Is(err, bufio.ErrBufferFull) {
			return fmt.Errorf("waiting for the session: %w", err)
		}
		if !strings.HasPrefix(string(line), agentproto.HelloPrefix) {
			return fmt.Errorf("waiting for the session: unexpected %q", line)
		}
	}
}

// handle serves one call.
func (a *Agent) handle(ctx context.Context, st *yamux.Stream) {
	defer st.Close()
	c := agentproto.NewConn(st)
	var req agentproto.Request
	if err := c.ReadJSON(&req); err != nil {
		return
	}
	if a.trim != nil && working(req.Method) {
		a.trim.begin()
		defer func() { a.trim.end(time.Now()) }()
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if req.Method == agentproto.MethodPortConnect {
		// The stream carries a connection's bytes after the reply.
		a.connectPort(ctx, c, st, req.Port)
		return
	}
	if !sendsData(req.Method) {
		// The host sends nothing more, so a read returns only when it
		// closes the stream: it gave up on the call. Cancel, and fail
		// writes blocked on a reader that is gone.
		go func() {
			var b [1]byte
			_, _ = st.Read(b[:])
			cancel()
		}()
	}
	stop := context.AfterFunc(ctx, func() { _ = st.SetWriteDeadline(time.Unix(1, 0)) })
	defer stop()
	if err := a.dispatch(ctx, c, &req); err != nil {
		var pe *agentproto.Error
		if !errors.As(err, &pe) {
			pe = internal(err)
		}
		_ = c.WriteJSON(agentproto.Reply{Error: pe})
	}
}

// sendsData reports whether the host sends data frames after a request of
// method.
func sendsData(method string) bool {
	return method == agentproto.MethodFileWrite || method == agentproto.MethodFileUnarchive
}

// exec runs a command to its end. Streamed, every frame is an Event and the
// last is "exit"; otherwise one Reply carries the result.
func (a *Agent) exec(ctx context.Context, c *agentproto.Conn, req *agentproto.ExecRequest) error {
	if !req.Stream {
		maxOut := req.MaxOutput
		if maxOut <= 0 {
			maxOut = 64 << 10
		}
		p, err := a.start(req, nil, &capture{max: maxOut})
		if err != nil {
			return err
		}
		// The command runs to its own timeout even if the host goes away.
		if err := p.wait(context.Background()); err != nil {
			return err
		}
		p.mu.Lock()
		res := p.resultLocked()
		p.mu.Unlock()
		return c.WriteJSON(agentproto.Reply{Exit: res})
	}

	var wmu sync.Mutex
	send := func(ev agentproto.Event) error {
		if err := ctx.Err(); err != nil {
			return err
		}
		wmu.Lock()
		defer wmu.Unlock()
		return c.WriteJSON(ev)
	}
	// The start event must precede any output, so the sink holds output
	// until it has been sent.
	started := make(chan struct{})
	sinkFn := func(ev agentproto.Event) error {
		<-started
		return send(ev)
	}
	p, err := a.start(req, sinkFn, nil)
	if err != nil {
		close(started)
		return err
	}
	err = send(agentproto.Event{Type: "start", ProcessID: p.id})
	close(started)
	if err != nil {
		return nil
	}
	_ = p.wait(context.Background())
	// Output delivery is synchronous with emit, so once the process has
	// ended every byte has been offered to the sink.
	p.emitMu.Lock()
	p.mu.Lock()
	res := p.resultLocked()
	next := p.next
	p.mu.Unlock()
	p.emitMu.Unlock()
	return send(agentproto.Event{Type: "exit", Offset: next, Exit: res})
}

// dataReader reads the payloads of consecutive data frames as one stream.
func dataReader(c *agentproto.Conn) io.Reader { return &frameReader{c: c} }

type frameReader struct {
	c   *agentproto.Conn
	buf []byte
}

func (r *frameReader) Read(p []byte) (int, error) {
	for len(r.buf) == 0 {
		kind, payload, err := r.c.ReadFrame()
		if err != nil {
			return 0, err
		}
		if kind != agentproto.KindData {
			return 0, invalid("expected data frame")
		}
		r.buf = payload
	}
	n := copy(p, r.buf)
	r.buf = r.buf[n:]
	return n, nil
}

func (a *Agent) info() *agentproto.Info {
	var uts unix.Utsname
	_ = unix.Uname(&uts)
	info := &agentproto.Info{
		Version:       agentproto.Version,
		KernelRelease: unix.ByteSliceToString(uts.Release[:]),
		BootedAt:      a.bootedAt,
		CPUs:          runtime.NumCPU(),
	}
	var si unix.Sysinfo_t
	if unix.Sysinfo(&si) == nil {
		info.UptimeMs = si.Uptime * 1000
		info.MemTotalKiB = int64(si.Totalram) * int64(si.Unit) / 1024
	}
	if b, err := os.ReadFile("/proc/stat"); err == nil {
		info.CPUBusyMs = cpuBusyMs(b)
	}
	if b, err := os.ReadFile("/proc/vmstat"); err == nil {
		info.OOMKills = oomKills(b)
	}
	return info
}

// oomKills reads the oom_kill counter of /proc/vmstat (Linux 4.13 on); 0
// when it is missing.
func oomKills(vmstat []byte) int64 {
	for line := range strings.Lines(string(vmstat)) {
		if v, ok := strings.CutPrefix(line, "oom_kill "); ok {
			n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			if err != nil || n < 0 {
				return 0
			}
			return n
		}
	}
	return 0
}

// cpuBusyMs reads the busy time from the "cpu" line of /proc/stat, in
// USER_HZ ticks of 10 ms: user, nice, system, irq and softirq (guest time
// is already inside user and nice), leaving out idle, iowait and steal.
func cpuBusyMs(stat []byte) int64 {
	line, _, _ := strings.Cut(string(stat), "\n")
	f := strings.Fields(line)
	if len(f) < 9 || f[0] != "cpu" {
		return 0
	}
	var busy int64
	for _, i := range []int{1, 2, 3, 6, 7} {
		v, err := strconv.ParseInt(f[i], 10, 64)
		if err != nil || v < 0 {
			return 0
		}
		busy += v
	}
	return busy * 10
}
