package ociimport_test

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"io"
	"log"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/emberbox/emberbox/internal/catalog"
	"github.com/emberbox/emberbox/internal/errdefs"
	"github.com/emberbox/emberbox/internal/guest"
	"github.com/emberbox/emberbox/internal/ociimport"
	"github.com/emberbox/emberbox/internal/recipebuild"
	"github.com/emberbox/emberbox/internal/sandbox"
)

var _ recipebuild.Importer = (*ociimport.Importer)(nil)

// fakeManager hands out fakeGuests.
type fakeManager struct {
	mu      sync.Mutex
	created []sandbox.CreateSpec
	deleted []string
	fail    error
	guest   *flatGuest // nil: a fakeGuest
}

func (m *fakeManager) Create(ctx context.Context, owner string, spec sandbox.CreateSpec) (*sandbox.Sandbox, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.created = append(m.created, spec)
	return &sandbox.Sandbox{ID: "sbx_import", OwnerKeyID: owner}, nil
}

func (m *fakeManager) WaitFor(ctx context.Context, owner, id string, states ...sandbox.State) (*sandbox.Sandbox, error) {
	if m.fail != nil {
		return nil, m.fail
	}
	return &sandbox.Sandbox{ID: id, State: sandbox.StateRunning}, nil
}

func (m *fakeManager) Guest(ctx context.Context, owner, id string) (*sandbox.Sandbox, guest.Handle, error) {
	if m.guest != nil {
		return &sandbox.Sandbox{ID: id}, m.guest.handle(), nil
	}
	return &sandbox.Sandbox{ID: id}, (&fakeGuest{}).handle(), nil
}

func (m *fakeManager) Delete(ctx context.Context, owner, id string) (*sandbox.Sandbox, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.deleted = append(m.deleted, id)
	return &sandbox.Sandbox{ID: id}, nil
}

// fakeGuest runs no script and answers the image's tar.
type fakeGuest struct{ guest.Handle }

// handle returns g as a guest handle.
func (g *fakeGuest) handle() guest.Handle {
	return guest.Handle{ProcessRunner: g, FileSystem: g, Watcher: g, PortDialer: g}
}

func (g *fakeGuest) Exec(ctx context.Context, req guest.ExecRequest, onEvent func(guest.Event) error) (*guest.ExecResult, error) {
	if req.User != "root" {
		return nil, errors.New("not as root")
	}
	zero := 0
	if onEvent != nil {
		onEvent(guest.Event{Type: "stdout", Data: []byte("rootfs: made\n")})
	}
	return &guest.ExecResult{ExitCode: &zero}, nil
}

func (g *fakeGuest) WriteFile(ctx context.Context, path string, mode uint32, size int64, r io.Reader) (*guest.FileEntry, error) {
	n, err := io.Copy(io.Discard, r)
	if n != size {
		return nil, errors.New("short")
	}
	return &guest.FileEntry{Path: path, Size: n}, err
}

func (g *fakeGuest) ReadFile(ctx context.Context, path string) (*guest.FileEntry, io.ReadCloser, error) {
	b := fakeImageTar
	return &guest.FileEntry{Path: path, Size: int64(len(b))}, io.NopCloser(bytes.NewReader(b)), nil
}

var fakeImageTar []byte

type sink struct {
	mu    sync.Mutex
	lines []string
}

func (s *sink) Line(stream, text string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.lines = append(s.lines, stream+": "+text)
}

