package catalog

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"time"
)

// States of an image.
const (
	StateQueued   = "queued"
	StateBuilding = "building"
	StateReady    = "ready"
	StateFailed   = "failed"
	StateDeleting = "deleting"
	StateDeleted  = "deleted"
)

// SystemOwner owns the default image; it is no API key.
const SystemOwner = "system"

// DefaultName is the name of the server's own guest image.
const DefaultName = "default"

// Image is one version of an image: a record of the catalog.
type Image struct {
	ID      string // a UUID (the SDK tells ids from names by that)
	Owner   string // the API key that built it, or SystemOwner
	Name    string // "" for an unnamed build
	Version int    // 1, 2, 3… per owner and name; 0 when unnamed
	Tags    []string
	State   string
	Kind    string // Source*
	// Source is the build request as received (Source, JSON), so a build
	// queued when the server stopped can run after it starts again.
	Source       json.RawMessage
	Error        string
	Digest       string // "sha256:…" of its build inputs, once ready
	Rootfs       string // the blob's path on the host, once ready
	SizeBytes    int64
	DiskMiB      int // the smallest disk a sandbox of it may have
	Env          map[string]string
	Workdir      string
	User         string
	Start        *StartSpec
	Labels       map[string]string
	Public       bool // visible to every key (published, or the default)
	CreatedAt    time.Time
	ReadyAt      *time.Time
	BuildSeconds float64
}

// String names the image for logs: name@version, or its id when unnamed.
func (img *Image) String() string {
	if img.Name == "" {
		return img.ID
	}
	return fmt.Sprintf("%s@%d", img.Name, img.Version)
}

// Source is a build request, kept with the image.
type Source struct {
	Recipe     *Recipe           `json:"recipe,omitempty"`
	Dockerfile string            `json:"dockerfile,omitempty"`
	Files      []File            `json:"files,omitempty"` // inline context files of a Dockerfile
	Context    *Context          `json:"context,omitempty"`
	BuildArgs  map[string]string `json:"buildArgs,omitempty"`
	Target     string            `json:"target,omitempty"`
	NoStart    bool              `json:"noStart,omitempty"`
	Reference  string            `json:"image,omitempty"`
	// Archive is an uploaded OCI layout or docker save tarball (plain
	// tar), in chunks as a context is uploaded.
	Archive *ContextArchive   `json:"archive,omitempty"`
	Env     map[string]string `json:"env,omitempty"`
	Start   *StartSpec        `json:"start,omitempty"`
	Cache   *bool             `json:"cache,omitempty"`
	Build   BuildLimits       `json:"build"`
	Tags    []string          `json:"tags,omitempty"` // moved to it when ready
}

// BuildLimits are the limits a build request asks for (0: the default).
type BuildLimits struct {
	TimeoutSeconds int `json:"timeoutSeconds,omitempty"`
	MaxImageMiB    int `json:"maxImageMiB,omitempty"`
	DiskMiB        int `json:"diskMiB,omitempty"`
	MemoryMiB      int `json:"memoryMiB,omitempty"`
	VCPU           int `json:"vcpu,omitempty"`
}

// LogLine is one line of a build's log.
type LogLine struct {
	Seq    int64
	At     time.Time
	Stream string
	Text   string
}

// ListOptions select images for List.
type ListOptions struct {
	Owner  string // its own images, and public ones
	State  string // "" any but deleted
	Name   string
	Limit  int
	Cursor string // the last id of the previous page
}

// Store keeps the catalog, by role; internal/store's one value fills
// every role. Errors carry errdefs classes: a missing image is ErrNotFound.
type Store struct {
	ImageRecords
	ImageTags
	ImageHolders
	BuildLogs
}

// complete reports whether st fills every role.
func (st Store) complete() bool {
	return st.ImageRecords != nil && st.ImageTags != nil && st.ImageHolders != nil && st.BuildLogs != nil
}

// ImageRecords keeps the images.
type ImageRecords interface {
	// CreateImage records img, giving it the next version of its owner
	// and name (img.Version is set).
	CreateImage(ctx context.Context, img *Image) error
	// GetImage returns an image by id, with its tags, whoever owns it.
	GetImage(ctx context.Context, id string) (*Image, error)
	// UpdateImage saves an image's state and build outcome: state, error,
	// digest, rootfs, size, disk, env, workdir, user, start, labels,
	// public, readyAt and buildSeconds.
	UpdateImage(ctx context.Context, img *Image) error
	// FinishImage saves a build's outcome as UpdateImage does and points
	// img's owner's name:tag at it for each of tags, in one transaction.
	FinishImage(ctx context.Context, img *Image, tags []string) error
	// ListImages lists images newest first.
	ListImages(ctx context.Context, opt ListOptions) ([]*Image, error)
	// ImagesInStates lists every image in one of states, oldest first.
	ImagesInStates(ctx context.Context, states ...string) ([]*Image, error)
	// ImageByTag returns owner's image tagged name:tag.
	ImageByTag(ctx context.Context, owner, name, tag string) (*Image, error)
	// ImageByVersion returns owner's version of name.
	ImageByVersion(ctx context.Context, owner, name string, version int) (*Image, error)
	// PublicImage returns the public image named name by tag (or, with
	// version > 0, by version), of any owner.
	PublicImage(ctx context.Context, name, tag string, version int) (*Image, error)
}

// ImageTags keeps the name:tag pointers at images.
type ImageTags interface {
	// SetTag points owner's name:tag at id, moving it from another version.
	SetTag(ctx context.Context, owner, name, tag, id string) error
	// RemoveTag removes name:tag if it points at id; removed says whether.
	RemoveTag(ctx context.Context, owner, name, tag, id string) (removed bool, err error)
	// RemoveTags removes every tag of an image.
	RemoveTags(ctx context.Context, id string) error
}

// ImageHolders counts what still holds an image.
type ImageHolders interface {
	// ImageUsers counts the sandboxes and snapshots (not deleted) made
	// from image id; internal counts the snapshots among them of internal
	// owners ("system:…": the builder's step cache).
	ImageUsers(ctx context.Context, id string) (sandboxes, snapshots, internal int, err error)
	// DigestUsers counts the images not deleted whose digest is digest.
	DigestUsers(ctx context.Context, digest string) (int, error)
}

// BuildLogs keeps the build log of each image.
type BuildLogs interface {
	// AppendImageLog appends lines (Seq is assigned) and returns the last seq.
	AppendImageLog(ctx context.Context, id string, lines []LogLine) (int64, error)
	// ImageLog returns up to limit lines after seq after.
	ImageLog(ctx context.Context, id string, after int64, limit int) ([]LogLine, error)
}

// newID returns a random UUID (version 4).
func newID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}
