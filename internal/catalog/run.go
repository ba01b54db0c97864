package catalog

import (
	"archive/tar"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/emberbox/emberbox/internal/errdefs"
)

// build runs one queued build to its end: ready, failed, or (deleted
// meanwhile) dropped.
func (s *Service) build(ctx context.Context, id string) {
	img, err := s.st.GetImage(ctx, id)
	if err != nil || img.State != StateQueued {
		return
	}
	bctx, cancel := context.WithCancel(ctx)
	s.mu.Lock()
	s.cancels[id] = cancel
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.cancels, id)
		s.mu.Unlock()
		cancel()
	}()

	img.State = StateBuilding
	if err := s.st.UpdateImage(ctx, img); err != nil {
		s.log.Warn("starting an image build", "image_id", id, "err", err)
		return
	}
	start := s.now()
	log := &sink{s: s, ctx: ctx, id: id}
	log.Line("build", "build started")
	s.log.Info("image build started", "image_id", id, "owner", img.Owner, "kind", img.Kind)

	work := filepath.Join(s.workRoot(), id)
	defer os.RemoveAll(work)
	res, err := s.runBuilder(bctx, img, work, log)
	if err == nil {
		err = s.finish(ctx, img, work, res, start)
	}
	if cur, gerr := s.st.GetImage(ctx, id); gerr == nil && (cur.State == StateDeleted || cur.State == StateDeleting) {
		// Deleted while it built (finish recorded nothing).
		s.notes.notify(id)
		return
	}
	if err != nil {
		// The builder's words reach the image's owner: no host paths.
		msg := strings.ReplaceAll(errorText(err), work, "<build>")
		s.fail(ctx, img, strings.ReplaceAll(msg, s.cfg.DataDir, "<data>"), log)
		return
	}
	log.Line("build", fmt.Sprintf("ready in %.1fs: %s (%d MiB)", img.BuildSeconds, img.Digest, mibCeil(img.SizeBytes)))
	s.log.Info("image build ready", "image_id", id, "digest", img.Digest, "seconds", img.BuildSeconds)
	s.notes.notify(id)
}

// errorText is what a failed build says: a coded error's message is
// written for callers; any other error's text is the builder's own.
func errorText(err error) string {
	var ce *errdefs.CodedError
	if errors.As(err, &ce) {
		return ce.Message
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return "the build took longer than its time limit"
	}
	return err.Error()
}

func (s *Service) fail(ctx context.Context, img *Image, msg string, log *sink) {
	if log != nil {
		log.Line("build", "build failed: "+msg)
	} else {
		s.logLines(ctx, img.ID, []LogLine{{At: s.now(), Stream: "build", Text: "build failed: " + msg}})
	}
	img.State, img.Error = StateFailed, msg
	if err := s.st.UpdateImage(context.WithoutCancel(ctx), img); err != nil {
		s.log.Warn("recording a failed image build", "image_id", img.ID, "err", err)
	}
	s.log.Info("image build failed", "image_id", img.ID, "error", msg)
	s.notes.notify(img.ID)
}

func (s *Service) runBuilder(ctx context.Context, img *Image, work string, log *sink) (Result, error) {
	if s.cfg.Builder == nil {
		return Result{}, errdefs.New(errdefs.ErrUnavailable, "builder_unavailable", "This server cannot build images (no builder).")
	}
	var src Source
	if err := json.Unmarshal(img.Source, &src); err != nil {
		return Result{}, fmt.Errorf("reading the build request: %w", err)
	}
	if err := os.MkdirAll(work, 0o755); err != nil {
		return Result{}, err
	}
	job := s.job(img, src, work)
	if err := s.checkRoomForImage(job.DiskMiB); err != nil {
		return Result{}, err
	}
	switch {
	case src.Context != nil:
		job.ContextDir = work
		if err := s.chunks.assemble(img.Owner, src.Context.Archive, contextBounds, filepath.Join(work, "context.tar.gz")); err != nil {
			return Result{}, fmt.Errorf("the build context: %w", err)
		}
	case src.Archive != nil:
		job.ArchivePath = filepath.Join(work, "image.tar")
		if err := s.chunks.assemble(img.Owner, *src.Archive, imageBounds, job.ArchivePath); err != nil {
			return Result{}, fmt.Errorf("the image archive: %w", err)
		}
	case len(src.Files) > 0:
		job.ContextDir = work
		c, err := packFiles(src.Files, filepath.Join(work, "context.tar.gz"))
		if err != nil {
			return Result{}, fmt.Errorf("the build's files: %w", err)
		}
		job.Context = c
	}
	ctx, cancel := context.WithTimeout(ctx, job.Timeout)
	defer cancel()
	return s.cfg.Builder.Build(ctx, job, log)
}

