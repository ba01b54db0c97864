package api

import (
	"context"
	"time"

	"github.com/emberbox/emberbox/internal/admission"
	"github.com/emberbox/emberbox/internal/guest"
	"github.com/emberbox/emberbox/internal/metering"
	"github.com/emberbox/emberbox/internal/pricing"
	"github.com/emberbox/emberbox/internal/sandbox"
)

// Sandboxes makes, reads, changes and deletes sandboxes.
type Sandboxes interface {
	// Create records the sandbox and starts booting it in the background; it
	// returns at once with the sandbox in StateStarting.
	Create(ctx context.Context, owner string, spec sandbox.CreateSpec) (*sandbox.Sandbox, error)
	Get(ctx context.Context, owner, id string) (*sandbox.Sandbox, error)
	List(ctx context.Context, opts sandbox.ListOptions) (sandboxes []*sandbox.Sandbox, nextCursor string, err error)
	// WaitFor blocks until the sandbox is in one of states, is in a terminal
	// state, or ctx ends; it returns the sandbox as it then is (no error when
	// ctx ends first).
	WaitFor(ctx context.Context, owner, id string, states ...sandbox.State) (*sandbox.Sandbox, error)
	// Delete stops the sandbox if needed and removes its disk; deleting twice
	// returns the same record.
	Delete(ctx context.Context, owner, id string) (*sandbox.Sandbox, error)
	// Extend moves the lease to now+d (at most sandbox.MaxExtendAhead ahead).
	Extend(ctx context.Context, owner, id string, d time.Duration) (*sandbox.Sandbox, error)
	// Update changes a sandbox's settings.
	Update(ctx context.Context, owner, id string, u sandbox.UpdateSpec) (*sandbox.Sandbox, error)
	// Fork makes count copies of a sandbox as it is and answers them once
	// they run.
	Fork(ctx context.Context, owner, id string, spec sandbox.ForkSpec) ([]*sandbox.Sandbox, error)
}

// Power runs, pauses and stops the VMs of sandboxes.
type Power interface {
	// Stop starts stopping the sandbox and returns at once (StateStopping or
	// StateStopped). Stopping a stopped sandbox is not an error.
	Stop(ctx context.Context, owner, id string) (*sandbox.Sandbox, error)
	// Pause records a running sandbox pausing and pauses it in the
	// background; a pausing or paused one is answered as it is.
	Pause(ctx context.Context, owner, id string) (*sandbox.Sandbox, error)
	// Wake admits a paused sandbox again and resumes it in the background
	// (no_capacity leaves it paused); a running one is not_paused.
	// timeout, if not nil, is its new time limit in seconds.
	Wake(ctx context.Context, owner, id string, timeout *int) (*sandbox.Sandbox, error)
	// Restart boots a stopped sandbox again from its kept disk.
	Restart(ctx context.Context, owner, id string) (*sandbox.Sandbox, error)
}

// Switcher moves sandboxes to other images.
type Switcher interface {
	// SwitchImage moves a sandbox to img (nil: the default image),
	// keeping its /workspace and volumes, and answers once it runs there;
	// a failure is undone (switch_undone).
	SwitchImage(ctx context.Context, owner, id string, img *sandbox.ImageRef) (*sandbox.Sandbox, error)
}

// Snapshots captures sandboxes and keeps what was captured.
type Snapshots interface {
	// Snapshot captures a sandbox (memory and disk, or disk alone) and
	// answers once the capture is over.
	Snapshot(ctx context.Context, owner, id string, spec sandbox.SnapshotSpec) (*sandbox.Snapshot, error)
	GetSnapshot(ctx context.Context, owner, id string) (*sandbox.Snapshot, error)
	ListSnapshots(ctx context.Context, opts sandbox.SnapshotListOptions) ([]*sandbox.Snapshot, string, error)
	UpdateSnapshot(ctx context.Context, owner, id string, u sandbox.SnapshotUpdate) (*sandbox.Snapshot, error)
	// DeleteSnapshot deletes a snapshot; its files stay while a sandbox
	// made from it exists.
	DeleteSnapshot(ctx context.Context, owner, id string) error
	// ExtendSnapshot keeps a snapshot days from now.
	ExtendSnapshot(ctx context.Context, owner, id string, days int) (*sandbox.Snapshot, error)
}

// CheckpointManager keeps the checkpoints of sandboxes: snapshots that
// belong to one sandbox, which it can go back to or branch from.
type CheckpointManager interface {
	// Checkpoint captures the sandbox (memory, processes, disk) as one of
	// its checkpoints and answers once the capture is over, or with wait
	// false at once, the capture going on in the background.
	Checkpoint(ctx context.Context, owner, id, label string, wait bool) (*sandbox.Snapshot, error)
	// ListCheckpoints lists a sandbox's checkpoints, oldest first.
	ListCheckpoints(ctx context.Context, owner, id string) ([]*sandbox.Snapshot, error)
	GetCheckpoint(ctx context.Context, owner, id, cid string) (*sandbox.Snapshot, error)
	DeleteCheckpoint(ctx context.Context, owner, id, cid string) error
	// RestoreCheckpoint brings the sandbox back to the checkpoint and
	// answers once it runs again; keep first checkpoints the present.
	RestoreCheckpoint(ctx context.Context, owner, id, cid string, keep bool) (*sandbox.Sandbox, error)
	// BranchCheckpoint makes new sandboxes from the checkpoint and answers
	// them once they run.
	BranchCheckpoint(ctx context.Context, owner, id, cid string, spec sandbox.ForkSpec) ([]*sandbox.Sandbox, error)
}

// Usage is what sandboxes used, what it costs, and what a key may use.
type Usage interface {
	// Rates are the prices usage is charged at.
	Rates() pricing.Rates
	// AttachUsage sets each sandbox's Usage: what was metered for it, priced.
	AttachUsage(ctx context.Context, sbs ...*sandbox.Sandbox) error
	// EachUsageRow calls fn with each of owner's hourly usage rows that q
	// selects, oldest first (owner "" is every key's, for an admin).
	EachUsageRow(ctx context.Context, owner string, q metering.Query, fn func(metering.Row) error) error
	// SettledThrough is the time before which no usage row changes any more.
	SettledThrough(ctx context.Context) (time.Time, error)
	// Metrics returns owner's sandbox and its metered intervals ending in [from, to).
	Metrics(ctx context.Context, owner, id string, from, to time.Time) (*sandbox.Sandbox, []metering.Point, error)
	// KeyLimits returns what one key may hold at once and what it holds.
	KeyLimits(owner string) (admission.Quota, admission.Usage)
}

// Guests reaches the guests of running sandboxes.
type Guests interface {
	// Guest returns a running sandbox of owner's and its guest agent, or
	// the coded refusal of the sandbox's state (sandbox.Refusal). Every call
	// into a guest goes through it.
	Guest(ctx context.Context, owner, id string) (*sandbox.Sandbox, guest.Handle, error)
}
