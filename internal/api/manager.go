package api

import (
	"context"
	"io"
	"time"

	"github.com/emberbox/emberbox/internal/agentproto"
	"github.com/emberbox/emberbox/internal/sandbox"
)

// Manager is what the API needs from the sandbox manager. Every method takes
// the caller's key id as owner: a sandbox of another owner is reported as
// errdefs.ErrNotFound. Errors carry errdefs classes (and often an
// *errdefs.CodedError with the wire code), which the API maps to statuses.
type Manager interface {
	// Create records the sandbox and starts booting it in the background; it
	// returns at once with the sandbox in StateStarting.
	Create(ctx context.Context, owner string, spec sandbox.CreateSpec) (*sandbox.Sandbox, error)
	Get(ctx context.Context, owner, id string) (*sandbox.Sandbox, error)
	List(ctx context.Context, opts sandbox.ListOptions) (sandboxes []*sandbox.Sandbox, nextCursor string, err error)
	// WaitFor blocks until the sandbox is in one of states, is in a terminal
	// state, or ctx ends; it returns the sandbox as it then is (no error when
	// ctx ends first).
	WaitFor(ctx context.Context, owner, id string, states ...sandbox.State) (*sandbox.Sandbox, error)
	// Stop starts stopping the sandbox and returns at once (StateStopping or
	// StateStopped). Stopping a stopped sandbox is not an error.
	Stop(ctx context.Context, owner, id string) (*sandbox.Sandbox, error)
	// Delete stops the sandbox if needed and removes its disk; deleting twice
	// returns the same record.
	Delete(ctx context.Context, owner, id string) (*sandbox.Sandbox, error)
	// Extend moves the lease to now+d (at most sandbox.MaxExtendAhead ahead).
	Extend(ctx context.Context, owner, id string, d time.Duration) (*sandbox.Sandbox, error)

	// Exec runs a command. With req.Stream, onEvent receives "start",
	// "stdout"/"stderr" (with cumulative offsets) and finally "exit" events;
	// an error from onEvent aborts the call. The result is returned either way.
	Exec(ctx context.Context, owner, id string, req agentproto.ExecRequest, onEvent func(agentproto.Event) error) (*agentproto.ExecResult, error)
	Spawn(ctx context.Context, owner, id string, req agentproto.ExecRequest) (*agentproto.ProcessInfo, error)
	Processes(ctx context.Context, owner, id string) ([]agentproto.ProcessInfo, error)
	Process(ctx context.Context, owner, id, processID string) (*agentproto.ProcessInfo, error)
	// ProcessOutput sends output events from req.Cursor (see
	// agentproto.ProcessRequest) to onEvent; it ends with an "exit" event if
	// the process has ended and all its kept output was sent.
	ProcessOutput(ctx context.Context, owner, id string, req agentproto.ProcessRequest, onEvent func(agentproto.Event) error) error
	Signal(ctx context.Context, owner, id, processID, signal string) (*agentproto.ProcessInfo, error)

	// ReadFile returns the file's entry and a reader of its bytes, which the
	// caller must close.
	ReadFile(ctx context.Context, owner, id, path string) (*agentproto.FileEntry, io.ReadCloser, error)
	// WriteFile atomically replaces path with exactly size bytes from r,
	// creating parent directories. mode 0 means 0644.
	WriteFile(ctx context.Context, owner, id, path string, mode uint32, size int64, r io.Reader) (*agentproto.FileEntry, error)
	ListFiles(ctx context.Context, owner, id string, req agentproto.FileRequest) ([]agentproto.FileEntry, error)
	// Stat returns an error of class errdefs.ErrNotFound if path does not exist.
	Stat(ctx context.Context, owner, id, path string) (*agentproto.FileEntry, error)
	Mkdir(ctx context.Context, owner, id, path string, parents bool) (*agentproto.FileEntry, error)
	Remove(ctx context.Context, owner, id, path string, recursive bool) (removed bool, err error)
}
