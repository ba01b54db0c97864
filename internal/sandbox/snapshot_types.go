package sandbox

import "time"

// Snapshot states.
const (
	SnapshotCapturing = "capturing"
	SnapshotReady     = "ready"
	SnapshotFailed    = "failed"
	SnapshotDeleted   = "deleted"
)

// Snapshot modes: a memory snapshot holds the guest's memory and device
// state besides its disk, so its copies go on where it was taken; a disk
// snapshot only the disk, so its copies boot.
const (
	SnapshotModeMemory = "memory"
	SnapshotModeDisk   = "disk"
)

// Bounds of a snapshot's retention, in days.
const (
	DefaultSnapshotRetentionDays = 7
	MaxSnapshotRetentionDays     = 365
)

// Snapshot is the durable record of one snapshot of a sandbox. Its files
// live in DataDir/snapshots/<id>.
type Snapshot struct {
	ID              string
	OwnerKeyID      string
	Name            string
	Labels          map[string]string
	SourceSandboxID string
	Mode            string
	State           string
	Error           string // why capture failed
	SizeBytes       int64
	// The shape of the source; copies get the same.
	VCPU, MemoryMiB, DiskMiB int
	RetentionDays            int
	CreatedAt                time.Time
	ReadyAt                  *time.Time
	ExpiresAt                *time.Time // deleted by the retention loop from then
	DeletedAt                *time.Time
	// FilesRemovedAt is set once its directory is gone: a deleted
	// snapshot keeps its files while a sandbox made from it exists.
	FilesRemovedAt *time.Time
	// ImageID and Rootfs are the source's image (Sandbox.ImageID): the
	// snapshot's disk is an overlay of Rootfs.
	ImageID string
	Rootfs  string
	// CheckpointOf is the sandbox a checkpoint belongs to ("" for a
	// snapshot): it is listed under that sandbox and deleted with it.
	CheckpointOf string
	// BaseID is the snapshot whose files this one's memory is a
	// difference over (vmm.DeltaSnapshotter): its files stay while this
	// one's do. "" for a whole snapshot.
	BaseID string
}

// SnapshotListOptions filters a listing of snapshots. Zero values mean no
// filter; deleted snapshots are never listed.
type SnapshotListOptions struct {
	OwnerKeyID      string
	SourceSandboxID string
	// CheckpointOf lists the checkpoints of that sandbox; "" lists
	// snapshots, never checkpoints, unless AllKinds.
	CheckpointOf string
	// AllKinds lists snapshots and checkpoints together (the meter's
	// storage charges); CheckpointOf must be "".
	AllKinds bool
	Name     string
	State    string
	Limit    int    // 1..100, default 50
	Cursor   string // opaque, from a previous page
}