// checkRoomForImage refuses a build whose image (diskMiB at most, the
// build disk's size) would eat into the data dir's free-space reserve.
func (s *Service) checkRoomForImage(diskMiB int) error {
	if s.cfg.DiskFreeMiB == nil {
		return nil
	}
	free, err := s.cfg.DiskFreeMiB()
	if err != nil {
		return fmt.Errorf("reading the data dir's free space: %w", err)
	}
	if free-int64(diskMiB) >= s.cfg.DiskReserveMiB {
		return nil
	}
	return errdefs.New(errdefs.ErrConflict, "no_capacity",
		"The server has no disk space for this build's image (up to %d MiB) now; build again later or with a smaller build.diskMiB.", diskMiB)
}

func (s *Service) job(img *Image, src Source, work string) Job {
	lim := s.cfg.Limits
	lim.DiskMiB = min(DefaultBuildDiskMiB, lim.DiskMiB)
	b := src.Build
	if b.TimeoutSeconds > 0 {
		lim.Timeout = time.Duration(b.TimeoutSeconds) * time.Second
	}
	for _, f := range []struct {
		dst *int
		v   int
	}{
		{&lim.MaxImageMiB, b.MaxImageMiB}, {&lim.DiskMiB, b.DiskMiB}, {&lim.MemoryMiB, b.MemoryMiB}, {&lim.VCPU, b.VCPU}} {
		if f.v > 0 {
			*f.dst = f.v
		}
	}
	owner := img.Owner
	return Job{
		ImageID: img.ID, Owner: owner, Kind: img.Kind, Recipe: src.Recipe,
		Dockerfile: src.Dockerfile, Context: src.Context, BuildArgs: src.BuildArgs, Target: src.Target, NoStart: src.NoStart,
		Reference: src.Reference, Env: src.Env, Start: src.Start, Cache: src.Cache == nil || *src.Cache,
		Limits: lim, WorkDir: work,
		Resolve: func(ctx context.Context, ref string) (*Resolved, error) { return s.resolveBase(ctx, owner, ref) },
	}
}

// resolveBase finds a build's base image (FROM, recipe base) for owner.
func (s *Service) resolveBase(ctx context.Context, owner, ref string) (*Resolved, error) {
	if ref == "" {
		ref = DefaultName
	}
	ir, img, err := s.ForCreate(ctx, owner, ref)
	if err != nil {
		return nil, err
	}
	r := &Resolved{Digest: img.Digest, Env: img.Env, Workdir: img.Workdir, User: img.User}
	if ir != nil {
		r.Ref = *ir
	} // else the default image: an empty Ref, booted as a create without an image is
	return r, nil
}

// finish takes a build's result into the catalog: its disk into the blob
// store, its outcome onto the record, its tags moved to it.
func (s *Service) finish(ctx context.Context, img *Image, work string, res Result, start time.Time) error {
	fi, err := builtDisk(work, res.RootfsPath)
	if err != nil {
		return err
	}
	digest := res.Digest
	if digest == "" {
		if digest, err = fileDigest(res.RootfsPath); err != nil {
			return err
		}
	}
	var src Source
	_ = json.Unmarshal(img.Source, &src)
	takeResult(img, src, res, fi.Size())
	now := s.now()
	img.State, img.Digest, img.ReadyAt = StateReady, digest, &now
	img.BuildSeconds = now.Sub(start).Seconds()
	return s.storeBuilt(ctx, img, src, digest, res.RootfsPath)
}

