package recipebuild_test

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/emberbox/emberbox/internal/catalog"
	"github.com/emberbox/emberbox/internal/errdefs"
	"github.com/emberbox/emberbox/internal/recipebuild"
	"github.com/emberbox/emberbox/internal/sandbox"
	"github.com/emberbox/emberbox/internal/store"
	"github.com/emberbox/emberbox/internal/vmm/vmmtest"
)

// logLines is a LogSink that keeps what it got.
type logLines struct {
	mu    sync.Mutex
	lines []string
}

func (l *logLines) Line(stream, text string) {
	l.mu.Lock()
	l.lines = append(l.lines, stream+": "+text)
	l.mu.Unlock()
}

func (l *logLines) has(s string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, x := range l.lines {
		if strings.Contains(x, s) {
			return true
		}
	}
	return false
}

func (l *logLines) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Join(l.lines, "\n")
}

type env struct {
	m   *sandbox.Manager
	st  *store.Store
	drv *vmmtest.Driver
	b   *recipebuild.Builder
}

// newEnv is a manager on the fake driver, whose guests run the real agent
// in this process: a build's RUN steps run here, on the host, as the test
// user, and its files land in the host's file system. So the tests' steps
// only write under their own temporary directories.
func newEnv(t *testing.T) *env {
	t.Helper()
	drv := vmmtest.NewDriver(t)
	dir := t.TempDir()
	st, err := store.Open(context.Background(), filepath.Join(dir, "test.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	m := sandbox.New(sandbox.Config{Store: st, Driver: drv, DataDir: dir, BootTimeout: 10 * time.Second})
	t.Cleanup(m.Close)
	b := recipebuild.New(recipebuild.Config{Manager: m, Snapshots: m.Snapshots, Cache: st, CacheEntries: 20, MemoryMiB: 512, DiskMiB: 1024})
	return &env{m: m, st: st, drv: drv, b: b}
}

func job(t *testing.T, kind string) catalog.Job {
	return catalog.Job{ImageID: "img-test", Owner: "key_a", Kind: kind, Cache: true, WorkDir: t.TempDir()}
}

func TestBuildRecipe(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	tmp := t.TempDir()
	recipe := func(content string) *catalog.Recipe {
		return &catalog.Recipe{
			Files: []catalog.File{{Path: filepath.Join(tmp, "app", "hello.txt"), Content: content, Mode: "0640"}},
			Commands: []string{"echo building \"$APP\"; cat " + filepath.Join(tmp, "app", "hello.txt") + " > " + filepath.Join(tmp, "out.txt"),
				"echo to-stderr >&2"},
			Env:     map[string]string{"APP": "demo"},
			Workdir: filepath.Join(tmp, "app"),
		}
	}
	j := job(t, catalog.SourceRecipe)
	j.Recipe = recipe("hello")
	j.Env = map[string]string{"EXTRA": "1"}
	log := &logLines{}
	res, err := e.b.Build(ctx, j, log)
	if err != nil {
		t.Fatalf("build: %v\n%s", err, log)
	}
	if b, err := os.ReadFile(filepath.Join(tmp, "out.txt")); err != nil || string(b) != "hello" {
		t.Errorf("the steps ran in order with the file: %q %v", b, err)
	}
	if fi, err := os.Stat(filepath.Join(tmp, "app", "hello.txt")); err != nil || fi.Mode().Perm() != 0o640 {
		t.Errorf("file mode: %v %v", fi, err)
	}
	for _, want := range []string{"stdout: building demo", "stderr: to-stderr", "step 1/4 FILES", "step 4/4 RUN echo to-stderr"} {
		if !log.has(want) {
			t.Errorf("log lacks %q:\n%s", want, log)
		}
	}
	if !strings.HasPrefix(res.Digest, "sha256:") || res.Env["APP"] != "demo" || res.Env["EXTRA"] != "1" || res.Workdir != filepath.Join(tmp, "app") {
		t.Errorf("result %+v", res)
	}
	if fi, err := os.Stat(res.RootfsPath); err != nil || fi.Mode().Perm() != 0o644 || filepath.Dir(res.RootfsPath) != j.WorkDir {
		t.Errorf("rootfs %s: %v %v", res.RootfsPath, fi, err)
	}
	tenantSnaps, _, err := e.m.Snapshots.ListSnapshots(ctx, sandbox.SnapshotListOptions{OwnerKeyID: "key_a"})
	if err != nil || len(tenantSnaps) != 0 {
		t.Errorf("the owner sees build snapshots: %v %v", tenantSnaps, err)
	}

	// The same recipe again: every step cached, no sandbox started.
	starts := e.drv.Starts()
	j2 := job(t, catalog.SourceRecipe)
	j2.Recipe = recipe("hello")
	log2 := &logLines{}
	res2, err := e.b.Build(ctx, j2, log2)
	if err != nil {
		t.Fatalf("second build: %v\n%s", err, log2)
	}
	if res2.Digest != res.Digest || e.drv.Starts() != starts || !log2.has("step 4/4 RUN echo to-stderr >&2: cached") {
		t.Errorf("second build: digest %s (first %s), %d starts, log:\n%s", res2.Digest, res.Digest, e.drv.Starts()-starts, log2)
	}

	// Other file content: its step and those after it run again.
	j3 := job(t, catalog.SourceRecipe)
	j3.Recipe = recipe("changed")
	log3 := &logLines{}
	res3, err := e.b.Build(ctx, j3, log3)
	if err != nil {
		t.Fatalf("third build: %v\n%s", err, log3)
	}
	if res3.Digest == res.Digest || log3.has("cached") {
		t.Errorf("changed file: digest %s, log:\n%s", res3.Digest, log3)
	}
	if b, _ := os.ReadFile(filepath.Join(tmp, "out.txt")); string(b) != "changed" {
		t.Errorf("out.txt %q after the changed build", b)
	}

	// Without the cache nothing is reused.
	j4 := job(t, catalog.SourceRecipe)
	j4.Recipe, j4.Cache = recipe("hello"), false
	log4 := &logLines{}
	if _, err := e.b.Build(ctx, j4, log4); err != nil || log4.has("cached") {
		t.Errorf("uncached build: %v\n%s", err, log4)
	}
}

func TestBuildFailingStep(t *testing.T) {
	e := newEnv(t)
	tmp := t.TempDir()
	j := job(t, catalog.SourceRecipe)
	j.Recipe = &catalog.Recipe{Commands: []string{"touch " + filepath.Join(tmp, "ran"), "echo this-is-why >&2; exit 3", "touch " + filepath.Join(tmp, "never")}}
	log := &logLines{}
	_, err := e.b.Build(context.Background(), j, log)
	if err == nil || !strings.Contains(err.Error(), "step 2/3 RUN echo this-is-why >&2; exit 3: exit code 3") || errdefs.IsInvalidArgument(err) {
		t.Fatalf("build: %v, want step 2/3 failing with exit code 3 (not invalid)", err)
	}
	if !log.has("stderr: this-is-why") {
		t.Errorf("the log lacks the step's output:\n%s", log)
	}
	if _, err := os.Stat(filepath.Join(tmp, "never")); err == nil {
		t.Error("a step after the failing one ran")
	}
	// Its sandboxes are gone.
	list, _, err := e.m.List(context.Background(), sandbox.ListOptions{OwnerKeyID: recipebuild.Owner})
	if err != nil {
		t.Fatal(err)
	}
	for _, sb := range list {
		if sb.State != sandbox.StateDeleted && sb.State != sandbox.StateDeleting {
			t.Errorf("build sandbox %s left %s", sb.ID, sb.State)
		}
	}
}

func contextDir(t *testing.T, files map[string]string) string {
	t.Helper()
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	tw := tar.NewWriter(zw)
	for name, body := range files {
		tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(body)), Typeflag: tar.TypeReg})
		tw.Write([]byte(body))
	}
	tw.Close()
	zw.Close()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "context.tar.gz"), buf.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	return dir
}

