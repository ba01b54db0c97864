package mcpgateway

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"
)

// initWait bounds a server's start, from its spawn to its answer to
// initialize: a Python server's imports take seconds under software
// emulation.
const initWait = 3 * time.Minute

// A server that ends after it has run is started again, after a pause
// that doubles from restartBase up to restartCap, and the pause starts
// over once a run has lasted stableRun. After maxQuickRestarts restarts
// in a row whose runs were shorter, it stays failed: a server that cannot
// stay up says why rather than loop.
const (
	restartCap       = 30 * time.Second
	stableRun        = time.Minute
	maxQuickRestarts = 5
)

// server is one MCP server the gateway runs.
type server struct {
	spec        Server
	log         *slog.Logger
	changed     func() // the gateway rewrites its status
	logPath     string
	restartBase time.Duration

	mu       sync.Mutex
	state    string
	err      string
	started  *time.Time
	b        *bridge
	init     json.RawMessage // the server's answer to initialize
	name     string
	version  string
	restarts int
}

// status is s's state for the status file.
func (s *server) status() ServerStatus {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := ServerStatus{ID: s.spec.ID, State: s.state, Error: s.err, StartedAt: s.started, Name: s.name, Version: s.version,
		Restarts: s.restarts}
	if s.state == StateFailed {
		st.LogTail = logTail(s.logPath)
	}
	return st
}

// ready returns the bridge and the initialize answer of a running s.
func (s *server) ready() (*bridge, json.RawMessage, string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b, s.init, s.state
}

func (s *server) set(state, errText string) {
	s.mu.Lock()
	s.state, s.err = state, errText
	s.mu.Unlock()
	s.changed()
}

// run installs s if it must, starts it and serves it until ctx ends. A
// server that ran and ended is started again (see restartCap); one that
// fails its install or its first initialize, or keeps ending, stays
// failed and says why.
func (s *server) run(ctx context.Context) {
	logf, err := openLog(s.logPath)
	if err != nil {
		s.set(StateFailed, err.Error())
		return
	}
	defer logf.Close()
	if err := s.install(ctx, logf); err != nil {
		s.set(StateFailed, err.Error())
		return
	}
	s.set(StateStarting, "")
	quick, pause := 0, s.restartBase
	for {
		began := time.Now()
		ran, err := s.serve(ctx, logf)
		if ctx.Err() != nil {
			return
		}
		s.log.Warn("mcp server ended", "server", s.spec.ID, "err", err)
		if time.Since(began) >= stableRun {
			quick, pause = 0, s.restartBase
		}
		switch {
		case !ran:
			s.set(StateFailed, err.Error())
			return
		case quick == maxQuickRestarts:
			s.set(StateFailed, fmt.Sprintf("%v; it ended %d times in a row within %v of its start", err, quick+1, stableRun))
			return
		}
		quick++
		s.mu.Lock()
		s.b, s.restarts = nil, s.restarts+1
		s.mu.Unlock()
		s.set(StateStarting, "restarting: "+err.Error())
		select {
		case <-ctx.Done():
			return
		case <-time.After(pause):
		}
		pause = min(2*pause, restartCap)
	}
}

// install runs s's install unless its marker exists.
func (s *server) install(ctx context.Context, logf io.Writer) error {
	if len(s.spec.Install) == 0 {
		return nil
	}
	if _, err := os.Stat(s.spec.Installed); err == nil {
		return nil
	}
	s.set(StateInstalling, "")
	start := time.Now()
	cmd := exec.CommandContext(ctx, s.spec.Install[0], s.spec.Install[1:]...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Dir = "/"
	cmd.SysProcAttr = childAttr()
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("the install failed: %w", err)
	}
	if _, err := os.Stat(s.spec.Installed); err != nil {
		return fmt.Errorf("the install ended without %s", s.spec.Installed)
	}
	s.log.Info("mcp server installed", "server", s.spec.ID, "took", time.Since(start).Round(time.Millisecond))
	return nil
}

