package agent

import (
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"sync"

	"golang.org/x/sys/unix"
)

// reaper collects the exit status of every child. As PID 1 the agent also
// inherits orphans, and a wait4(-1) loop would steal statuses from
// exec.Cmd.Wait, so nothing in the agent calls Wait: processes are started
// through the reaper, which hands each status to whoever started that pid.
type reaper struct {
	mu      sync.Mutex
	waiting map[int]chan unix.WaitStatus // pid → its starter
}

// theReaper is process-wide: wait4(-1) reaps every child of the process, so
// two reapers would steal each other's statuses.
var theReaper = sync.OnceValue(newReaper)

func newReaper() *reaper {
	r := &reaper{waiting: make(map[int]chan unix.WaitStatus)}
	sig := make(chan os.Signal, 32)
	signal.Notify(sig, unix.SIGCHLD)
	go func() {
		for range sig {
			r.reap()
		}
	}()
	return r
}

// start starts cmd and returns a channel that receives its wait status.
// The caller must not call cmd.Wait. Starting under r.mu means the child
// cannot be reaped before its channel is registered.
func (r *reaper) start(cmd *exec.Cmd) (<-chan unix.WaitStatus, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	ch := make(chan unix.WaitStatus, 1)
	r.waiting[cmd.Process.Pid] = ch
	return ch, nil
}

// run starts cmd and waits for it, for the agent's own housekeeping commands.
func (r *reaper) run(cmd *exec.Cmd) error {
	ch, err := r.start(cmd)
	if err != nil {
		return err
	}
	ws := <-ch
	if ws.Exited() && ws.ExitStatus() == 0 {
		return nil
	}
	return fmt.Errorf("%s: %s", cmd.Path, describeStatus(ws))
}

func (r *reaper) reap() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for {
		var ws unix.WaitStatus
		pid, err := unix.Wait4(-1, &ws, unix.WNOHANG, nil)
		if err == unix.EINTR {
			continue
		}
		if pid <= 0 || err != nil {
			return
		}
		if ch, ok := r.waiting[pid]; ok {
			ch <- ws
			delete(r.waiting, pid)
		}
		// Anything else was an orphan re-parented to us: reaped, forgotten.
	}
}

func describeStatus(ws unix.WaitStatus) string {
	switch {
	case ws.Exited():
		return fmt.Sprintf("exit status %d", ws.ExitStatus())
	case ws.Signaled():
		return fmt.Sprintf("killed by %s", ws.Signal())
	default:
		return fmt.Sprintf("wait status %#x", uint32(ws))
	}
}
