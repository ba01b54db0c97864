package sandbox

import (
	"time"

	"github.com/emberbox/emberbox/internal/egress"
	"github.com/emberbox/emberbox/internal/metering"
)

// Lease-end actions.
const (
	LeaseEndStop   = "stop"
	LeaseEndDelete = "delete"
	LeaseEndPause  = "pause"
)

// Stop reasons.
const (
	ReasonRequested     = "requested"
	ReasonLeaseExpired  = "lease_expired"
	ReasonDeleted       = "deleted"
	ReasonStartFailed   = "start_failed"
	ReasonVMExited      = "vm_exited"       // the VM process ended on its own
	ReasonLostOnRestart = "lost_on_restart" // found dead when the server restarted
	// ReasonGuestProtocolViolation: the guest broke the protocol
	// repeatedly (see guestsafety.go); the events say how.
	ReasonGuestProtocolViolation = "guest_protocol_violation"
	// ReasonPauseFailed: a pause ended the VM without saving its state.
	ReasonPauseFailed = "pause_failed"
	// ReasonWakeFailed: a wake failed after the saved state was used up.
	ReasonWakeFailed = "wake_failed"
	// ReasonNodeLost: the node of a cluster that ran it stopped answering
	// (internal/cluster); the other nodes stopped it.
	ReasonNodeLost = "node_lost"
)

// Defaults and limits for create requests.
const (
	DefaultVCPU           = 2
	DefaultMemoryMiB      = 4096
	DefaultDiskMiB        = 4096
	DefaultTimeoutSeconds = 1800
	MinTimeoutSeconds     = 60
	// DefaultIdlePauseSeconds is the idle pause of a new sandbox that
	// names none, as withruntime documents; MinIdlePauseSeconds is the
	// shortest (a shorter one is raised to it).
	DefaultIdlePauseSeconds = 300
	MinIdlePauseSeconds     = 60
	MaxIdlePauseSeconds     = 24 * 3600
	MaxTimeoutSeconds       = 24 * 3600
	MaxExtendAhead          = time.Hour
)

// Limits bound one sandbox, as the operator configured them. A zero field
// is no limit beyond the API's own.
type Limits struct {
	MaxVCPU      int
	MaxMemoryMiB int
	MaxDiskMiB   int
	// MaxLifetime bounds the time from a sandbox's creation to the end of
	// its lease: the first lease is cut there and :extend never passes it.
	MaxLifetime time.Duration
}

// Sandbox is the durable record of one sandbox, as the store keeps it and the
// API shows it.
type Sandbox struct {
	ID             string
	OwnerKeyID     string
	Name           string
	Labels         map[string]string
	EnvNames       []string
	VCPU           int
	MemoryMiB      int
	DiskMiB        int
	TimeoutSeconds int
	OnLeaseEnd     string
	State          State
	StopReason     string
	Accel          string // "kvm" or "tcg"
	Driver         string // "qemu", later "firecracker"
	CreatedAt      time.Time
	ReadyAt        *time.Time
	ExpiresAt      *time.Time
	EndedAt        *time.Time
	DeletedAt      *time.Time
	// VM is the driver's opaque reattach record (pid, socket paths), JSON.
	VM []byte

	// PausedAt is when it was last paused; nil unless pausing, paused or
	// resuming.
	PausedAt *time.Time
	// AutoWake: a guest call to it while paused wakes it first; without
	// it the call is refused with sandbox_paused.
	AutoWake bool
	// IdlePauseSeconds pauses a running sandbox after that long without
	// API activity; 0 never.
	IdlePauseSeconds int
	// Persistent sandboxes have no lease and are never idle-paused: they
	// run until stopped.
	Persistent bool
	// SnapshotID is the snapshot it was made from, if any: its disk
	// backs this sandbox's, so the snapshot's files stay while it exists.
	SnapshotID string
	// Usage is what was metered for it, priced (Manager.AttachUsage);
	// nil unless asked for.
	Usage *metering.Summary
	// DiskRemovedAt is when the retention removed a stopped sandbox's
	// files (read only: set by DiskStore.MarkDiskRemoved).
	DiskRemovedAt *time.Time
	// ImageID is the catalog id of the image it boots, and Rootfs that
	// image's read-only base disk; both empty for the server's default
	// image. Set at create (a copy of a snapshot takes the snapshot's) and
	// changed only by a switch of image (switch.go).
	ImageID string
	Rootfs  string
	// NodeID is the node of a cluster that runs it ("" on a server of
	// its own); set by the store at insert, changed only by a move.
	NodeID string
}

// ImageRef is an image a create asks for, resolved by the image catalog:
// the manager boots Rootfs (a raw disk image, read only, shared by every
// sandbox of it) with the server's kernel and initramfs.
type ImageRef struct {
	ID     string
	Rootfs string
	// MinDiskMiB is the smallest disk a sandbox of it may have: the size
	// of Rootfs.
	MinDiskMiB int
}

// CreateSpec is a validated create request with defaults filled in.
type CreateSpec struct {
	Name      string
	Labels    map[string]string
	Env       map[string]string // values go to the guest only; the store keeps names
	VCPU      int
	MemoryMiB int
	DiskMiB   int
	// TimeoutSeconds is the time limit of each run; 0 none.
	TimeoutSeconds int
	OnLeaseEnd     string
	// AutoWake: nil means on.
	AutoWake         *bool
	IdlePauseSeconds int
	Persistent       bool
	// SnapshotID, if set, makes the sandbox a copy of that snapshot (of
	// the same owner), with its shape.
	SnapshotID string
	// Image is the image to boot; nil means the server's default image.
	// Ignored for a copy of a snapshot, which boots the snapshot's.
	Image *ImageRef
	// Network is the egress policy; nil means the operator's default.
	Network *egress.Policy
	// IdempotencyKey is the create request's Idempotency-Key, if any: the
	// store keeps the new sandbox's id with it, in the same transaction as
	// the record, so a retry after a crash answers with this sandbox.
	IdempotencyKey string
	// Volumes are attached before the sandbox runs (at most
	// MaxCreateVolumes); see Config.Volumes.
	Volumes []VolumeMount
}

// Network is a sandbox's stored egress policy.
type Network struct {
	Policy    egress.Policy
	Version   int64
	UpdatedAt time.Time
}

// NetworkStatus is a sandbox's egress policy as the API reports it.
type NetworkStatus struct {
	SandboxID       string
	Network         Network
	Enforced        bool  // the host applies Version (or nothing runs)
	EnforcedVersion int64 // the version the host applies
	Counters        egress.Counters
	// Limited says the operator's ceiling (--egress-max) narrowed the
	// policy asked for; Network.Policy is the one that applies.
	Limited bool
}

// ListOptions filters a listing. Zero values mean no filter.
type ListOptions struct {
	OwnerKeyID     string
	AllOwners      bool // with no OwnerKeyID: every owner's (an admin's listing)
	States         []State
	Name           string
	Labels         map[string]string // all must match
	IncludeStopped bool              // stopped sandboxes are listed only if set or States names them
	Limit          int               // 1..100, default 50
	Cursor         string            // opaque, from a previous page
	// Local lists only this server's sandboxes: in a cluster, those of
	// its own node (the manager's housekeeping); the API lists all.
	Local bool
}
