package ociimport

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"os"
	"path"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/emberbox/emberbox/internal/catalog"
	"github.com/emberbox/emberbox/internal/errdefs"
	"github.com/emberbox/emberbox/internal/guest"
	"github.com/emberbox/emberbox/internal/sandbox"
)

// Manager is what an import needs of the sandbox manager;
// *sandbox.Manager implements it.
type Manager interface {
	Create(ctx context.Context, owner string, spec sandbox.CreateSpec) (*sandbox.Sandbox, error)
	WaitFor(ctx context.Context, owner, id string, states ...sandbox.State) (*sandbox.Sandbox, error)
	Guest(ctx context.Context, owner, id string) (*sandbox.Sandbox, guest.Handle, error)
	Delete(ctx context.Context, owner, id string) (*sandbox.Sandbox, error)
}

var _ Manager = (*sandbox.Manager)(nil)

// Importer imports images in build sandboxes of the default image; it
// implements imagebuild.Importer.
type Importer struct {
	Manager Manager
	// Owner owns the build sandboxes (imagebuild.Owner).
	Owner string
	// BaseDir keeps the root disks of images imported as a Dockerfile's
	// FROM, which must outlive the build (its cached steps are overlays of
	// them), one directory per RootfsKey, reused by later builds.
	BaseDir string
	Limits  Limits
	// Shape of a build sandbox; DiskMiB grows with the image.
	VCPU, MemoryMiB, DiskMiB int
	// Transport, if set, carries registry requests (tests).
	Transport http.RoundTripper
}

// Import makes a root disk of ref (a registry reference), or of
// job.ArchivePath when ref is "". A job of kind image or archive gets its
// disk in job.WorkDir and the job's env and start command on top of the
// image's; a base of another build (a Dockerfile's FROM) gets it in
// BaseDir.
func (imp *Importer) Import(ctx context.Context, job catalog.Job, ref string, log catalog.LogSink) (catalog.Result, error) {
	src := Source{Ref: ref, Archive: job.ArchivePath, Limits: imp.Limits, Transport: imp.Transport}
	if ref != "" {
		src.Archive = ""
	}
	img, err := Open(ctx, src)
	if err != nil {
		return catalog.Result{}, err
	}
	defer img.Close()
	log.Line("build", fmt.Sprintf("importing %s: %d layers, %d MiB compressed", img.Digest(), img.Layers(), img.CompressedSize()>>20))

	base := job.Kind != catalog.SourceImage && job.Kind != catalog.SourceArchive
	dir := job.WorkDir
	if base {
		if imp.BaseDir == "" {
			return catalog.Result{}, errdefs.New(errdefs.ErrInvalidArgument, CodeUnsupported,
				"%s: this server imports no base images", ref)
		}
		dir = filepath.Join(imp.BaseDir, strings.TrimPrefix(img.RootfsKey(), "sha256:"))
		if st, err := os.Stat(filepath.Join(dir, RootfsName)); err == nil && st.Mode().IsRegular() {
			// Only a verified import is ever stored under its key.
			log.Line("build", "imported before: reusing its disk")
			return imp.result(job, img.RootfsKey(), img, filepath.Join(dir, RootfsName), base)
		}
	}
	// The work directory is on the same file system as the disk's place
	// (a rename puts it there), and VMs must be able to read the disk.
	parent := job.WorkDir
	if base {
		parent = imp.BaseDir
	}
	work, err := makeWorkDir(parent)
	if work != "" {
		defer os.RemoveAll(work)
	}
	if err != nil {
		return catalog.Result{}, err
	}

	// Flattened (every layer checked) before a build VM is started: a
	// refused image costs no VM.
	lw := &lineWriter{sink: log}
	defer lw.flush()
	staged, err := Stage(ctx, img, work, lw)
	if err != nil {
		return catalog.Result{}, fmt.Errorf("import of %s: %w", img.Digest(), err)
	}
	defer staged.Remove()
	g, done, err := imp.sandbox(ctx, job, img, log)
	if err != nil {
		return catalog.Result{}, err
	}
	defer done()
	rootfs, _, err := BuildStaged(ctx, GuestVM{G: g}, staged, lw)
	lw.flush()
	if err != nil {
		return catalog.Result{}, fmt.Errorf("import of %s: %w", img.Digest(), err)
	}
	if err := checkDiskSize(rootfs, job.MaxImageMiB); err != nil {
		return catalog.Result{}, err
	}
	// The disk is named by the layers as hashed while flattening, never
	// by a digest the image claims.
	key, err := img.VerifiedRootfsKey()
	if err != nil {
		return catalog.Result{}, fmt.Errorf("import of %s: %w", img.Digest(), err)
	}
	final, err := imp.place(key, work, rootfs, dir, base)
	if err != nil {
		return catalog.Result{}, err
	}
	return imp.result(job, key, img, final, base)
}