func TestBuildDockerfile(t *testing.T) {
	e := newEnv(t)
	tmp := t.TempDir()
	df := `ARG GREETING=hi
FROM default AS builder
ARG GREETING
RUN mkdir -p ` + tmp + `/stage && echo "$GREETING from the builder" > ` + tmp + `/stage/out.txt
FROM default
ARG GREETING
ENV APP_HOME=` + tmp + `/final
WORKDIR $APP_HOME
COPY --from=builder ` + tmp + `/stage/ ./from-builder/
COPY app.txt ./
RUN ["sh", "-c", "echo exec-form $GREETING > exec.txt"]
USER user
CMD ["python3", "-m", "http.server", "8080"]
`
	j := job(t, catalog.SourceDockerfile)
	j.Dockerfile = df
	j.ContextDir = contextDir(t, map[string]string{"app.txt": "from the context"})
	j.BuildArgs = map[string]string{"GREETING": "hello"}
	log := &logLines{}
	res, err := e.b.Build(context.Background(), j, log)
	if err != nil {
		t.Fatalf("build: %v\n%s", err, log)
	}
	for name, want := range map[string]string{
		"final/from-builder/out.txt": "hello from the builder\n",
		"final/app.txt":              "from the context",
		"final/exec.txt":             "exec-form hello\n",
	} {
		if b, err := os.ReadFile(filepath.Join(tmp, name)); err != nil || string(b) != want {
			t.Errorf("%s: %q %v, want %q", name, b, err, want)
		}
	}
	if res.User != "user" || res.Workdir != tmp+"/final" || res.Env["APP_HOME"] != tmp+"/final" || res.Start == nil || res.Start.Command != "python3 -m http.server 8080" {
		t.Errorf("result %+v start %+v", res, res.Start)
	}

	// A refused instruction fails before any sandbox starts.
	starts := e.drv.Starts()
	j2 := job(t, catalog.SourceDockerfile)
	j2.Dockerfile = "FROM default\nRUN true\nONBUILD RUN x\n"
	if _, err := e.b.Build(context.Background(), j2, &logLines{}); !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "line 3: ONBUILD") {
		t.Errorf("ONBUILD: %v", err)
	}
	// So does an OCI base without the importer.
	j2.Dockerfile = "FROM python:3.12-slim\nRUN true\n"
	j2.Resolve = func(ctx context.Context, ref string) (*catalog.Resolved, error) {
		return nil, errdefs.New(errdefs.ErrNotFound, "image_not_found", "no image %q", ref)
	}
	if _, err := e.b.Build(context.Background(), j2, &logLines{}); !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "FROM python:3.12-slim") {
		t.Errorf("OCI base: %v", err)
	}
	if e.drv.Starts() != starts {
		t.Errorf("refused builds started %d sandboxes", e.drv.Starts()-starts)
	}
}

