// Package volumes keeps disks that outlive sandboxes. A volume is a sparse
// raw file on the host, formatted ext4 there when it is made (an empty
// filesystem the host made itself; host tools never touch a disk a guest
// has written). Attached to a running sandbox, it reaches the guest as a
// network block device over the host-guest stream: the agent connects
// /dev/nbdN and relays its requests on a volume.nbd stream, which this
// package answers from the file (nbd.go). One sandbox holds a volume at a
// time.
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