// makeWorkDir makes a private work directory under parent that VMs can
// read. A directory it returns with an error is the caller's to remove.
func makeWorkDir(parent string) (string, error) {
	if err := os.MkdirAll(parent, 0o755); err != nil {
		return "", fmt.Errorf("import: %w", err)
	}
	work, err := os.MkdirTemp(parent, ".import-")
	if err != nil {
		return "", fmt.Errorf("import: %w", err)
	}
	if err := os.Chmod(work, 0o755); err != nil {
		return work, err
	}
	return work, nil
}

// checkDiskSize refuses an imported disk over maxMiB (0: no limit).
func checkDiskSize(rootfs string, maxMiB int) error {
	if st, err := os.Stat(rootfs); err == nil && maxMiB > 0 && st.Size() > int64(maxMiB)<<20 {
		return errdefs.New(errdefs.ErrInvalidArgument, CodeTooLarge,
			"the imported disk is %d MiB, over the limit of %d MiB", st.Size()>>20, maxMiB)
	}
	return nil
}

// place puts the imported disk where it is kept and returns its path: a
// base image's work directory becomes its directory under BaseDir, named
// by key; another job's disk is renamed into dir.
func (imp *Importer) place(key, work, rootfs, dir string, base bool) (string, error) {
	if base {
		dir = filepath.Join(imp.BaseDir, strings.TrimPrefix(key, "sha256:"))
	}
	final := filepath.Join(dir, RootfsName)
	if base {
		// Into place whole: a concurrent import of the same image
		// wins or loses as one rename of the directory.
		if err := os.Rename(work, dir); err != nil && !os.IsExist(err) && !isNotEmpty(err) {
			return "", fmt.Errorf("import: %w", err)
		}
	} else if err := os.Rename(rootfs, final); err != nil {
		return "", fmt.Errorf("import: %w", err)
	}
	return final, nil
}

func isNotEmpty(err error) bool {
	return err != nil && strings.Contains(err.Error(), "directory not empty")
}

