package catalog

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/emberbox/emberbox/internal/errdefs"
	"github.com/emberbox/emberbox/internal/sandbox"
)

// Config configures a Service.
type Config struct {
	Store Store
	// Builder runs builds; nil fails every build with builder_unavailable.
	Builder Builder
	// DataDir holds images/blobs, images/context and images/work.
	DataDir string
	// Builds is how many builds run at once (default 1).
	Builds int
	// BuildsPerKey bounds one key's builds queued or running (0: no
	// limit), so no key fills the one queue.
	BuildsPerKey int
	// DiskFreeMiB reports the data dir's free space (nil: not checked). A
	// build starts only if DiskReserveMiB would be left once its image (at
	// most its build disk) is written there.
	DiskFreeMiB    func() (int64, error)
	DiskReserveMiB int64
	Logger         *slog.Logger
	// DefaultRootfs and DefaultDigest are the server's own guest image,
	// registered as the public image "default".
	DefaultRootfs, DefaultDigest string
	// Events records sandbox events (the start command's outcome); nil
	// records none. *store.Store implements it.
	Events EventRecorder
	// Limits are the most a build may ask for, and its defaults, but for
	// the build disk, which is DefaultBuildDiskMiB unless asked (the
	// image's disk is the build's: every sandbox of it needs as much).
	Limits Limits
	// Chunks bound the context chunks each key keeps (defaults:
	// ChunkLimits' own).
	Chunks ChunkLimits
}

// EventRecorder appends an event to a sandbox's events.
type EventRecorder interface {
	AppendEvent(ctx context.Context, sandboxID, typ, message string, data map[string]any) error
}

// Defaults of a build's limits.
const (
	DefaultBuildTimeout = 30 * time.Minute
	DefaultMaxImageMiB  = 16384
	DefaultBuildDiskMiB = 4096
	MaxBuildDiskMiB     = 16384
	DefaultBuildMemMiB  = 2048
	DefaultBuildVCPU    = 2
	// DefaultBuildsPerKey is the flag's default of Config.BuildsPerKey.
	DefaultBuildsPerKey = 4
	// buildsRetryAfter is the wait a refused build is told: builds take
	// minutes.
	buildsRetryAfter = 30 * time.Second
)

// Service is the image catalog.
type Service struct {
	cfg    Config
	st     Store
	log    *slog.Logger
	blobs  blobStore
	chunks *chunkStore
	notes  notifier
	starts startReports

	templates TemplateRemover // nil: no templates to remove

	// blobMu orders a blob's removal (no image uses it) against a
	// build that is about to use it.
	blobMu sync.Mutex

	// createMu orders a key's count of its builds before one more is
	// recorded, so two creates cannot both take its last place.
	createMu sync.Mutex

	mu      sync.Mutex
	queue   []string
	kick    chan struct{}
	cancels map[string]context.CancelFunc // running builds
	now     func() time.Time
}

// New returns the catalog. Call Recover, then Run.
func New(cfg Config) (*Service, error) {
	if !cfg.Store.complete() || cfg.DataDir == "" {
		return nil, errors.New("images.New: Store and DataDir are required")
	}
	if cfg.Builds <= 0 {
		cfg.Builds = 1
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	l := &cfg.Limits
	if l.Timeout <= 0 {
		l.Timeout = DefaultBuildTimeout
	}
	if l.MaxImageMiB <= 0 {
		l.MaxImageMiB = DefaultMaxImageMiB
	}
	if l.DiskMiB <= 0 {
		l.DiskMiB = MaxBuildDiskMiB
	}
	if l.MemoryMiB <= 0 {
		l.MemoryMiB = DefaultBuildMemMiB
	}
	if l.VCPU <= 0 {
		l.VCPU = DefaultBuildVCPU
	}
	root := filepath.Join(cfg.DataDir, "images")
	s := &Service{
		cfg: cfg, st: cfg.Store, log: cfg.Logger,
		blobs:  blobStore{dir: filepath.Join(root, "blobs")},
		chunks: newChunkStore(filepath.Join(root, "context"), cfg.Chunks),
		kick:   make(chan struct{}, 1), cancels: map[string]context.CancelFunc{}, now: time.Now,
	}
	for _, d := range []string{root, s.blobs.dir, s.workRoot()} {
		// 0755: a VM's confined uid reads the blobs (linked into its jail).
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, fmt.Errorf("image catalog: %w", err)
		}
		if err := os.Chmod(d, 0o755); err != nil {
			return nil, fmt.Errorf("image catalog: %w", err)
		}
	}
	if err := os.MkdirAll(s.chunks.dir, 0o700); err != nil {
		return nil, fmt.Errorf("image catalog: %w", err)
	}
	return s, nil
}

