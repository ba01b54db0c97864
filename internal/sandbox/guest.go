package sandbox

import (
	"context"
	"errors"
	"io"
	"net"
	"time"

	"github.com/emberbox/emberbox/internal/agentproto"
	"github.com/emberbox/emberbox/internal/errdefs"
	"github.com/emberbox/emberbox/internal/guest"
)

// The guest's requests and answers, as callers of this package see them.
// They are the wire protocol's own plain structs: aliases rather than copies
// keep the API free of the protocol package without a conversion on every
// call, and the day the two must differ, the change is made here alone.
type (
	ExecRequest    = agentproto.ExecRequest
	ExecResult     = agentproto.ExecResult
	Event          = agentproto.Event
	ProcessInfo    = agentproto.ProcessInfo
	ProcessRequest = agentproto.ProcessRequest
	PtySize        = agentproto.PtySize
	FileRequest    = agentproto.FileRequest
	FileEntry      = agentproto.FileEntry
	Unpacked       = agentproto.Unpacked
	WatchRequest   = agentproto.WatchRequest
	WatchInfo      = agentproto.WatchInfo
	WatchBatch     = agentproto.WatchBatch
	WatchEvent     = agentproto.WatchEvent
	WatchNotice    = agentproto.WatchNotice
)

// Bounds of archive requests, as the guest takes them.
const (
	MaxArchiveExcludes = agentproto.MaxExcludes
	MaxGlobLen         = agentproto.MaxGlobLen
	MaxUnarchive       = agentproto.MaxUnarchive
	MaxWatchPatterns   = agentproto.MaxWatchPatterns
	MaxWatchTimeoutMs  = agentproto.MaxWatchTimeout
	MaxWatchDirs       = agentproto.MaxWatchDirs
	MaxWatchWaitMs     = agentproto.MaxWatchWait
)

// Output stream names of Event.Type.
const (
	EventStdout = agentproto.Stdout
	EventStderr = agentproto.Stderr
)

// CodeFileNotFound is the error code of a path that does not exist in the
// guest.
const CodeFileNotFound = agentproto.CodeFileNotFound

// Bounds of process input and terminals, as the agent enforces them.
const (
	// CodeStdinFull refuses an append (nil offset) that did not fit.
	CodeStdinFull  = agentproto.CodeStdinFull
	MaxStdinBuffer = agentproto.MaxStdinBuffer
	MaxPtySide     = agentproto.MaxPtySide
)

// Guest is the agent of a running sandbox: every call the API makes into a
// guest goes through it. Errors carry errdefs classes and codes.
type Guest interface {
	// Exec runs a command. With req.Stream, onEvent receives "start",
	// "stdout"/"stderr" (with cumulative offsets) and finally "exit"
	// events; an error from onEvent aborts the call.
	Exec(ctx context.Context, req ExecRequest, onEvent func(Event) error) (*ExecResult, error)
	// Spawn starts a process that outlives the call.
	Spawn(ctx context.Context, req ExecRequest) (*ProcessInfo, error)
	Processes(ctx context.Context) ([]ProcessInfo, error)
	Process(ctx context.Context, id string) (*ProcessInfo, error)
	// ProcessOutput sends output events from req.Cursor to onEvent; it ends
	// with an "exit" event if the process has ended and all its kept output
	// was sent.
	ProcessOutput(ctx context.Context, req ProcessRequest, onEvent func(Event) error) error
	Signal(ctx context.Context, id, signal string) (*ProcessInfo, error)
	// Write sends input to a process spawned with StdinPipe or Pty at
	// offset, the bytes already accepted (nil: after them); a retry at
	// the same offset is not typed twice, an offset past them is refused
	// (conflict: stdin_offset_gap). The answer's StdinOffset says how far
	// input was accepted: short of the data's end while the process's
	// input buffer is full; an append (nil offset) is taken whole or
	// refused with conflict stdin_full. eof ends the input once all of
	// data is in.
	Write(ctx context.Context, id string, data []byte, offset *int64, eof bool) (*ProcessInfo, error)
	// Resize sets a Pty process's window size (conflict: not_a_terminal).
	Resize(ctx context.Context, id string, size PtySize) (*ProcessInfo, error)

	// ReadFile returns the file's entry and a reader of its bytes, which
	// the caller must close.
	ReadFile(ctx context.Context, path string) (*FileEntry, io.ReadCloser, error)
	// WriteFile atomically replaces path with exactly size bytes from r,
	// creating parent directories. mode 0 means 0644.
	WriteFile(ctx context.Context, path string, mode uint32, size int64, r io.Reader) (*FileEntry, error)
	List(ctx context.Context, req FileRequest) ([]FileEntry, error)
	// Stat returns an error of class errdefs.ErrNotFound if path does not
	// exist.
	Stat(ctx context.Context, path string) (*FileEntry, error)
	Mkdir(ctx context.Context, path string, parents bool) (*FileEntry, error)
	Remove(ctx context.Context, path string, recursive bool) (bool, error)
	// Chmod sets path's permission bits (at most 07777), following a final
	// symlink, as the sandbox user, who may change only the modes of files
	// it owns; it returns path's entry.
	Chmod(ctx context.Context, path string, mode uint32) (*FileEntry, error)
	// Glob lists what under root matches pattern ("**" spans directories).
	Glob(ctx context.Context, root, pattern string, hidden bool, limit int) ([]FileEntry, error)
	// Rename moves from to to as the sandbox user; an existing to is
	// replaced only with overwrite (else file_exists).
	Rename(ctx context.Context, from, to string, overwrite bool) (*FileEntry, error)
	// Archive streams the directory dir as a tar (gzipped with gz) read
	// as user ("" or "root"); the reader must be closed.
	Archive(ctx context.Context, dir, user string, gz bool, exclude []string) (io.ReadCloser, error)
	// Unarchive unpacks exactly size bytes of a tar or tar.gz from r into
	// the directory dir as user ("" or "root").
	Unarchive(ctx context.Context, dir, user string, size int64, r io.Reader) (*Unpacked, error)

	// DialPort connects to a TCP port on the guest's loopback, over the
	// guest stream; nothing listening there is errdefs.ErrUnavailable
	// with code port_refused. ctx bounds the connect only. The connection
	// has CloseWrite, which half-closes it.
	DialPort(ctx context.Context, port int) (net.Conn, error)
	// WatchStart starts a file watch (inotify) in the guest.
	WatchStart(ctx context.Context, req WatchRequest) (*WatchInfo, error)
	Watches(ctx context.Context) ([]WatchInfo, error)
	// WatchEvents reads a watch's events from cursor, waiting up to wait.
	WatchEvents(ctx context.Context, id string, cursor int64, wait time.Duration) (*WatchBatch, error)
	WatchStop(ctx context.Context, id string) (bool, error)
}

