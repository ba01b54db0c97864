package catalog

import (
	"context"
	"time"

	"github.com/emberbox/emberbox/internal/sandbox"
)

// Source kinds: what an image is built from.
const (
	SourceRecipe     = "recipe"     // Recipe on top of a base image
	SourceDockerfile = "dockerfile" // Dockerfile with an uploaded context
	SourceImage      = "image"      // an OCI image by registry reference
	SourceArchive    = "archive"    // an uploaded OCI layout or docker save tarball
	SourceDefault    = "default"    // the server's own guest image
)

// Recipe is the recipe source: packages and files on top of Base.
type Recipe struct {
	Base     string            `json:"base,omitempty"` // image reference; "" = the default image
	Apt      []string          `json:"apt,omitempty"`
	Pip      []string          `json:"pip,omitempty"`
	Npm      []string          `json:"npm,omitempty"`
	Go       []string          `json:"go,omitempty"`       // go install arguments (module@version)
	Files    []File            `json:"files,omitempty"`    // written before Commands run
	Commands []string          `json:"commands,omitempty"` // shell commands, run as root (alias "run")
	Env      map[string]string `json:"env,omitempty"`
	Workdir  string            `json:"workdir,omitempty"`
}

// File is a file a recipe writes into the image.
type File struct {
	Path     string `json:"path"`
	Content  string `json:"content"`
	Encoding string `json:"encoding,omitempty"` // "" or "utf-8", or "base64"
	Mode     string `json:"mode,omitempty"`     // octal, e.g. "0755"
}

// Context is an uploaded build context: a gzipped tar in chunks stored
// by digest (PUT /v1/images/context/{digest}), and its file list.
type Context struct {
	Archive ContextArchive `json:"archive"`
	Files   []ContextFile  `json:"files,omitempty"`
}

// ContextArchive names the archive's chunks, in order.
type ContextArchive struct {
	SHA256 string   `json:"sha256"`
	Size   int64    `json:"size"`
	Chunks []string `json:"chunks"`
}

// ContextFile is one file of a context, as the client listed it.
type ContextFile struct {
	Path   string `json:"path"`
	SHA256 string `json:"sha256"`
	Size   int64  `json:"size"`
	Mode   int    `json:"mode"`
}

// StartSpec is what a sandbox of the image runs once booted, and how the
// server knows it is ready (one of ReadyPort, ReadyCommand, or neither).
type StartSpec struct {
	Command             string `json:"command"`
	ReadyPort           int    `json:"readyPort,omitempty"`
	ReadyCommand        string `json:"readyCommand,omitempty"`
	ReadyTimeoutSeconds int    `json:"readyTimeoutSeconds,omitempty"`
}

// Limits bound one build.
type Limits struct {
	Timeout     time.Duration // the whole build
	MaxImageMiB int           // the image's disk
	DiskMiB     int           // the build sandbox's disk
	MemoryMiB   int           // the build sandbox's memory
	VCPU        int
}

// Job is one build, as the catalog hands it to the Builder.
type Job struct {
	ImageID string
	Owner   string // the API key the image belongs to
	Kind    string // Source*

	Recipe *Recipe

	Dockerfile string
	Context    *Context
	// ContextDir is where the catalog assembled the context's archive
	// (context.tar.gz) from its chunks; "" without a context.
	ContextDir string
	BuildArgs  map[string]string
	Target     string
	NoStart    bool // drop a Dockerfile's CMD, ENTRYPOINT and HEALTHCHECK

	Reference   string // SourceImage: a registry reference
	ArchivePath string // SourceArchive: the uploaded tarball on the host

	Env   map[string]string // added to the image's environment
	Start *StartSpec        // overrides a Dockerfile's CMD
	Cache bool              // reuse and record cached steps
	Limits

	// WorkDir is a private directory for the build's files on the host;
	// the catalog removes it afterwards.
	WorkDir string
	// Resolve finds a base image by reference for this owner (FROM, base).
	Resolve func(ctx context.Context, ref string) (*Resolved, error)
}

// Resolved is a base image found by reference.
type Resolved struct {
	Ref    sandbox.ImageRef
	Digest string
	Env    map[string]string
	Workdir,
	User string
}

// Result is a finished build.
type Result struct {
	// RootfsPath is a raw ext4 disk image under Job.WorkDir; the catalog
	// moves it into its blob store.
	RootfsPath string
	// Digest addresses the image by its content: "sha256:" and the hex
	// hash of everything that went into it (base digest, steps, files).
	Digest     string
	SizeBytes  int64 // bytes allocated on the host
	MinDiskMiB int   // the disk's size
	Env        map[string]string
	Workdir    string
	User       string
	Start      *StartSpec
	Labels     map[string]string
}

// LogSink receives a build's log, line by line. Stream is "build" for the
// builder's own lines (steps, cache hits), "stdout" or "stderr" for a
// step's output.
type LogSink interface {
	Line(stream, text string)
}

// Builder runs builds. Build returns an error of class
// errdefs.ErrInvalidArgument for a source it refuses (naming the step or
// instruction), and any other error for a build that failed; the log holds
// the details either way.
type Builder interface {
	Build(ctx context.Context, job Job, log LogSink) (Result, error)
}
