package recipebuild

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/emberbox/emberbox/internal/catalog"
	"github.com/emberbox/emberbox/internal/errdefs"
	"github.com/emberbox/emberbox/internal/guest"
	"github.com/emberbox/emberbox/internal/sandbox"
)

// Owner owns build sandboxes and cache snapshots: no API key is it, so
// tenants never list them; admission counts them like any sandbox.
const Owner = "system:build"

// Manager is what a build needs of the sandbox manager;
// *sandbox.Manager implements it.
type Manager interface {
	Create(ctx context.Context, owner string, spec sandbox.CreateSpec) (*sandbox.Sandbox, error)
	WaitFor(ctx context.Context, owner, id string, states ...sandbox.State) (*sandbox.Sandbox, error)
	Guest(ctx context.Context, owner, id string) (*sandbox.Sandbox, guest.Handle, error)
	Delete(ctx context.Context, owner, id string) (*sandbox.Sandbox, error)
	List(ctx context.Context, opts sandbox.ListOptions) ([]*sandbox.Sandbox, string, error)
}

var _ Manager = (*sandbox.Manager)(nil)

// Snapshots is what a build needs of the sandbox manager's snapshots: the
// step cache's disks; *sandbox.Snapshots implements it.
type Snapshots interface {
	Snapshot(ctx context.Context, owner, id string, spec sandbox.SnapshotSpec) (*sandbox.Snapshot, error)
	GetSnapshot(ctx context.Context, owner, id string) (*sandbox.Snapshot, error)
	DeleteSnapshot(ctx context.Context, owner, id string) error
	ExportDisk(ctx context.Context, owner, snapshotID, dst string) error
	ListSnapshots(ctx context.Context, opts sandbox.SnapshotListOptions) ([]*sandbox.Snapshot, string, error)
}

var _ Snapshots = (*sandbox.Snapshots)(nil)

// Cache records which disk snapshot holds a build's disk after the steps a
// key names; *store.Store implements it (the build_cache table).
type Cache interface {
	// GetBuildCache returns the snapshot under key and marks it used;
	// errdefs.ErrNotFound if there is none.
	GetBuildCache(ctx context.Context, key string, now time.Time) (string, error)
	// PutBuildCache records snapshotID under key and returns the snapshot
	// it replaced ("" for none).
	PutBuildCache(ctx context.Context, key, snapshotID string, now time.Time) (string, error)
	DeleteBuildCache(ctx context.Context, key string) error
	// EvictBuildCache keeps the keep most recently used entries and
	// returns the snapshots of those it dropped.
	EvictBuildCache(ctx context.Context, keep int) ([]string, error)
	// BuildCacheSnapshots lists every entry: key → snapshot.
	BuildCacheSnapshots(ctx context.Context) (map[string]string, error)
}

// Importer makes a root disk of an OCI image: a registry reference, or
// job.ArchivePath (an uploaded OCI layout or docker save tarball) when ref
// is "". internal/ociimport plugs in here. A job of kind image
// or archive returns its Result as is; a Dockerfile's FROM of a reference
// no image of ours has builds on it, so its RootfsPath must outlive the
// build (the step cache's snapshots are overlays of it) and be readable by
// the VMs (mode 0644 in a 0755 directory chain).
type Importer interface {
	Import(ctx context.Context, job catalog.Job, ref string, log catalog.LogSink) (catalog.Result, error)
}

// Config configures a Builder.
type Config struct {
	Manager Manager
	Cache   Cache    // nil: no step cache
	Import  Importer // nil: FROM an OCI image and imports are refused
	Logger  *slog.Logger
	// Snapshots keeps the step cache's disks: the manager's
	// (sandbox.Manager.Snapshots).
	Snapshots Snapshots
	// CacheEntries bounds the step cache (least recently used dropped).
	CacheEntries int // default 50
	// DefaultDigest addresses the server's default image in cache keys
	// when Job.Resolve does not know "default" (the guest image's hash).
	DefaultDigest string
	// Default shape of a build sandbox, where Job.Limits leave it zero.
	VCPU      int // default 2
	MemoryMiB int // default 2048
	DiskMiB   int // default 4096
	Timeout   time.Duration
}

// Builder runs builds; it implements catalog.Builder.
type Builder struct {
	cfg Config
	log *slog.Logger
}

var _ catalog.Builder = (*Builder)(nil)

