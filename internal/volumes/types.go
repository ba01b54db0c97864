package volumes

import (
	"context"
	"time"
)

// States of a volume.
const (
	StateReady    = "ready"    // held by no sandbox
	StateAttached = "attached" // held by SandboxID (attaching or attached)
	StateDeleted  = "deleted"
)

// States of an attachment.
const (
	AttachAttaching = "attaching"
	AttachAttached  = "attached"
	AttachDetaching = "detaching"
	AttachDetached  = "detached"
)

// Volume is a disk of its own.
type Volume struct {
	ID         string
	OwnerKeyID string
	Name       string
	Labels     map[string]string
	SizeMiB    int
	State      string
	// SandboxID and AttachmentID name the holder while attached.
	SandboxID    string
	AttachmentID string
	CreatedAt    time.Time
	UpdatedAt    time.Time
}

// Attachment is one time a volume was attached to a sandbox.
type Attachment struct {
	ID         string
	VolumeID   string
	SandboxID  string
	OwnerKeyID string
	Path       string
	Mode       string
	State      string
	Error      string
	CreatedAt  time.Time
	AttachedAt *time.Time
	DetachedAt *time.Time
}

// ListOptions select volumes of one owner, newest first.
type ListOptions struct {
	OwnerKeyID string
	Name       string
	State      string
	Limit      int
	Cursor     string // the last ID of the previous page
}

// Store keeps volumes and attachments; store.Store implements it. Its
// changes of who holds a volume are each one transaction.
type Store interface {
	InsertVolume(ctx context.Context, v *Volume) error
	// GetVolume returns a volume of any owner (deleted ones too), or
	// errdefs.ErrNotFound.
	GetVolume(ctx context.Context, id string) (*Volume, error)
	ListVolumes(ctx context.Context, opts ListOptions) ([]*Volume, string, error)
	// LiveVolumes lists every owner's volumes not deleted: what the
	// admission ledger holds again at a start.
	LiveVolumes(ctx context.Context) ([]*Volume, error)
	// UpdateVolume sets SizeMiB and State of a volume whose state is from.
	UpdateVolume(ctx context.Context, id, from string, sizeMiB int, state string) (*Volume, error)
	// BeginAttach makes a ready volume held by a's sandbox and records a
	// (attaching); errdefs.ErrConflict names the holder if it is held.
	BeginAttach(ctx context.Context, a *Attachment) error
	// SetAttachment moves an attachment to state (with err's text); at
	// detached its volume is free again.
	SetAttachment(ctx context.Context, id, state, errText string) (*Attachment, error)
	GetAttachment(ctx context.Context, id string) (*Attachment, error)
	// HeldAttachments lists a sandbox's attachments not yet detached.
	HeldAttachments(ctx context.Context, sandboxID string) ([]*Attachment, error)
}

// States of a backup.
const (
	BackupCreating = "creating"
	BackupReady    = "ready"
	BackupFailed   = "failed"
	BackupDeleted  = "deleted"
)

// Backup is a copy of a volume at one moment, kept on this server.
type Backup struct {
	ID         string
	VolumeID   string
	OwnerKeyID string
	Name       string
	SizeMiB    int
	State      string
	// Method is how the bytes were copied: "clone" (FICLONE, copy on
	// write) or "sparse-copy" (the data extents, SEEK_DATA/SEEK_HOLE).
	Method string
	// Consistent says how: "detached" (nothing wrote it), "frozen" (the
	// guest's filesystem was frozen for the copy).
	Consistent string
	Error      string
	CreatedAt  time.Time
	ReadyAt    *time.Time
	ExpiresAt  time.Time
}

// BackupListOptions select backups of one owner, newest first.
type BackupListOptions struct {
	OwnerKeyID string
	VolumeID   string
	State      string
	Limit      int
	Cursor     string
}

// BackupStore keeps backups; store.Store implements it.
type BackupStore interface {
	PutBackup(ctx context.Context, b *Backup) error // insert or replace
	GetBackup(ctx context.Context, id string) (*Backup, error)
	ListBackups(ctx context.Context, opts BackupListOptions) ([]*Backup, string, error)
	// ExpiredBackups lists backups (not deleted) whose expiry is before t.
	ExpiredBackups(ctx context.Context, t time.Time) ([]*Backup, error)
	// BackupUsage sums owner's backups that hold (or are copying) bytes:
	// creating or ready, of every volume, or of volumeID alone if given.
	BackupUsage(ctx context.Context, owner, volumeID string) (BackupUsage, error)
}

// BackupUsage is what a key's backups hold.
type BackupUsage struct {
	Count   int
	SizeMiB int64 // their volumes' sizes, the most a restore writes
}