// stubImporter "imports" any reference as a file of its own.
type stubImporter struct {
	mu   sync.Mutex
	refs []string
	dir  string
}

func (s *stubImporter) Import(ctx context.Context, job catalog.Job, ref string, log catalog.LogSink) (catalog.Result, error) {
	s.mu.Lock()
	s.refs = append(s.refs, ref)
	s.mu.Unlock()
	p := filepath.Join(s.dir, "imported.img")
	if err := os.WriteFile(p, []byte("disk of "+ref), 0o644); err != nil {
		return catalog.Result{}, err
	}
	return catalog.Result{RootfsPath: p, Digest: "sha256:imported", MinDiskMiB: 1024, Env: map[string]string{"FROM_OCI": "1"},
		Start: &catalog.StartSpec{Command: "python3"}}, nil
}

// OCI images go to the importer: as a build of their own, and as a
// Dockerfile's base, whose sandbox boots the imported disk.
func TestBuildImporter(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	j := job(t, catalog.SourceImage)
	j.Reference = "python:3.12-slim"
	if _, err := e.b.Build(ctx, j, &logLines{}); !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "python:3.12-slim") {
		t.Fatalf("import without an importer: %v", err)
	}

	imp := &stubImporter{dir: t.TempDir()}
	b := recipebuild.New(recipebuild.Config{Manager: e.m, Snapshots: e.m.Snapshots, Cache: e.st, Import: imp, MemoryMiB: 512, DiskMiB: 1024})
	res, err := b.Build(ctx, j, &logLines{})
	if err != nil || res.Digest != "sha256:imported" || res.Start == nil {
		t.Fatalf("import: %+v %v", res, err)
	}

	tmp := t.TempDir()
	jd := job(t, catalog.SourceDockerfile)
	jd.Dockerfile = "FROM python:3.12-slim\nRUN echo $FROM_OCI > " + tmp + "/env\n"
	jd.Resolve = func(ctx context.Context, ref string) (*catalog.Resolved, error) {
		return nil, errdefs.New(errdefs.ErrNotFound, "image_not_found", "no image %q", ref)
	}
	log := &logLines{}
	res, err = b.Build(ctx, jd, log)
	if err != nil {
		t.Fatalf("FROM an OCI image: %v\n%s", err, log)
	}
	if got, _ := os.ReadFile(filepath.Join(tmp, "env")); string(got) != "1\n" || res.Env["FROM_OCI"] != "1" {
		t.Errorf("the base's environment: step saw %q, result %v", got, res.Env)
	}
	if len(imp.refs) != 2 || imp.refs[1] != "python:3.12-slim" {
		t.Errorf("importer calls %q", imp.refs)
	}
	var id string
	for _, l := range strings.Split(log.String(), "\n") {
		if rest, ok := strings.CutPrefix(l, "build: build sandbox "); ok {
			id, _, _ = strings.Cut(rest, " ")
		}
	}
	if m := e.drv.Machine(id); m == nil || m.Spec().Rootfs != filepath.Join(imp.dir, "imported.img") {
		t.Errorf("the build sandbox %q did not boot the imported disk", id)
	}
}