// builtDisk checks that the builder's disk at path is a regular file in
// the build's directory work (the builder is not trusted to say where).
func builtDisk(work, path string) (os.FileInfo, error) {
	rel, err := filepath.Rel(work, filepath.Clean(path))
	if err != nil || rel == "." || strings.HasPrefix(rel, "..") || filepath.IsAbs(rel) {
		return nil, fmt.Errorf("the builder's disk %q is not in the build's directory", path)
	}
	fi, err := os.Lstat(path)
	if err != nil || !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("the builder's disk %q is not a regular file", path)
	}
	return fi, nil
}

// takeResult puts what the build found (environment, working directory,
// user, start, labels, sizes) onto img, under what the request src set
// itself; diskBytes is the size of the built disk.
func takeResult(img *Image, src Source, res Result, diskBytes int64) {
	img.Env = res.Env
	if len(src.Env) > 0 {
		img.Env = maps.Clone(res.Env)
		if img.Env == nil {
			img.Env = map[string]string{}
		}
		maps.Copy(img.Env, src.Env)
	}
	img.Workdir, img.User, img.Start = res.Workdir, res.User, res.Start
	if src.Start != nil {
		img.Start = src.Start
	} else if src.NoStart {
		img.Start = nil
	}
	if len(res.Labels) > 0 {
		labels := maps.Clone(res.Labels)
		maps.Copy(labels, img.Labels)
		img.Labels = labels
	}
	img.SizeBytes = res.SizeBytes
	if img.SizeBytes == 0 {
		img.SizeBytes = diskBytes
	}
	img.DiskMiB = max(res.MinDiskMiB, mibCeil(diskBytes))
}

// storeBuilt puts the disk at path into the blob store and the finished
// img, with the tags of src, into the store, unless the image was deleted
// while it built.
func (s *Service) storeBuilt(ctx context.Context, img *Image, src Source, digest, path string) error {
	s.blobMu.Lock()
	defer s.blobMu.Unlock()
	if cur, err := s.st.GetImage(ctx, img.ID); err != nil || cur.State == StateDeleted || cur.State == StateDeleting {
		return errors.New("the image was deleted while it built")
	}
	var err error
	if img.Rootfs, err = s.blobs.put(digest, path); err != nil {
		return err
	}
	var tags []string
	if img.Name != "" {
		if tags = src.Tags; len(tags) == 0 {
			tags = []string{"latest"}
		}
	}
	if err := s.st.FinishImage(ctx, img, tags); err != nil {
		_ = s.releaseBlobLocked(ctx, digest)
		return err
	}
	return nil
}

// packFiles writes a Dockerfile's inline files as a context archive, as
// if uploaded (without chunks).
func packFiles(files []File, dst string) (*Context, error) {
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
	if err != nil {
		return nil, err
	}
	defer out.Close()
	h := sha256.New()
	cw := &countWriter{w: io.MultiWriter(out, h)}
	zw := gzip.NewWriter(cw)
	c := &Context{}
	tw := tar.NewWriter(zw)
	for _, f := range files {
		name := path.Clean("/" + filepath.ToSlash(f.Path))[1:]
		if name == "" {
			return nil, fmt.Errorf("file %q: not a path", f.Path)
		}
		data := []byte(f.Content)
		if f.Encoding == "base64" {
			if data, err = base64.StdEncoding.DecodeString(f.Content); err != nil {
				return nil, fmt.Errorf("file %s: %w", f.Path, err)
			}
		}
		sum := sha256.Sum256(data)
		mode := int64(0o644)
		if f.Mode != "" {
			if m, err := strconv.ParseInt(f.Mode, 8, 32); err == nil {
				mode = m
			}
		}
		if err := tw.WriteHeader(&tar.Header{Name: name, Mode: mode, Size: int64(len(data)), Typeflag: tar.TypeReg,
			Format: tar.FormatPAX}); err != nil {
			return nil, err
		}
		if _, err := tw.Write(data); err != nil {
			return nil, err
		}
		c.Files = append(c.Files, ContextFile{Path: name, SHA256: hex.EncodeToString(sum[:]), Size: int64(len(data)), Mode: int(mode)})
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	if err := zw.Close(); err != nil {
		return nil, err
	}
	c.Archive = ContextArchive{SHA256: hex.EncodeToString(h.Sum(nil)), Size: cw.n, Chunks: []string{}}
	return c, out.Close()
}

type countWriter struct {
	w io.Writer
	n int64
}

func (c *countWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}