func TestImporter(t *testing.T) {
	fakeImageTar = tarOf(t, map[string][]byte{"rootfs.img": fakeRootfs})
	img, _ := testImage(t)
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer srv.Close()
	u, _ := url.Parse(srv.URL)
	ref := u.Host + "/team/app:v1"
	r, _ := name.ParseReference(ref)
	if err := remote.Write(r, img); err != nil {
		t.Fatal(err)
	}
	mgr := &fakeManager{}
	imp := &ociimport.Importer{Manager: mgr, Owner: "system:build", BaseDir: filepath.Join(t.TempDir(), "bases")}
	ctx := context.Background()

	// An image of its own: its disk in the job's directory, its CMD a
	// start command, the job's env on top of the image's.
	work := t.TempDir()
	job := catalog.Job{ImageID: "img-1", Kind: catalog.SourceImage, Reference: ref, WorkDir: work,
		Env: map[string]string{"APP": "job"}}
	var logs sink
	res, err := imp.Import(ctx, job, ref, &logs)
	if err != nil {
		t.Fatal(err)
	}
	if res.RootfsPath != filepath.Join(work, "rootfs.img") || !strings.HasPrefix(res.Digest, "sha256:") ||
		res.MinDiskMiB != 3 || res.Workdir != "/srv" || res.User != "app" {
		t.Errorf("result %+v", res)
	}
	if res.Env["APP"] != "job" || res.Env["PATH"] != "/usr/bin:/bin" {
		t.Errorf("env %v", res.Env)
	}
	if res.Start == nil || res.Start.Command != "/bin/app serve" {
		t.Errorf("start %+v", res.Start)
	}
	if entries, _ := os.ReadDir(work); len(entries) != 1 {
		t.Errorf("the work dir holds %d entries", len(entries))
	}
	if len(mgr.created) != 1 || mgr.created[0].DiskMiB < 5120 || len(mgr.deleted) != 1 {
		t.Errorf("sandboxes created %+v, deleted %v", mgr.created, mgr.deleted)
	}
	if !strings.Contains(strings.Join(logs.lines, "\n"), "stdout: rootfs: made") {
		t.Errorf("log: %v", logs.lines)
	}

	// no_start, and a start the job names.
	job.NoStart = true
	if res, err := imp.Import(ctx, job, ref, &logs); err != nil || res.Start != nil {
		t.Errorf("no_start: %+v %v", res.Start, err)
	}
	job.NoStart, job.Start = false, &catalog.StartSpec{Command: "mine", ReadyPort: 80}
	if res, err := imp.Import(ctx, job, ref, &logs); err != nil || res.Start.Command != "mine" {
		t.Errorf("job start: %+v %v", res.Start, err)
	}

	// A Dockerfile's base: kept in BaseDir, and reused.
	mgr.created = nil
	base := catalog.Job{ImageID: "img-2", Kind: catalog.SourceDockerfile, WorkDir: t.TempDir()}
	b1, err := imp.Import(ctx, base, ref, &logs)
	if err != nil {
		t.Fatal(err)
	}
	b2, err := imp.Import(ctx, base, ref, &logs)
	if err != nil {
		t.Fatal(err)
	}
	if b1.RootfsPath != b2.RootfsPath || !strings.HasPrefix(b1.RootfsPath, imp.BaseDir) || len(mgr.created) != 1 || b1.Start != nil {
		t.Errorf("bases %s and %s, %d sandboxes", b1.RootfsPath, b2.RootfsPath, len(mgr.created))
	}
	if st, err := os.Stat(b1.RootfsPath); err != nil || st.Mode().Perm() != 0o644 {
		t.Errorf("base disk: %v %v", st, err)
	}

	// A sandbox that does not start is deleted.
	mgr.fail, mgr.deleted = errors.New("no room"), nil
	if _, err := imp.Import(ctx, job, ref, &logs); err == nil || len(mgr.deleted) != 1 {
		t.Errorf("failed start: %v, deleted %v", err, mgr.deleted)
	}
	// A limit on the image's disk.
	mgr.fail = nil
	job.MaxImageMiB = 1
	if _, err := imp.Import(ctx, job, ref, &logs); err == nil || !strings.Contains(err.Error(), "over the limit") {
		t.Errorf("over MaxImageMiB: %v", err)
	}
}

// flatGuest's "disk" is the flattened tree it was given, so a disk shows
// which layers it was made of.
type flatGuest struct {
	fakeGuest
	mu   sync.Mutex
	flat []byte
}

// handle returns g as a guest handle.
func (g *flatGuest) handle() guest.Handle {
	return guest.Handle{ProcessRunner: g, FileSystem: g, Watcher: g, PortDialer: g}
}