var _ Guest = (*guest.Client)(nil)

// WithFileUser returns ctx under which a Guest's file and watch calls act
// as user ("" or "user", or "root"); see guest.WithFileUser.
func WithFileUser(ctx context.Context, user string) context.Context {
	return guest.WithFileUser(ctx, user)
}

// Guest returns a sandbox of owner's together with its guest, or the one
// refusal (see Refusal) for a sandbox that has no guest to call in its
// state. A paused sandbox whose autoWake is on is woken first, and one
// pausing or resuming waited for. It is the only way from the API into a
// guest, so it also counts as the sandbox's activity (idle pause): the
// sandbox is busy, never idle, until ctx ends, so a caller passes the
// context of the work it does with the guest (a request's, a stream's)
// and never one that outlives it.
func (m *Manager) Guest(ctx context.Context, owner, id string) (*Sandbox, Guest, error) {
	// A sandbox may pause again between its wake and the call (an idle
	// pause that was due): a few rounds, then the refusal.
	for range 3 {
		sb, err := m.Get(ctx, owner, id)
		if err != nil {
			return nil, nil, err
		}
		if sb.State.Paused() && sb.AutoWake {
			if err := m.wakeForCall(ctx, owner, sb); err != nil {
				return nil, nil, err
			}
			continue
		}
		if err := Refusal(sb); err != nil {
			return nil, nil, err
		}
		g, err := m.liveGuest(ctx, sb)
		if errors.Is(err, errPausedMeanwhile) {
			continue
		}
		return sb, g, err
	}
	sb, err := m.Get(ctx, owner, id)
	if err != nil {
		return nil, nil, err
	}
	if sb.State.Paused() && sb.AutoWake {
		return nil, nil, errdefs.New(errdefs.ErrUnavailable, "wake_failed",
			"sandbox %s was paused again, or its wake failed, each time it was woken for this call", id).
			WithHint("see GET /v1/sandboxes/{id}/events, and retry")
	}
	if err := Refusal(sb); err != nil {
		return nil, nil, err
	}
	return nil, nil, errdefs.New(errdefs.ErrUnavailable, "guest_busy", "the sandbox paused again while being woken").
		WithHint("retry in a few seconds")
}

// errPausedMeanwhile: the running sandbox's instance ended under the
// call, and the sandbox is being paused.
var errPausedMeanwhile = errors.New("paused meanwhile")

// liveGuest returns the connected guest of a sandbox recorded running.
func (m *Manager) liveGuest(ctx context.Context, sb *Sandbox) (Guest, error) {
	m.mu.Lock()
	in := m.live[sb.ID]
	m.mu.Unlock()
	if in == nil {
		// Recorded running but not (yet) watched by this process: only
		// possible in the moment a stop or pause forgets it.
		return nil, m.refuseGone(sb)
	}
	in.hold(ctx, m.now)
	// Right after a restart or a dropped connection the watcher is still
	// reconnecting; a short wait beats an error the caller must retry.
	c := in.guest()
	if c == nil {
		t := time.NewTimer(reconnectWait)
		defer t.Stop()
		tick := time.NewTicker(25 * time.Millisecond)
		defer tick.Stop()
		for c == nil {
			select {
			case <-ctx.Done():
				return nil, ctx.Err()
			case <-in.ctx.Done():
				return nil, m.refuseGone(sb)
			case <-t.C:
				e := errdefs.New(errdefs.ErrUnavailable, "guest_busy", "the sandbox's agent is reconnecting")
				e.Hint = "retry in a few seconds"
				return nil, e
			case <-tick.C:
				c = in.guest()
			}
		}
	}
	return activeGuest{Client: c, touch: func() { in.touch(m.now()) }}, nil
}

// refuseGone answers a call whose sandbox lost its instance: paused
// meanwhile (the caller wakes it), or stopping.
func (m *Manager) refuseGone(sb *Sandbox) error {
	if now, err := m.cfg.Store.GetSandbox(context.Background(), sb.ID); err == nil && now.State.Paused() {
		return errPausedMeanwhile
	}
	return refuse(sb, StateStopping)
}
