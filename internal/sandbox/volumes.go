package sandbox

import (
	"bufio"
	"context"
	"log/slog"
	"net"
	"time"

	"github.com/emberbox/emberbox/internal/agentproto"
	"github.com/emberbox/emberbox/internal/errdefs"
	"github.com/emberbox/emberbox/internal/guest"
)

// VolumeMount asks for a volume at a create: mounted at Path ("rw" is the
// only mode).
type VolumeMount struct {
	VolumeID string
	Path     string
	Mode     string
}

// MaxCreateVolumes bounds the volumes of one create.
const MaxCreateVolumes = 4

// VolumeBlockSize is the block size of a volume's device in the guest.
const VolumeBlockSize = agentproto.VolumeBlockSize

// Volumes is what the manager needs from the volume service
// (internal/volumes). The service attaches a create's volumes itself, as a
// Preparer, before the sandbox runs.
type Volumes interface {
	// Claim records that the new sandbox sb (not yet stored) is to hold
	// mounts; an error refuses the create.
	Claim(ctx context.Context, sb *Sandbox, mounts []VolumeMount) error
	// Release ends a sandbox's attachments: it stopped or was deleted,
	// and its volumes are free again.
	Release(ctx context.Context, sandboxID string)
	// Holds reports whether a sandbox holds any volume.
	Holds(ctx context.Context, sandboxID string) bool
	// ServeVolume serves a volume.nbd stream the sandbox's guest opened
	// (see guest.VolumeHandler).
	ServeVolume(ctx context.Context, sandboxID, attachmentID string, c net.Conn, br *bufio.Reader, accept func(error) error)
}

// VolumeReattacher is the capability of a Volumes to mount the volumes a
// sandbox holds in a new VM of it (a switch of image), as they were.
type VolumeReattacher interface {
	// Mounts are the guest paths of the volumes the sandbox holds.
	Mounts(ctx context.Context, sandboxID string) ([]string, error)
	Reattach(ctx context.Context, sandboxID string, g guest.Handle) error
}

// ServeVolume implements guest.VolumeHandler for a sandbox's streams.
func (h gateHandler) ServeVolume(ctx context.Context, attachmentID string, c net.Conn, br *bufio.Reader, accept func(error) error) {
	if h.vols == nil {
		_ = accept(errdefs.New(errdefs.ErrNotFound, "volume_not_found", "no volumes here"))
		return
	}
	h.vols.ServeVolume(ctx, h.in.id, attachmentID, c, br, accept)
}

var _ guest.VolumeHandler = gateHandler{}

// volumeHooks are the manager's calls into the volume service at a
// sandbox's transitions; with no service they do nothing.
type volumeHooks struct {
	vols Volumes // nil: no sandbox holds volumes
	log  *slog.Logger
}

// refuse refuses a snapshot or fork of a sandbox holding volumes: their
// contents are not part of it.
func (vh volumeHooks) refuse(ctx context.Context, id string) error {
	if vh.vols != nil && vh.vols.Holds(ctx, id) {
		return errdefs.New(errdefs.ErrConflict, "volumes_attached",
			"sandbox %s holds volumes; snapshots and forks need a sandbox with no volumes", id).
			WithHint("detach its volumes first")
	}
	return nil
}

// release frees the volumes of a sandbox that stopped or is deleted.
func (vh volumeHooks) release(id string) {
	if vh.vols != nil {
		vh.vols.Release(context.Background(), id)
	}
}

// volumeSyncTimeout bounds the flush of a sandbox's volumes before its VM
// ends.
const volumeSyncTimeout = 20 * time.Second

// sync asks the guest to flush its volumes before its VM ends: a guest's
// page cache holds writes for up to 30 s, which a stop would lose.
func (vh volumeHooks) sync(id string, c *guest.Client) {
	if vh.vols == nil || !vh.vols.Holds(context.Background(), id) {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), volumeSyncTimeout)
	defer cancel()
	if err := c.SyncVolumes(ctx); err != nil {
		vh.log.Warn("flushing volumes before the VM ends", "sandbox_id", id, "err", err)
	}
}
