package agentproto

// Volumes (internal/volumes): a disk file on the host reaches the guest as a
// network block device whose bytes ride the host-guest stream. volume.attach
// (host to guest) makes the agent connect a free /dev/nbdN, open a
// volume.nbd stream back to the host for its blocks and mount the device at
// Path; volume.detach syncs, unmounts and disconnects it. The guest opens
// one volume.nbd stream per attachment: after the Request (Volume names the
// attachment) the host answers one Reply (OK, or an Error when the store
// says this sandbox does not hold the attachment), then the stream carries
// the NBD transmission phase, the agent's requests and the host's replies.
// The guest opens it again after the session is lost (server restart,
// wake), resending what the host had not answered.
const (
	MethodVolumeAttach = "volume.attach"
	MethodVolumeDetach = "volume.detach"
	MethodVolumeNBD    = "volume.nbd"
	// volume.freeze flushes an attachment's filesystem and holds its writes
	// (FIFREEZE) while the host copies the volume; volume.thaw lets them go.
	// The agent thaws by itself after FreezeTimeout if no thaw comes.
	MethodVolumeFreeze = "volume.freeze"
	MethodVolumeThaw   = "volume.thaw"
	// volume.sync flushes every attached volume (syncfs): the host asks
	// before it ends a VM, so a stop loses nothing written to a volume.
	MethodVolumeSync = "volume.sync"
)

// FreezeTimeout bounds how long a volume stays frozen without a thaw.
const FreezeTimeout = 120 // seconds

// VolumeRequest names an attachment and where it is mounted.
type VolumeRequest struct {
	AttachmentID string `json:"attachmentId"`
	Path         string `json:"path,omitempty"`
	// SizeBytes is the volume's size, a multiple of VolumeBlockSize; the
	// filesystem is grown to it at attach when smaller.
	SizeBytes int64 `json:"sizeBytes,omitempty"`
}

// VolumeBlockSize is the block size of every volume device.
const VolumeBlockSize = 4096

// MaxVolumeAttachments bounds the volumes one guest holds at once.
const MaxVolumeAttachments = 8

// CodeBusy is the error code of a detach whose mount is in use.
const CodeBusy = "volume_busy"
