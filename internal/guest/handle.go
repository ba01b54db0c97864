package guest

import (
	"context"
	"io"
	"net"
	"time"

	"github.com/emberbox/emberbox/internal/agentproto"
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
	VolumeRequest  = agentproto.VolumeRequest
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

// CodeVolumeBusy is the guest's refusal to detach a mount in use.
const CodeVolumeBusy = agentproto.CodeBusy

// Bounds of process input and terminals, as the agent enforces them.
const (
	// CodeStdinFull refuses an append (nil offset) that did not fit.
	CodeStdinFull  = agentproto.CodeStdinFull
	MaxStdinBuffer = agentproto.MaxStdinBuffer
	MaxPtySide     = agentproto.MaxPtySide
)

// Handle is the agent of a running sandbox, by role: every call the API
// makes into a guest goes through one. Each role is its own interface, so
// a caller that needs one declares only that one; a Handle carries them all
// and its methods are theirs. Errors carry errdefs classes and codes.
type Handle struct {
	ProcessRunner
	FileSystem
	Watcher
	PortDialer
	// Volumes is nil for a guest that cannot attach volumes.
	Volumes VolumeAttacher
}

// Valid reports whether h holds a guest.
func (h Handle) Valid() bool { return h.ProcessRunner != nil }

// Handle returns the handle whose every role is c.
func (c *Client) Handle() Handle {
	return Handle{ProcessRunner: c, FileSystem: c, Watcher: c, PortDialer: c, Volumes: c}
}

var (
	_ ProcessRunner  = (*Client)(nil)
	_ FileSystem     = (*Client)(nil)
	_ Watcher        = (*Client)(nil)
	_ PortDialer     = (*Client)(nil)
	_ VolumeAttacher = (*Client)(nil)
)

// ProcessRunner runs and drives processes in the guest.
type ProcessRunner interface {
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
}

// FileSystem reads and changes the guest's files, as the user WithFileUser
// names.
type FileSystem interface {
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
}

// Watcher watches the guest's files (inotify).
type Watcher interface {
	// WatchStart starts a file watch in the guest.
	WatchStart(ctx context.Context, req WatchRequest) (*WatchInfo, error)
	Watches(ctx context.Context) ([]WatchInfo, error)
	// WatchEvents reads a watch's events from cursor, waiting up to wait.
	WatchEvents(ctx context.Context, id string, cursor int64, wait time.Duration) (*WatchBatch, error)
	WatchStop(ctx context.Context, id string) (bool, error)
}

// PortDialer reaches the guest's TCP ports.
type PortDialer interface {
	// DialPort connects to a TCP port on the guest's loopback, over the
	// guest stream; nothing listening there is errdefs.ErrUnavailable
	// with code port_refused. ctx bounds the connect only. The connection
	// has CloseWrite, which half-closes it.
	DialPort(ctx context.Context, port int) (net.Conn, error)
}

// VolumeAttacher mounts volumes in the guest.
type VolumeAttacher interface {
	AttachVolume(ctx context.Context, req VolumeRequest) error
	DetachVolume(ctx context.Context, attachmentID string) error
	// FreezeVolume freezes (or thaws) its filesystem for a copy.
	FreezeVolume(ctx context.Context, attachmentID string, freeze bool) error
}