func (g *flatGuest) WriteFile(ctx context.Context, path string, mode uint32, size int64, r io.Reader) (*guest.FileEntry, error) {
	zr, err := gzip.NewReader(r)
	if err != nil {
		return nil, err
	}
	b, err := io.ReadAll(zr)
	if err != nil {
		return nil, err
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	g.flat = b
	return &guest.FileEntry{Path: path, Size: size}, nil
}

func (g *flatGuest) ReadFile(ctx context.Context, path string) (*guest.FileEntry, io.ReadCloser, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	if err := tw.WriteHeader(&tar.Header{Name: "rootfs.img", Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(g.flat))}); err != nil {
		return nil, nil, err
	}
	tw.Write(g.flat)
	tw.Close()
	return &guest.FileEntry{Path: path, Size: int64(buf.Len())}, io.NopCloser(&buf), nil
}

// A poisoned image (a popular image's config, backdoored layer bytes),
// uploaded or pulled, is refused before a build VM starts and leaves no
// disk; the genuine image
// imported after it gets a disk of its own layers, not the poisoned ones.
func TestImporterPoisonedThenGenuine(t *testing.T) {
	genuine, _ := testImage(t)
	bad := poisoned(t, genuine, layer(t, file("etc/keep", "keep-top"), file("usr/bin/backdoor", "#!/bin/sh\n")))
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer srv.Close()
	u, _ := url.Parse(srv.URL)
	badSrc := sources(t, bad, u.Host, "library/app")
	goodSrc := sources(t, genuine, u.Host, "genuine/app")
	mgr := &fakeManager{guest: &flatGuest{}}
	imp := &ociimport.Importer{Manager: mgr, Owner: "system:build", BaseDir: filepath.Join(t.TempDir(), "bases")}
	ctx := context.Background()
	var logs sink

	// Uploaded, then as a Dockerfile's FROM (a base, shared by every later build).
	work := t.TempDir()
	archive := catalog.Job{ImageID: "img-bad", Kind: catalog.SourceArchive, WorkDir: work, ArchivePath: badSrc["docker save"].Archive}
	if _, err := imp.Import(ctx, archive, "", &logs); errdefs.Code(err) != ociimport.CodeLayerMismatch {
		t.Fatalf("poisoned upload: %v, want %s", err, ociimport.CodeLayerMismatch)
	}
	base := catalog.Job{ImageID: "img-bad-from", Kind: catalog.SourceDockerfile, WorkDir: t.TempDir()}
	if _, err := imp.Import(ctx, base, badSrc["registry"].Ref, &logs); errdefs.Code(err) != ociimport.CodeLayerMismatch {
		t.Fatalf("poisoned base: %v, want %s", err, ociimport.CodeLayerMismatch)
	}
	if entries, _ := os.ReadDir(imp.BaseDir); len(entries) != 0 {
		t.Errorf("a refused base left %d entries in the base directory", len(entries))
	}
	if _, err := os.Stat(filepath.Join(work, ociimport.RootfsName)); err == nil {
		t.Error("a refused upload left a disk")
	}
	if len(mgr.created) != 0 {
		t.Errorf("refused images started %d build sandboxes; they are refused before any", len(mgr.created))
	}

	mgr.created = nil
	logs.lines = nil
	good, err := imp.Import(ctx, base, goodSrc["registry"].Ref, &logs)
	if err != nil {
		t.Fatal(err)
	}
	if len(mgr.created) != 1 || strings.Contains(strings.Join(logs.lines, "\n"), "reusing") {
		t.Errorf("the genuine base was not imported afresh: %d sandboxes, log %v", len(mgr.created), logs.lines)
	}
	up, err := imp.Import(ctx, catalog.Job{ImageID: "img-good", Kind: catalog.SourceArchive, WorkDir: t.TempDir(),
		ArchivePath: goodSrc["docker save"].Archive}, "", &logs)
	if err != nil {
		t.Fatal(err)
	}
	for _, res := range []catalog.Result{good, up} {
		disk, err := os.ReadFile(res.RootfsPath)
		if err != nil {
			t.Fatal(err)
		}
		if names := tarNames(t, disk); slices.Contains(names, "usr/bin/backdoor") || len(names) != len(wantTree()) {
			t.Errorf("the genuine image's disk %s holds %v", res.RootfsPath, names)
		}
	}
	if good.Digest != up.Digest || !strings.HasPrefix(good.RootfsPath, imp.BaseDir) {
		t.Errorf("one image, pulled and uploaded: digests %s and %s, base at %s", good.Digest, up.Digest, good.RootfsPath)
	}
}
