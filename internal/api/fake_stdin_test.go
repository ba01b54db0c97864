package api

import (
	"bytes"
	"context"
	"sync"
	"time"

	"github.com/emberbox/emberbox/internal/errdefs"
	"github.com/emberbox/emberbox/internal/guest"
)

// fakeTTYID is the process a spawn with a pty starts in the fake guest.
const fakeTTYID = "t1"

// fakeStdin models process input in the fake guest: "p1" takes input at
// offsets like the agent; the terminal "t1" prints a banner, echoes what
// it is typed and exits with code 3 once typed "exit\n".
type fakeStdin struct {
	mu      sync.Mutex
	input   []byte // what p1 was written
	eof     bool
	full    int // appends to refuse with stdin_full before taking one
	writes  int
	size    guest.PtySize
	out     []byte // the terminal's output so far
	exited  bool
	changed chan struct{}
}

func (f *fakeStdin) notifyLocked() {
	if f.changed != nil {
		close(f.changed)
	}
	f.changed = make(chan struct{})
}

func (f *fakeStdin) spawnTTY(req guest.ExecRequest) *guest.ProcessInfo {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.size, f.out, f.exited = *req.Pty, []byte("$ "), false
	f.notifyLocked()
	return f.ttyInfoLocked()
}

func (f *fakeStdin) ttyInfo() *guest.ProcessInfo {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.ttyInfoLocked()
}

func (f *fakeStdin) ttyInfoLocked() *guest.ProcessInfo {
	size := f.size
	state := "running"
	if f.exited {
		state = "exited"
	}
	return &guest.ProcessInfo{ID: fakeTTYID, State: state, Command: "bash -l", Pty: &size, StdinOpen: !f.exited,
		User: "user", StartedAt: time.Unix(0, 0)}
}

func (f *fakeStdin) ttyOutput(ctx context.Context, req guest.ProcessRequest, onEvent func(guest.Event) error) error {
	cursor := req.Cursor
	for {
		f.mu.Lock()
		out, exited, ch := f.out[min(cursor, int64(len(f.out))):], f.exited, f.changed
		f.mu.Unlock()
		if len(out) > 0 {
			if err := onEvent(guest.Event{Type: guest.EventStdout, Data: bytes.Clone(out), Offset: cursor}); err != nil {
				return err
			}
			cursor += int64(len(out))
			continue
		}
		if exited {
			return onEvent(guest.Event{Type: "exit", Offset: cursor, Exit: &guest.ExecResult{ExitCode: intPtr(3), State: "exited"}})
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

func (g fakeGuest) Write(ctx context.Context, pid string, data []byte, offset *int64, eof bool) (*guest.ProcessInfo, error) {
	if _, err := g.m.Get(ctx, g.owner, g.id); err != nil {
		return nil, err
	}
	f := &g.m.stdin
	f.mu.Lock()
	defer f.mu.Unlock()
	f.writes++
	switch pid {
	case fakeTTYID:
		if offset != nil {
			return nil, errdefs.New(errdefs.ErrInvalidArgument, "invalid_request", "the fake terminal takes appends only")
		}
		if f.full > 0 {
			f.full--
			return nil, errdefs.New(errdefs.ErrConflict, guest.CodeStdinFull, "full")
		}
		f.out = append(f.out, data...)
		if bytes.Contains(f.out, []byte("exit\n")) {
			f.exited = true
		}
		f.notifyLocked()
		return f.ttyInfoLocked(), nil
	case "p1":
		at := int64(len(f.input))
		if offset != nil {
			at = *offset
		}
		if at > int64(len(f.input)) {
			return nil, errdefs.New(errdefs.ErrConflict, "stdin_offset_gap", "gap")
		}
		if rest := data[min(int64(len(f.input))-at, int64(len(data))):]; len(rest) > 0 {
			if f.eof {
				return nil, errdefs.New(errdefs.ErrConflict, "stdin_closed", "closed")
			}
			f.input = append(f.input, rest...)
		}
		f.eof = f.eof || eof
		return &guest.ProcessInfo{ID: "p1", State: "running", StdinOpen: !f.eof, StdinOffset: int64(len(f.input))}, nil
	}
	return nil, errdefs.New(errdefs.ErrNotFound, "process_not_found", "no process %s", pid)
}

func (g fakeGuest) Resize(ctx context.Context, pid string, size guest.PtySize) (*guest.ProcessInfo, error) {
	if _, err := g.m.Get(ctx, g.owner, g.id); err != nil {
		return nil, err
	}
	f := &g.m.stdin
	f.mu.Lock()
	defer f.mu.Unlock()
	switch pid {
	case fakeTTYID:
		f.size = size
		return f.ttyInfoLocked(), nil
	case "p1":
		return nil, errdefs.New(errdefs.ErrConflict, "not_a_terminal", "p1 has no terminal")
	}
	return nil, errdefs.New(errdefs.ErrNotFound, "process_not_found", "no process %s", pid)
}
