package agent

import (
	"errors"
	"fmt"
	"os"
	"os/exec"

	"github.com/creack/pty"
	"golang.org/x/sys/unix"

	"github.com/emberbox/emberbox/internal/agentproto"
)

// output is one descriptor the supervisor reads a stream of output from.
type output struct {
	f      *os.File
	stream string
}

// procIO is the plumbing of a new process: the ends the child gets (closed
// in the agent once it started) and the ends the agent keeps.
type procIO struct {
	child   []*os.File
	outputs []output
	stdinW  *os.File // one-shot Stdin of the request, written then closed
	in      *stdin   // input of a StdinPipe or Pty process
	tty     *os.File // a Pty process's master
}

// openIO sets cmd's stdin, stdout and stderr: pipes, or for req.Pty a new
// terminal that the child gets as its controlling terminal (it becomes the
// leader of a new session, so its pid is still its group's id).
func openIO(req *agentproto.ExecRequest, cmd *exec.Cmd) (*procIO, error) {
	pio := &procIO{}
	if req.Pty != nil {
		master, tty, err := openPty()
		if err != nil {
			return nil, internal(fmt.Errorf("opening a terminal: %w", err))
		}
		if err := setWinsize(master, req.Pty); err != nil {
			master.Close()
			tty.Close()
			return nil, internal(fmt.Errorf("sizing the terminal: %w", err))
		}
		if cr := cmd.SysProcAttr.Credential; cr != nil {
			// As login does: the user owns the terminal it logs in on.
			_ = tty.Chown(int(cr.Uid), int(cr.Gid))
		}
		cmd.Stdin, cmd.Stdout, cmd.Stderr = tty, tty, tty
		cmd.SysProcAttr.Setpgid = false
		cmd.SysProcAttr.Setsid, cmd.SysProcAttr.Setctty, cmd.SysProcAttr.Ctty = true, true, 0
		pio.child = []*os.File{tty}
		pio.outputs = []output{{master, agentproto.Stdout}}
		pio.tty, pio.in = master, newStdin(master, true)
		return pio, nil
	}

	for _, stream := range []string{agentproto.Stdout, agentproto.Stderr} {
		r, w, err := os.Pipe()
		if err != nil {
			pio.closeChildEnds()
			pio.closeParentEnds()
			return nil, internal(err)
		}
		pio.child = append(pio.child, w)
		pio.outputs = append(pio.outputs, output{r, stream})
	}
	cmd.Stdout, cmd.Stderr = pio.child[0], pio.child[1]
	if req.StdinPipe || len(req.Stdin) > 0 {
		r, w, err := os.Pipe()
		if err != nil {
			pio.closeChildEnds()
			pio.closeParentEnds()
			return nil, internal(err)
		}
		cmd.Stdin = r
		pio.child = append(pio.child, r)
		if req.StdinPipe {
			pio.in = newStdin(w, false)
		} else {
			pio.stdinW = w
		}
	}
	return pio, nil
}

// closeChildEnds closes the agent's copies of the child's descriptors.
func (pio *procIO) closeChildEnds() {
	for _, f := range pio.child {
		f.Close()
	}
}

// closeParentEnds closes what the agent kept, for a child that did not start.
func (pio *procIO) closeParentEnds() {
	for _, o := range pio.outputs {
		o.f.Close()
	}
	if pio.stdinW != nil {
		pio.stdinW.Close()
	}
	if pio.in != nil && !pio.in.pty {
		pio.in.w.Close()
	}
}

// openPty opens a terminal pair. pty.Open leaves the master in blocking
// mode (its ioctls go through File.Fd), where Close cannot interrupt a
// read; the master is reopened non-blocking, so the supervisor can end
// reads of a terminal that a background job keeps open.
func openPty() (master, tty *os.File, err error) {
	m, tty, err := pty.Open()
	if err != nil {
		return nil, nil, err
	}
	defer m.Close()
	fd, err := unix.FcntlInt(m.Fd(), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		tty.Close()
		return nil, nil, err
	}
	if err := unix.SetNonblock(fd, true); err != nil {
		unix.Close(fd)
		tty.Close()
		return nil, nil, err
	}
	return os.NewFile(uintptr(fd), "/dev/ptmx"), tty, nil
}

// setWinsize sets a terminal's window size without File.Fd, which would
// make the master blocking again.
func setWinsize(f *os.File, s *agentproto.PtySize) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var ioErr error
	err = rc.Control(func(fd uintptr) {
		ioErr = unix.IoctlSetWinsize(int(fd), unix.TIOCSWINSZ, &unix.Winsize{Col: uint16(s.Cols), Row: uint16(s.Rows)})
	})
	if err != nil {
		return err
	}
	return ioErr
}

// checkPtySize refuses a window size out of bounds.
func checkPtySize(s *agentproto.PtySize) error {
	if s.Cols < 1 || s.Rows < 1 || s.Cols > agentproto.MaxPtySide || s.Rows > agentproto.MaxPtySide {
		return invalid(fmt.Sprintf("a terminal's cols and rows must be from 1 to %d", agentproto.MaxPtySide))
	}
	return nil
}

// write queues input for p (see stdin.write).
func (p *process) write(pr *agentproto.ProcessRequest) error {
	if p.in == nil {
		return &agentproto.Error{Code: agentproto.CodeStdinClosed,
			Message: "the process was not started with stdinMode pipe or a pty"}
	}
	if _, err := p.in.write(pr.Input, pr.InputOffset, pr.EOF); err != nil {
		return err
	}
	return nil
}

// resize sets the window size of p's terminal; its process group gets
// SIGWINCH from the kernel.
func (p *process) resize(s *agentproto.PtySize) error {
	if p.tty == nil {
		return &agentproto.Error{Code: agentproto.CodeNotATerminal, Message: "the process has no terminal"}
	}
	if err := checkPtySize(s); err != nil {
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ended != nil {
		return nil
	}
	if err := setWinsize(p.tty, s); errors.Is(err, os.ErrClosed) {
		return nil // it ended: its terminal is closed
	} else if err != nil {
		return internal(fmt.Errorf("resizing the terminal: %w", err))
	}
	size := *s
	p.size = &size
	return nil
}