// sandbox starts a build sandbox with room for img and returns its guest
// and a func that deletes it.
func (imp *Importer) sandbox(ctx context.Context, job catalog.Job, img *Image, log catalog.LogSink) (guest.Handle, func(), error) {
	compressed := img.CompressedSize()
	if compressed == 0 && job.ArchivePath != "" {
		if st, err := os.Stat(job.ArchivePath); err == nil {
			compressed = st.Size()
		}
	}
	// The default image's disk, then the gzipped tar, the tree (layers
	// inflate about threefold) and the ext4 image of it.
	disk := max(orDefault(imp.DiskMiB, sandbox.DefaultDiskMiB), 4096+int(8*compressed>>20)+1024, job.DiskMiB)
	disk = min(disk, 65536)
	spec := sandbox.CreateSpec{
		Name:       "image-import",
		Labels:     map[string]string{"emberbox.build/image": job.ImageID, sandbox.LabelQuotaKey: job.Owner},
		VCPU:       orDefault(job.VCPU, orDefault(imp.VCPU, 2)),
		MemoryMiB:  orDefault(job.MemoryMiB, orDefault(imp.MemoryMiB, 2048)),
		DiskMiB:    disk,
		OnLeaseEnd: sandbox.LeaseEndDelete,
		AutoWake:   new(bool),
	}
	if dl, ok := ctx.Deadline(); ok {
		spec.TimeoutSeconds = int(time.Until(dl).Seconds()) + 300
	}
	sb, err := imp.Manager.Create(ctx, imp.Owner, spec)
	if err != nil {
		return guest.Handle{}, nil, fmt.Errorf("starting an import sandbox: %w", err)
	}
	done := func() {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute)
		defer cancel()
		_, _ = imp.Manager.Delete(dctx, imp.Owner, sb.ID)
	}
	got, err := imp.Manager.WaitFor(ctx, imp.Owner, sb.ID, sandbox.StateRunning, sandbox.StateStopped, sandbox.StateDeleted)
	if err == nil && got.State != sandbox.StateRunning {
		err = fmt.Errorf("it is %s (%s)", got.State, got.StopReason)
	}
	var g guest.Handle
	if err == nil {
		_, g, err = imp.Manager.Guest(ctx, imp.Owner, sb.ID)
	}
	if err != nil {
		done()
		return guest.Handle{}, nil, fmt.Errorf("starting an import sandbox: %w", err)
	}
	log.Line("build", fmt.Sprintf("import sandbox %s running (%d MiB disk)", sb.ID, disk))
	return g, done, nil
}

// result describes the imported disk at rootfs, named key. The image's CMD and
// ENTRYPOINT become its start command, as a Dockerfile's do, unless the
// job sets one or says no_start, or the command is only a shell (the
// default of base images such as debian).
func (imp *Importer) result(job catalog.Job, key string, img *Image, rootfs string, base bool) (catalog.Result, error) {
	st, err := os.Stat(rootfs)
	if err != nil {
		return catalog.Result{}, err
	}
	var alloc int64
	if sys, ok := st.Sys().(*syscall.Stat_t); ok {
		alloc = sys.Blocks * 512
	}
	cfg := img.Config()
	res := catalog.Result{
		RootfsPath: rootfs, Digest: key, SizeBytes: alloc,
		MinDiskMiB: int((st.Size() + 1<<20 - 1) >> 20),
		Env:        cfg.EnvMap(), Workdir: cfg.WorkingDir, User: cfg.User, Labels: cfg.Labels,
	}
	if base {
		return res, nil
	}
	for k, v := range job.Env {
		res.Env[k] = v
	}
	switch {
	case job.Start != nil:
		s := *job.Start
		res.Start = &s
	case !job.NoStart && !onlyShell(cfg):
		if cmd := cfg.Command(); cmd != "" {
			res.Start = &catalog.StartSpec{Command: cmd}
		}
	}
	return res, nil
}

func onlyShell(c Config) bool {
	words := append(append([]string(nil), c.Entrypoint...), c.Cmd...)
	if len(words) != 1 {
		return false
	}
	switch path.Base(words[0]) {
	case "sh", "bash", "ash", "dash", "zsh":
		return true
	}
	return false
}

func orDefault(v, def int) int {
	if v > 0 {
		return v
	}
	return def
}

// lineWriter turns the import's output into log lines.
type lineWriter struct {
	sink catalog.LogSink
	buf  []byte
}

func (w *lineWriter) Write(p []byte) (int, error) {
	w.buf = append(w.buf, p...)
	for {
		i := bytes.IndexByte(w.buf, '\n')
		if i < 0 {
			break
		}
		w.line(w.buf[:i])
		w.buf = w.buf[i+1:]
	}
	if len(w.buf) > 16<<10 {
		w.line(w.buf)
		w.buf = nil
	}
	return len(p), nil
}

func (w *lineWriter) line(b []byte) {
	stream := "stdout"
	if bytes.HasPrefix(b, []byte("import: ")) {
		stream = "build"
	}
	w.sink.Line(stream, string(b))
}

func (w *lineWriter) flush() {
	if len(w.buf) > 0 {
		w.line(w.buf)
		w.buf = nil
	}
}