// serve starts s, initializes it and waits until it ends. ran says
// whether it initialized.
func (s *server) serve(ctx context.Context, logf io.Writer) (ran bool, err error) {
	cmd, err := s.command(ctx)
	if err != nil {
		return false, err
	}
	cmd.Stderr = logf
	in, err := cmd.StdinPipe()
	if err != nil {
		return false, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return false, err
	}
	if err := cmd.Start(); err != nil {
		return false, fmt.Errorf("starting %s: %w", s.spec.Run[0], err)
	}
	b := newBridge(in)
	readDone := make(chan error, 1)
	go func() { readDone <- b.read(out) }()

	ictx, cancel := context.WithTimeout(ctx, initWait)
	res, err := b.initialize(ictx)
	cancel()
	if err != nil {
		_ = cmd.Process.Kill()
		<-readDone
		_ = cmd.Wait()
		return false, fmt.Errorf("the server did not initialize: %w", err)
	}
	var info struct {
		ServerInfo struct{ Name, Version string } `json:"serverInfo"`
	}
	_ = json.Unmarshal(res, &info)
	now := time.Now().UTC()
	s.mu.Lock()
	s.b, s.init, s.started = b, res, &now
	s.name, s.version = clip(info.ServerInfo.Name, 100), clip(info.ServerInfo.Version, 50)
	s.mu.Unlock()
	s.set(StateRunning, "")
	s.log.Info("mcp server running", "server", s.spec.ID, "pid", cmd.Process.Pid)

	rerr := <-readDone
	werr := cmd.Wait()
	switch {
	case werr != nil:
		return true, fmt.Errorf("the server ended: %w", werr)
	case rerr != nil:
		return true, fmt.Errorf("reading the server: %w", rerr)
	}
	return true, errors.New("the server ended (exit status 0)")
}

// command is s's process, as its user. It stays in the gateway's
// process group, so a signal to the gateway's group ends it too.
func (s *server) command(ctx context.Context) (*exec.Cmd, error) {
	u, err := user.Lookup(s.spec.User)
	if err != nil {
		return nil, fmt.Errorf("the account %q: %w", s.spec.User, err)
	}
	uid, _ := strconv.ParseUint(u.Uid, 10, 32)
	gid, _ := strconv.ParseUint(u.Gid, 10, 32)
	var groups []uint32
	if ids, err := u.GroupIds(); err == nil {
		for _, g := range ids {
			if n, err := strconv.ParseUint(g, 10, 32); err == nil {
				groups = append(groups, uint32(n))
			}
		}
	}
	cmd := exec.CommandContext(ctx, s.spec.Run[0], s.spec.Run[1:]...)
	cmd.Dir = s.spec.Cwd
	cmd.Env = append(os.Environ(), "HOME="+u.HomeDir, "USER="+u.Username, "LOGNAME="+u.Username)
	for k, v := range s.spec.Env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	cmd.SysProcAttr = childAttr()
	if uint32(uid) != uint32(os.Getuid()) {
		cmd.SysProcAttr.Credential = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), Groups: groups}
	}
	return cmd, nil
}

// openLog opens a server's log afresh, bounded to maxLog bytes.
func openLog(path string) (io.WriteCloser, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
	if err != nil {
		return nil, err
	}
	return &capped{f: f, left: maxLog}, nil
}

// capped drops what is written past its bound, and says so once.
type capped struct {
	mu   sync.Mutex
	f    *os.File
	left int64
}

func (c *capped) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.left <= 0 {
		return len(p), nil
	}
	w := p
	if int64(len(w)) > c.left {
		w = w[:c.left]
	}
	n, err := c.f.Write(w)
	c.left -= int64(n)
	if err == nil && c.left <= 0 {
		_, _ = c.f.WriteString("\n[emberbox: log truncated]\n")
	}
	return len(p), err
}

func (c *capped) Close() error { return c.f.Close() }

// logTail is the end of a log, for a failed server's status.
func logTail(path string) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	if fi, err := f.Stat(); err == nil && fi.Size() > logTailSize {
		_, _ = f.Seek(fi.Size()-logTailSize, io.SeekStart)
	}
	b, _ := io.ReadAll(io.LimitReader(f, logTailSize))
	return string(bytes.ToValidUTF8(b, []byte("?")))
}

func clip(s string, n int) string {
	if len(s) > n {
		return s[:n]
	}
	return s
}