// SetBuilder sets the builder (before Run): it is made after the
// sandbox manager it builds in, which needs the catalog's Preparer.
func (s *Service) SetBuilder(b Builder) { s.cfg.Builder = b }

func (s *Service) workRoot() string { return filepath.Join(s.cfg.DataDir, "images", "work") }

// Recover settles what a previous run left: a build it was running failed
// ("server restarted"), queued builds are queued again, a delete is
// finished, and the default image is registered.
func (s *Service) Recover(ctx context.Context) error {
	left, err := s.st.ImagesInStates(ctx, StateQueued, StateBuilding, StateDeleting)
	if err != nil {
		return err
	}
	for _, img := range left {
		switch img.State {
		case StateBuilding:
			s.fail(ctx, img, "server restarted", nil)
		case StateQueued:
			s.enqueue(img.ID)
		case StateDeleting:
			if err := s.finishDelete(ctx, img); err != nil {
				return err
			}
		}
	}
	_ = os.RemoveAll(s.workRoot())
	if err := os.MkdirAll(s.workRoot(), 0o755); err != nil {
		return fmt.Errorf("image catalog: %w", err)
	}
	if s.cfg.DefaultRootfs != "" {
		return s.registerDefault(ctx)
	}
	return nil
}

// registerDefault records the server's guest image as the public image
// "default", a new version when its digest changed.
func (s *Service) registerDefault(ctx context.Context) error {
	digest := s.cfg.DefaultDigest
	if !strings.HasPrefix(digest, "sha256:") {
		digest = "sha256:" + digest
	}
	cur, err := s.st.ImageByTag(ctx, SystemOwner, DefaultName, "latest")
	switch {
	case err == nil && cur.Digest == digest && cur.Rootfs == s.cfg.DefaultRootfs && cur.State == StateReady:
		return nil
	case err != nil && !errdefs.IsNotFound(err):
		return err
	}
	fi, err := os.Stat(s.cfg.DefaultRootfs)
	if err != nil {
		return fmt.Errorf("default image: %w", err)
	}
	now := s.now()
	img := &Image{
		ID: newID(), Owner: SystemOwner, Name: DefaultName, State: StateReady, Kind: SourceDefault, Source: []byte("{}"),
		Digest: digest, Rootfs: s.cfg.DefaultRootfs, SizeBytes: fi.Size(), DiskMiB: mibCeil(fi.Size()),
		Public: true, CreatedAt: now, ReadyAt: &now,
	}
	if err := s.st.CreateImage(ctx, img); err != nil {
		return err
	}
	if cur != nil {
		// The old version's disk is gone with the old guest image.
		cur.State = StateDeleted
		_ = s.st.RemoveTags(ctx, cur.ID)
		if err := s.st.UpdateImage(ctx, cur); err != nil {
			return err
		}
	}
	return s.st.SetTag(ctx, SystemOwner, DefaultName, "latest", img.ID)
}

func mibCeil(n int64) int { return int((n + 1<<20 - 1) >> 20) }

// Run runs queued builds, cfg.Builds at once, and sweeps old context
// chunks hourly, until ctx ends.
func (s *Service) Run(ctx context.Context) {
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(time.Hour)
		defer t.Stop()
		for {
			if n, err := s.chunks.sweep(s.now().Add(-ChunkTTL)); err != nil {
				s.log.Warn("sweeping image context chunks", "err", err)
			} else if n > 0 {
				s.log.Info("swept image context chunks", "count", n)
			}
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	})
	for range s.cfg.Builds {
		wg.Go(func() {
			for {
				id, ok := s.next(ctx)
				if !ok {
					return
				}
				s.build(ctx, id)
			}
		})
	}
	wg.Wait()
}