// New returns a Builder.
func New(cfg Config) *Builder {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.CacheEntries <= 0 {
		cfg.CacheEntries = 50
	}
	if cfg.VCPU <= 0 {
		cfg.VCPU = 2
	}
	if cfg.MemoryMiB <= 0 {
		cfg.MemoryMiB = 2048
	}
	if cfg.DiskMiB <= 0 {
		cfg.DiskMiB = 4096
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 30 * time.Minute
	}
	if cfg.DefaultDigest == "" {
		cfg.DefaultDigest = "default"
	}
	return &Builder{cfg: cfg, log: cfg.Logger}
}

// Build implements catalog.Builder.
func (b *Builder) Build(ctx context.Context, job catalog.Job, log catalog.LogSink) (catalog.Result, error) {
	if log == nil {
		log = discard{}
	}
	log = &boundedSink{sink: log}
	timeout := job.Timeout
	if timeout <= 0 {
		timeout = b.cfg.Timeout
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	start := time.Now()
	res, err := b.build(ctx, job, log)
	if err != nil {
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			err = errdefs.New(errdefs.ErrUnavailable, "build_timeout", "the build took longer than %s: %v", timeout, err)
		}
		log.Line("build", "build failed: "+err.Error())
		return catalog.Result{}, err
	}
	log.Line("build", fmt.Sprintf("built %s in %s (%d MiB disk, %d bytes)", res.Digest, time.Since(start).Round(time.Millisecond), res.MinDiskMiB, res.SizeBytes))
	return res, nil
}

func (b *Builder) build(ctx context.Context, job catalog.Job, log catalog.LogSink) (catalog.Result, error) {
	if job.WorkDir == "" {
		return catalog.Result{}, errors.New("a build without a work directory")
	}
	var p *plan
	var err error
	switch job.Kind {
	case catalog.SourceRecipe:
		if job.Recipe == nil {
			return catalog.Result{}, invalid("a recipe build without a recipe")
		}
		p, err = compileRecipe(job.Recipe)
	case catalog.SourceDockerfile:
		var notices []string
		p, notices, err = compileDockerfile(job.Dockerfile, job.BuildArgs, job.Target)
		for _, n := range notices {
			log.Line("build", n)
		}
	case catalog.SourceImage, catalog.SourceArchive:
		return b.importImage(ctx, job, log)
	default:
		return catalog.Result{}, invalid("source kind %q is not built here", job.Kind)
	}
	if err != nil {
		return catalog.Result{}, err
	}
	bd := &build{b: b, job: job, log: log, plan: p, local: map[string]string{}}
	defer bd.cleanup()
	return bd.run(ctx)
}

// importImage hands an OCI image to the importer.
func (b *Builder) importImage(ctx context.Context, job catalog.Job, log catalog.LogSink) (catalog.Result, error) {
	ref := job.Reference
	if b.cfg.Import == nil {
		return catalog.Result{}, invalid("%s: OCI images arrive with the import, which this server does not have yet", orArchive(ref))
	}
	return b.cfg.Import.Import(ctx, job, ref, log)
}

func orArchive(ref string) string {
	if ref == "" {
		return "the uploaded archive"
	}
	return ref
}

type discard struct{}

func (discard) Line(string, string) {}

// boundedSink cuts long lines; the catalog bounds the count.
type boundedSink struct{ sink catalog.LogSink }

const maxLogLine = 16 << 10

func (s *boundedSink) Line(stream, text string) {
	if len(text) > maxLogLine {
		text = text[:maxLogLine] + " [line cut]"
	}
	s.sink.Line(stream, text)
}

// ForgetImage drops the cached steps whose disks are overlays of image
// imageID (built on it as a base), deleting their snapshots: the catalog
// calls it before deleting an image, whose disk would otherwise be in use
// by the cache (snapshots.image_id) — or gone from under it.
func (b *Builder) ForgetImage(ctx context.Context, imageID string) error {
	if b.cfg.Cache == nil || imageID == "" {
		return nil
	}
	all, err := b.cfg.Cache.BuildCacheSnapshots(ctx)
	if err != nil {
		return err
	}
	for key, id := range all {
		sn, err := b.cfg.Snapshots.GetSnapshot(ctx, Owner, id)
		if err != nil && !errdefs.IsNotFound(err) {
			return err
		}
		if err == nil && sn.ImageID != imageID {
			continue
		}
		if err := b.cfg.Cache.DeleteBuildCache(ctx, key); err != nil {
			return err
		}
		if err := b.cfg.Snapshots.DeleteSnapshot(ctx, Owner, id); err != nil && !errdefs.IsNotFound(err) {
			return err
		}
	}
	return nil
}