// A build on an image of ours records it on its cached steps, which
// ForgetImage drops before the catalog deletes that image.
func TestForgetImage(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	base := filepath.Join(t.TempDir(), "base.img")
	os.WriteFile(base, []byte("base disk"), 0o644)
	j := job(t, catalog.SourceRecipe)
	j.Recipe = &catalog.Recipe{Base: "app:latest", Commands: []string{"true", "true # again"}}
	j.Resolve = func(ctx context.Context, ref string) (*catalog.Resolved, error) {
		if ref != "app:latest" {
			return nil, errdefs.New(errdefs.ErrNotFound, "image_not_found", "no image %q", ref)
		}
		return &catalog.Resolved{Ref: sandbox.ImageRef{ID: "img-base", Rootfs: base, MinDiskMiB: 512}, Digest: "sha256:base"}, nil
	}
	if _, err := e.b.Build(ctx, j, &logLines{}); err != nil {
		t.Fatal(err)
	}
	all, err := e.st.BuildCacheSnapshots(ctx)
	if err != nil || len(all) != 2 {
		t.Fatalf("cache %v %v, want the two steps", all, err)
	}
	for _, id := range all {
		if sn, err := e.m.Snapshots.GetSnapshot(ctx, recipebuild.Owner, id); err != nil || sn.ImageID != "img-base" {
			t.Fatalf("cached step %s: %+v %v", id, sn, err)
		}
	}
	if err := e.b.ForgetImage(ctx, "img-other"); err != nil {
		t.Fatal(err)
	}
	if left, _ := e.st.BuildCacheSnapshots(ctx); len(left) != 2 {
		t.Errorf("forgetting another image dropped steps: %v", left)
	}
	if err := e.b.ForgetImage(ctx, "img-base"); err != nil {
		t.Fatal(err)
	}
	if left, _ := e.st.BuildCacheSnapshots(ctx); len(left) != 0 {
		t.Errorf("cache after forgetting: %v", left)
	}
	for _, id := range all {
		if _, err := e.m.Snapshots.GetSnapshot(ctx, recipebuild.Owner, id); !errdefs.IsNotFound(err) {
			t.Errorf("snapshot %s: %v, want deleted", id, err)
		}
	}
}

// Recover removes a build's leftovers after a restart and keeps the cache.
func TestRecover(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	j := job(t, catalog.SourceRecipe)
	j.Recipe = &catalog.Recipe{Commands: []string{"true"}}
	if _, err := e.b.Build(ctx, j, &logLines{}); err != nil {
		t.Fatal(err)
	}
	cached, _ := e.st.BuildCacheSnapshots(ctx)
	// What a crash mid-build leaves: a running build sandbox and a
	// snapshot of it that no cache entry names.
	sb, err := e.m.Create(ctx, recipebuild.Owner, sandbox.CreateSpec{VCPU: 1, MemoryMiB: 512, DiskMiB: 1024, TimeoutSeconds: 600, OnLeaseEnd: sandbox.LeaseEndDelete})
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	if _, err := e.m.WaitFor(wctx, recipebuild.Owner, sb.ID, sandbox.StateRunning); err != nil {
		t.Fatal(err)
	}
	stray, err := e.m.Snapshots.Snapshot(ctx, recipebuild.Owner, sb.ID, sandbox.SnapshotSpec{Mode: sandbox.SnapshotModeDisk})
	if err != nil {
		t.Fatal(err)
	}
	if err := e.b.Recover(ctx); err != nil {
		t.Fatal(err)
	}
	if got, err := e.m.Get(ctx, recipebuild.Owner, sb.ID); err == nil && got.State != sandbox.StateDeleted && got.State != sandbox.StateDeleting {
		t.Errorf("the stray build sandbox is %s", got.State)
	}
	if _, err := e.m.Snapshots.GetSnapshot(ctx, recipebuild.Owner, stray.ID); !errdefs.IsNotFound(err) {
		t.Errorf("the stray snapshot: %v, want deleted", err)
	}
	for _, id := range cached {
		if _, err := e.m.Snapshots.GetSnapshot(ctx, recipebuild.Owner, id); err != nil {
			t.Errorf("cached step %s: %v", id, err)
		}
	}
}