func (s *Service) enqueue(id string) {
	s.mu.Lock()
	s.queue = append(s.queue, id)
	s.mu.Unlock()
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

func (s *Service) next(ctx context.Context) (string, bool) {
	for {
		s.mu.Lock()
		if len(s.queue) > 0 {
			id := s.queue[0]
			s.queue = s.queue[1:]
			more := len(s.queue) > 0
			s.mu.Unlock()
			if more { // pass the wake-up on to another worker
				select {
				case s.kick <- struct{}{}:
				default:
				}
			}
			return id, true
		}
		s.mu.Unlock()
		select {
		case <-ctx.Done():
			return "", false
		case <-s.kick:
		}
	}
}

// Create records a build of src for owner and queues it.
func (s *Service) Create(ctx context.Context, owner string, req CreateRequest) (*Image, error) {
	if err := s.checkCreate(ctx, owner, &req); err != nil {
		return nil, err
	}
	req.Source.Tags = req.Tags
	raw, err := json.Marshal(req.Source)
	if err != nil {
		return nil, fmt.Errorf("encoding the build request: %w", err)
	}
	img := &Image{
		ID: newID(), Owner: owner, Name: req.Name, State: StateQueued, Kind: req.kind(), Source: raw,
		Labels: req.Labels, Tags: []string{}, CreatedAt: s.now(),
	}
	if err := s.record(ctx, img); err != nil {
		return nil, err
	}
	s.logLines(ctx, img.ID, []LogLine{{At: s.now(), Stream: "build", Text: "queued"}})
	s.enqueue(img.ID)
	return img, nil
}

// record stores a new build if its owner is within Config.BuildsPerKey
// (429 quota_exceeded otherwise). The count is the store's, so it holds
// across restarts.
func (s *Service) record(ctx context.Context, img *Image) error {
	s.createMu.Lock()
	defer s.createMu.Unlock()
	if limit := s.cfg.BuildsPerKey; limit > 0 {
		n, err := s.buildsOf(ctx, img.Owner)
		if err != nil {
			return err
		}
		if n >= limit {
			e := errdefs.New(errdefs.ErrConflict, "quota_exceeded", "this key's quota of %d image builds queued or running is reached (%d in use)", limit, n).
				WithHint("Wait for a build of this key to end (or delete a queued one), or ask the operator to raise --quota-image-builds.")
			e.Details = map[string]any{"quota": "imageBuilds", "limit": limit, "used": n, "requested": 1}
			e.RetryAfter = buildsRetryAfter
			return e
		}
	}
	return s.st.CreateImage(ctx, img)
}

// buildsOf counts owner's builds queued or running.
func (s *Service) buildsOf(ctx context.Context, owner string) (int, error) {
	open, err := s.st.ImagesInStates(ctx, StateQueued, StateBuilding)
	if err != nil {
		return 0, fmt.Errorf("counting image builds: %w", err)
	}
	n := 0
	for _, img := range open {
		if img.Owner == owner {
			n++
		}
	}
	return n, nil
}

// CreateRequest is a build request as the API validated it.
type CreateRequest struct {
	Source
	Name   string
	Tags   []string // default ["latest"] for a named image
	Labels map[string]string
}

func (r *CreateRequest) kind() string {
	switch {
	case r.Recipe != nil:
		return SourceRecipe
	case r.Dockerfile != "":
		return SourceDockerfile
	case r.Archive != nil:
		return SourceArchive
	}
	return SourceImage
}

// visible returns img if owner may see it, else image_not_found.
func visible(img *Image, owner string) (*Image, error) {
	if img.Owner != owner && !img.Public {
		return nil, imageNotFound(img.ID)
	}
	return img, nil
}

func imageNotFound(ref string) error {
	return errdefs.New(errdefs.ErrNotFound, "image_not_found", "No image %q here.", ref).
		WithHint("List your images with GET /v1/images; images of other keys are not visible.")
}

// Get returns an image owner may see.
func (s *Service) Get(ctx context.Context, owner, id string) (*Image, error) {
	if !uuidRE.MatchString(id) {
		return nil, imageNotFound(id)
	}
	img, err := s.st.GetImage(ctx, id)
	if err != nil {
		if errdefs.IsNotFound(err) {
			return nil, imageNotFound(id)
		}
		return nil, err
	}
	return visible(img, owner)
}

// owned returns an image owner may change.
func (s *Service) owned(ctx context.Context, owner, id string) (*Image, error) {
	img, err := s.Get(ctx, owner, id)
	if err != nil {
		return nil, err
	}
	if img.Owner != owner {
		return nil, errdefs.New(errdefs.ErrPermission, "permission_denied", "Image %s is public, not yours to change.", id)
	}
	if img.State == StateDeleted || img.State == StateDeleting {
		return nil, imageNotFound(id)
	}
	return img, nil
}

// List lists what owner sees: its images and the public ones.
func (s *Service) List(ctx context.Context, opt ListOptions) ([]*Image, error) {
	return s.st.ListImages(ctx, opt)
}

// Resolve finds an image by id, name (its latest tag), name:tag or
// name@version: owner's own first, then a public one.
func (s *Service) Resolve(ctx context.Context, owner, ref string) (*Image, error) {
	if uuidRE.MatchString(ref) {
		img, err := s.Get(ctx, owner, ref)
		if err == nil && img.State == StateDeleted {
			return nil, imageNotFound(ref)
		}
		return img, err
	}
	name, tag, version := ref, "latest", 0
	if n, v, ok := strings.Cut(ref, "@"); ok {
		num, err := strconv.Atoi(v)
		if err != nil || num < 1 {
			return nil, invalidField("ref", "%q: a version after @ is a number from 1", ref)
		}
		name, version = n, num
	} else if i := strings.LastIndexByte(ref, ':'); i >= 0 {
		name, tag = ref[:i], ref[i+1:]
	}
	if !nameRE.MatchString(name) || !tagRE.MatchString(tag) {
		return nil, imageNotFound(ref)
	}
	var img *Image
	var err error
	if version > 0 {
		img, err = s.st.ImageByVersion(ctx, owner, name, version)
	} else {
		img, err = s.st.ImageByTag(ctx, owner, name, tag)
	}
	if errdefs.IsNotFound(err) {
		img, err = s.st.PublicImage(ctx, name, tag, version)
	}
	if err != nil {
		if errdefs.IsNotFound(err) {
			return nil, imageNotFound(ref)
		}
		return nil, err
	}
	if img.State == StateDeleted {
		return nil, imageNotFound(ref)
	}
	return img, nil
}

// ForCreate resolves a create's image to what the manager boots: nil for
// the server's default image (which keeps fast starts from templates).
// The image must be ready.
func (s *Service) ForCreate(ctx context.Context, owner, ref string) (*sandbox.ImageRef, *Image, error) {
	img, err := s.Resolve(ctx, owner, ref)
	if err != nil {
		return nil, nil, err
	}
	if img.State != StateReady {
		return nil, nil, errdefs.New(errdefs.ErrConflict, "image_not_ready", "Image %s is %s, not ready.", ref, img.State).
			WithHint("Wait for its build: GET /v1/images/" + img.ID + "/logs?follow=true.")
	}
	if img.Kind == SourceDefault {
		return nil, img, nil
	}
	return &sandbox.ImageRef{ID: img.ID, Rootfs: img.Rootfs, MinDiskMiB: img.DiskMiB}, img, nil
}

// Tag points tag of the image's name at it.
func (s *Service) Tag(ctx context.Context, owner, id, tag string) (*Image, error) {
	img, err := s.owned(ctx, owner, id)
	if err != nil {
		return nil, err
	}
	if !tagRE.MatchString(tag) {
		return nil, invalidField("tag", "must be 1 to 128 characters of A-Z a-z 0-9 _ . -")
	}
	if img.Name == "" {
		return nil, invalidField("tag", "an unnamed image has no tags; build it with a name")
	}
	if img.State != StateReady {
		return nil, errdefs.New(errdefs.ErrConflict, "image_not_ready", "Image %s is %s; only a ready image is tagged.", id, img.State)
	}
	if err := s.st.SetTag(ctx, owner, img.Name, tag, img.ID); err != nil {
		return nil, err
	}
	return s.st.GetImage(ctx, id)
}

// Untag removes tag from the image.
func (s *Service) Untag(ctx context.Context, owner, id, tag string) (*Image, error) {
	img, err := s.owned(ctx, owner, id)
	if err != nil {
		return nil, err
	}
	removed, err := s.st.RemoveTag(ctx, owner, img.Name, tag, img.ID)
	if err != nil {
		return nil, err
	}
	if !removed {
		return nil, errdefs.New(errdefs.ErrNotFound, "tag_not_found", "Image %s has no tag %q.", id, tag)
	}
	return s.st.GetImage(ctx, id)
}

// Delete deletes one version and its tags, refused while a sandbox or a
// snapshot uses it. Its disk goes when no other image shares it.
func (s *Service) Delete(ctx context.Context, owner, id string) (*Image, error) {
	img, err := s.owned(ctx, owner, id)
	if err != nil {
		return nil, err
	}
	if err := s.checkUnused(ctx, id); err != nil {
		return nil, err
	}
	s.mu.Lock()
	cancel := s.cancels[id]
	s.mu.Unlock()
	if cancel != nil {
		cancel()
	}
	// Under blobMu, from a fresh read: a build finishing now either
	// recorded its blob before (and it goes with the image) or finds the
	// image deleted and records nothing.
	s.blobMu.Lock()
	img, err = s.st.GetImage(ctx, id)
	if err == nil && (img.State == StateDeleted || img.State == StateDeleting) {
		err = imageNotFound(id)
	}
	if err == nil {
		img.State = StateDeleting
		if err = s.st.UpdateImage(ctx, img); err == nil {
			err = s.finishDeleteLocked(ctx, img)
		}
	}
	s.blobMu.Unlock()
	if err != nil {
		return nil, err
	}
	s.notes.notify(id)
	return s.st.GetImage(ctx, id)
}

// Forgetter is what a Builder with a step cache implements: it drops the
// cached steps built on an image (snapshots that are overlays of its
// disk), which the catalog asks before it deletes the image.
type Forgetter interface {
	ForgetImage(ctx context.Context, imageID string) error
}

// checkUnused refuses the delete of an image a sandbox (any, builds'
// too) or a tenant's snapshot uses; the builder's cached steps on it are
// dropped first.
func (s *Service) checkUnused(ctx context.Context, id string) error {
	sbs, snaps, internal, err := s.st.ImageUsers(ctx, id)
	if err != nil {
		return err
	}
	if sbs+snaps-internal > 0 {
		return inUse(id, sbs, snaps-internal)
	}
	if internal == 0 {
		return nil
	}
	if f, ok := s.cfg.Builder.(Forgetter); ok {
		if err := f.ForgetImage(ctx, id); err != nil {
			return fmt.Errorf("dropping the build cache of image %s: %w", id, err)
		}
	}
	if sbs, snaps, _, err = s.st.ImageUsers(ctx, id); err != nil {
		return err
	}
	if sbs+snaps > 0 {
		return inUse(id, sbs, snaps)
	}
	return nil
}

func inUse(id string, sandboxes, snapshots int) error {
	return errdefs.New(errdefs.ErrConflict, "image_in_use",
		"Image %s is used by %d sandboxes and %d snapshots.", id, sandboxes, snapshots).
		WithHint("Delete those sandboxes and snapshots first.")
}

func (s *Service) finishDelete(ctx context.Context, img *Image) error {
	s.blobMu.Lock()
	defer s.blobMu.Unlock()
	return s.finishDeleteLocked(ctx, img)
}

func (s *Service) finishDeleteLocked(ctx context.Context, img *Image) error {
	if err := s.st.RemoveTags(ctx, img.ID); err != nil {
		return err
	}
	img.State = StateDeleted
	if err := s.st.UpdateImage(ctx, img); err != nil {
		return err
	}
	return s.releaseBlobLocked(ctx, img.Digest)
}

// releaseBlobLocked removes a digest's blob once no image uses it; the
// caller holds blobMu.
func (s *Service) releaseBlobLocked(ctx context.Context, digest string) error {
	if digest == "" {
		return nil
	}
	n, err := s.st.DigestUsers(ctx, digest)
	if err != nil || n > 0 {
		return err
	}
	if s.templates != nil && digestRE.MatchString(digest) {
		// No image of the digest is left, so no sandbox or snapshot of
		// one is: nothing is over its templates' disks.
		if err := s.templates.RemoveTemplates(s.blobs.path(digest)); err != nil {
			s.log.Warn("removing the templates of a released image disk", "digest", digest, "err", err)
		}
	}
	return s.blobs.remove(digest)
}

// TemplateRemover removes what was made from an image's disk to create
// its sandboxes fast: the sandbox manager's templates (sandbox.Manager
// implements it).
type TemplateRemover interface {
	RemoveTemplates(rootfs string) error
}

// SetTemplates sets what removes a released disk's templates (before
// Recover): the manager is made after the catalog, which it needs for its
// Preparer.
func (s *Service) SetTemplates(t TemplateRemover) { s.templates = t }
