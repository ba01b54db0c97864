package catalog_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/emberbox/emberbox/internal/catalog"
	"github.com/emberbox/emberbox/internal/errdefs"
	"github.com/emberbox/emberbox/internal/sandbox"
	"github.com/emberbox/emberbox/internal/store"
)

// fakeBuilder "builds" a small file whose bytes are the recipe's
// commands; a command "fail" fails the build, "block" waits for release.
type fakeBuilder struct {
	mu      sync.Mutex
	jobs    []catalog.Job
	release chan struct{}
	forget  func(id string) error // ForgetImage
}

func (b *fakeBuilder) ForgetImage(ctx context.Context, id string) error {
	if b.forget == nil {
		return nil
	}
	return b.forget(id)
}

func (b *fakeBuilder) Build(ctx context.Context, job catalog.Job, log catalog.LogSink) (catalog.Result, error) {
	b.mu.Lock()
	b.jobs = append(b.jobs, job)
	b.mu.Unlock()
	content := "rootfs"
	if job.Recipe != nil {
		content = strings.Join(job.Recipe.Commands, ";")
	}
	log.Line("build", "step 1/1 RUN "+content)
	log.Line("stdout", "line one\nline two")
	switch {
	case strings.Contains(content, "fail"):
		log.Line("stderr", "no such package")
		return catalog.Result{}, errors.New("step 1/1 RUN fail: exit 1")
	case strings.Contains(content, "block"):
		select {
		case <-b.release:
		case <-ctx.Done():
			return catalog.Result{}, ctx.Err()
		}
	}
	path := filepath.Join(job.WorkDir, "out", "rootfs.img")
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return catalog.Result{}, err
	}
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		return catalog.Result{}, err
	}
	sum := sha256.Sum256([]byte(content))
	return catalog.Result{RootfsPath: path, Digest: "sha256:" + hex.EncodeToString(sum[:]), MinDiskMiB: 3072,
		Env: map[string]string{"FROM_BUILD": "1"}, Workdir: "/srv", User: "user"}, nil
}

// events records sandbox events.
type events struct {
	mu  sync.Mutex
	got []string // sandbox:type
}

func (r *events) AppendEvent(ctx context.Context, sandboxID, typ, message string, data map[string]any) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.got = append(r.got, sandboxID+":"+typ)
	return nil
}

type env struct {
	ev   *events
	t    *testing.T
	st   *store.Store
	svc  *catalog.Service
	dir  string
	b    *fakeBuilder
	stop context.CancelFunc
}

func newEnv(t *testing.T, dir string) *env {
	t.Helper()
	return newEnvWith(t, dir, func(*catalog.Config) {})
}

// newEnvWith is newEnv with its catalog's config changed by set.
func newEnvWith(t *testing.T, dir string, set func(*catalog.Config)) *env {
	t.Helper()
	if dir == "" {
		dir = t.TempDir()
	}
	st, err := store.Open(context.Background(), filepath.Join(dir, "db"))
	if err != nil {
		t.Fatal(err)
	}
	def := filepath.Join(dir, "default.img")
	if err := os.WriteFile(def, []byte("default"), 0o644); err != nil {
		t.Fatal(err)
	}
	b := &fakeBuilder{release: make(chan struct{})}
	ev := &events{}
	cfg := catalog.Config{Store: catalog.Store{ImageRecords: st, ImageTags: st, ImageHolders: st, BuildLogs: st}, Builder: b, DataDir: dir, DefaultRootfs: def, DefaultDigest: strings.Repeat("d", 64),
		Events: ev}
	set(&cfg)
	svc, err := catalog.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := svc.Recover(context.Background()); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { svc.Run(ctx); close(done) }()
	e := &env{t: t, st: st, svc: svc, dir: dir, b: b, ev: ev}
	e.stop = func() { cancel(); <-done; st.Close() }
	t.Cleanup(func() { e.stop() })
	return e
}

func recipe(cmds ...string) catalog.CreateRequest {
	return catalog.CreateRequest{Source: catalog.Source{Recipe: &catalog.Recipe{Commands: cmds}}}
}

// wait polls until the image leaves queued and building.
func (e *env) wait(owner, id string) *catalog.Image {
	e.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		img, err := e.svc.Get(context.Background(), owner, id)
		if err != nil {
			e.t.Fatal(err)
		}
		if img.State != catalog.StateQueued && img.State != catalog.StateBuilding {
			return img
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("image %s still %s", id, img.State)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestBuildToReadyAndTags(t *testing.T) {
	e := newEnv(t, "")
	ctx := context.Background()
	req := recipe("pip install x")
	req.Name = "app"
	img, err := e.svc.Create(ctx, "key_a", req)
	if err != nil {
		t.Fatal(err)
	}
	if img.State != catalog.StateQueued || img.Version != 1 {
		t.Fatalf("created %s v%d, want queued v1", img.State, img.Version)
	}
	img = e.wait("key_a", img.ID)
	if img.State != catalog.StateReady || img.Digest == "" || img.DiskMiB != 3072 || img.Env["FROM_BUILD"] != "1" {
		t.Fatalf("built %+v", img)
	}
	if fi, err := os.Stat(img.Rootfs); err != nil || fi.Mode().Perm() != 0o644 {
		t.Fatalf("blob %s: %v %v", img.Rootfs, fi, err)
	}
	if !strings.HasPrefix(img.Rootfs, filepath.Join(e.dir, "images", "blobs")) {
		t.Errorf("blob at %s, not in the blob store", img.Rootfs)
	}
	if len(img.Tags) != 1 || img.Tags[0] != "latest" {
		t.Errorf("tags %v, want [latest]", img.Tags)
	}
	page, err := e.svc.Logs(ctx, "key_a", img.ID, 0, 100)
	if err != nil {
		t.Fatal(err)
	}
	var text []string
	for _, l := range page.Lines {
		text = append(text, l.Text)
	}
	if !page.Done || !strings.Contains(strings.Join(text, "|"), "line one|line two") {
		t.Errorf("log %q done=%v", text, page.Done)
	}

	// A second version takes latest; the first keeps its version.
	img2, err := e.svc.Create(ctx, "key_a", req)
	if err != nil {
		t.Fatal(err)
	}
	img2 = e.wait("key_a", img2.ID)
	if img2.Version != 2 {
		t.Errorf("second version %d", img2.Version)
	}
	for ref, want := range map[string]string{"app": img2.ID, "app:latest": img2.ID, "app@1": img.ID, "app@2": img2.ID, img.ID: img.ID} {
		got, err := e.svc.Resolve(ctx, "key_a", ref)
		if err != nil || got.ID != want {
			t.Errorf("resolve %s: %v %v, want %s", ref, got, err, want)
		}
	}
	if _, err := e.svc.Tag(ctx, "key_a", img.ID, "stable"); err != nil {
		t.Fatal(err)
	}
	if got, err := e.svc.Resolve(ctx, "key_a", "app:stable"); err != nil || got.ID != img.ID {
		t.Errorf("app:stable: %v %v", got, err)
	}
	if _, err := e.svc.Tag(ctx, "key_a", img2.ID, "stable"); err != nil { // moves
		t.Fatal(err)
	}
	if got, _ := e.svc.Resolve(ctx, "key_a", "app:stable"); got.ID != img2.ID {
		t.Errorf("stable did not move to v2")
	}
	if _, err := e.svc.Untag(ctx, "key_a", img2.ID, "stable"); err != nil {
		t.Fatal(err)
	}
	if _, err := e.svc.Resolve(ctx, "key_a", "app:stable"); errdefs.Code(err) != "image_not_found" {
		t.Errorf("untagged resolves: %v", err)
	}
	// Same digest: one blob, kept until the last image of it goes.
	if img.Digest != img2.Digest || img.Rootfs != img2.Rootfs {
		t.Fatalf("same inputs, different blobs: %s %s", img.Rootfs, img2.Rootfs)
	}
	// The manager's templates of a disk go with the disk, not before.
	var removed []string
	e.svc.SetTemplates(templateRemover(func(rootfs string) error {
		if _, err := os.Stat(rootfs); err != nil {
			t.Errorf("templates removed after their disk: %v", err)
		}
		removed = append(removed, rootfs)
		return nil
	}))
	if _, err := e.svc.Delete(ctx, "key_a", img.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(img2.Rootfs); err != nil {
		t.Errorf("the shared blob went with the first image: %v", err)
	}
	if len(removed) != 0 {
		t.Errorf("templates of a disk still used were removed: %v", removed)
	}
	if _, err := e.svc.Delete(ctx, "key_a", img2.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(img2.Rootfs); !os.IsNotExist(err) {
		t.Errorf("the blob stayed after its last image: %v", err)
	}
	if len(removed) != 1 || removed[0] != img2.Rootfs {
		t.Errorf("templates removed for %v, want once for %s", removed, img2.Rootfs)
	}
	if _, err := e.svc.Resolve(ctx, "key_a", "app"); errdefs.Code(err) != "image_not_found" {
		t.Errorf("deleted image resolves: %v", err)
	}
}

func TestBuildFailure(t *testing.T) {
	e := newEnv(t, "")
	ctx := context.Background()
	img, err := e.svc.Create(ctx, "key_a", recipe("fail"))
	if err != nil {
		t.Fatal(err)
	}
	img = e.wait("key_a", img.ID)
	if img.State != catalog.StateFailed || !strings.Contains(img.Error, "step 1/1 RUN fail") {
		t.Fatalf("failed build: %s %q", img.State, img.Error)
	}
	page, _ := e.svc.Logs(ctx, "key_a", img.ID, 0, 100)
	joined := ""
	for _, l := range page.Lines {
		joined += l.Stream + ":" + l.Text + "\n"
	}
	if !strings.Contains(joined, "stderr:no such package") || !strings.Contains(joined, "build failed: step 1/1") {
		t.Errorf("log of a failed build:\n%s", joined)
	}
	if _, _, err := e.svc.ForCreate(ctx, "key_a", img.ID); errdefs.Code(err) != "image_not_ready" {
		t.Errorf("create from a failed image: %v, want image_not_ready", err)
	}
}

func TestNoBuilder(t *testing.T) {
	dir := t.TempDir()
	st, err := store.Open(context.Background(), filepath.Join(dir, "db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	svc, err := catalog.New(catalog.Config{Store: catalog.Store{ImageRecords: st, ImageTags: st, ImageHolders: st, BuildLogs: st}, DataDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go svc.Run(ctx)
	img, err := svc.Create(ctx, "k", recipe("x"))
	if err != nil {
		t.Fatal(err)
	}
	e := &env{t: t, svc: svc}
	if img = e.wait("k", img.ID); img.State != catalog.StateFailed || !strings.Contains(img.Error, "no builder") {
		t.Errorf("without a builder: %s %q", img.State, img.Error)
	}
}

// A build cut by a restart fails; one still queued runs after it.
func TestRestartRecovery(t *testing.T) {
	dir := t.TempDir()
	e := newEnv(t, dir)
	ctx := context.Background()
	cut, err := e.svc.Create(ctx, "key_a", recipe("block"))
	if err != nil {
		t.Fatal(err)
	}
	queued, err := e.svc.Create(ctx, "key_a", recipe("later"))
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		img, _ := e.svc.Get(ctx, "key_a", cut.ID)
		if img.State == catalog.StateBuilding {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("never building")
		}
		time.Sleep(10 * time.Millisecond)
	}
	// The "crash": the store keeps building and queued as they are.
	e.stop()
	e.stop = func() {}
	if img, _ := storeImage(t, dir, cut.ID); img.State != catalog.StateBuilding {
		// The cancelled build recorded a failure on the way out; a real
		// kill -9 leaves it building: set it back as the crash would.
		setState(t, dir, cut.ID, catalog.StateBuilding)
	}
	setState(t, dir, queued.ID, catalog.StateQueued)
	e2 := newEnv(t, dir)
	if img := e2.wait("key_a", cut.ID); img.State != catalog.StateFailed || img.Error != "server restarted" {
		t.Errorf("cut build: %s %q", img.State, img.Error)
	}
	if img := e2.wait("key_a", queued.ID); img.State != catalog.StateReady {
		t.Errorf("queued build after a restart: %s %q", img.State, img.Error)
	}
}

func storeImage(t *testing.T, dir, id string) (*catalog.Image, error) {
	st, err := store.Open(context.Background(), filepath.Join(dir, "db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	return st.GetImage(context.Background(), id)
}

func setState(t *testing.T, dir, id, state string) {
	st, err := store.Open(context.Background(), filepath.Join(dir, "db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	img, err := st.GetImage(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	img.State, img.Error = state, ""
	if err := st.UpdateImage(context.Background(), img); err != nil {
		t.Fatal(err)
	}
}

// Two keys see only their own images and the public default.
func TestOwnersAndDefault(t *testing.T) {
	e := newEnv(t, "")
	ctx := context.Background()
	req := recipe("x")
	req.Name = "app"
	a, err := e.svc.Create(ctx, "key_a", req)
	if err != nil {
		t.Fatal(err)
	}
	a = e.wait("key_a", a.ID)
	if _, err := e.svc.Get(ctx, "key_b", a.ID); errdefs.Code(err) != "image_not_found" {
		t.Errorf("key_b reads key_a's image: %v", err)
	}
	if _, err := e.svc.Resolve(ctx, "key_b", "app"); errdefs.Code(err) != "image_not_found" {
		t.Errorf("key_b resolves key_a's name: %v", err)
	}
	if _, err := e.svc.Delete(ctx, "key_b", a.ID); errdefs.Code(err) != "image_not_found" {
		t.Errorf("key_b deletes key_a's image: %v", err)
	}
	list, _ := e.svc.List(ctx, catalog.ListOptions{Owner: "key_b"})
	for _, img := range list {
		if img.ID == a.ID {
			t.Error("key_b lists key_a's image")
		}
	}
	// The default image: public, resolved to the server's own (nil ref).
	for _, owner := range []string{"key_a", "key_b"} {
		ref, img, err := e.svc.ForCreate(ctx, owner, "default")
		if err != nil || ref != nil || !img.Public || img.Kind != catalog.SourceDefault {
			t.Errorf("%s: default resolves to %v %+v %v", owner, ref, img, err)
		}
		if _, err := e.svc.Delete(ctx, owner, img.ID); errdefs.Code(err) != "permission_denied" {
			t.Errorf("%s deletes the default image: %v", owner, err)
		}
	}
	ref, _, err := e.svc.ForCreate(ctx, "key_a", "app:latest")
	if err != nil || ref == nil || ref.ID != a.ID || ref.Rootfs != a.Rootfs || ref.MinDiskMiB != 3072 {
		t.Errorf("ForCreate app:latest: %+v %v", ref, err)
	}
}

// Delete is refused while a sandbox or a snapshot uses the image.
func TestDeleteInUse(t *testing.T) {
	e := newEnv(t, "")
	ctx := context.Background()
	img, err := e.svc.Create(ctx, "key_a", recipe("x"))
	if err != nil {
		t.Fatal(err)
	}
	img = e.wait("key_a", img.ID)
	sb := &sandbox.Sandbox{ID: "sbx_1", OwnerKeyID: "key_a", State: sandbox.StateRunning, OnLeaseEnd: "stop",
		CreatedAt: time.Now(), ImageID: img.ID, Rootfs: img.Rootfs, VCPU: 1, MemoryMiB: 512, DiskMiB: 3072}
	if err := e.st.InsertSandbox(ctx, sb, ""); err != nil {
		t.Fatal(err)
	}
	if _, err := e.svc.Delete(ctx, "key_a", img.ID); errdefs.Code(err) != "image_in_use" {
		t.Fatalf("delete in use: %v", err)
	}
	if _, err := e.st.UpdateSandbox(ctx, "sbx_1", func(s *sandbox.Sandbox) bool { s.State = sandbox.StateDeleted; return true }); err != nil {
		t.Fatal(err)
	}
	// A tenant's snapshot of it holds it too.
	snap := func(id, owner string) {
		if err := e.st.InsertSnapshot(ctx, &sandbox.Snapshot{ID: id, OwnerKeyID: owner, SourceSandboxID: "sbx_1",
			Mode: sandbox.SnapshotModeDisk, State: sandbox.SnapshotReady, CreatedAt: time.Now(), ImageID: img.ID}); err != nil {
			t.Fatal(err)
		}
	}
	gone := func(id string) {
		if _, err := e.st.UpdateSnapshot(ctx, id, func(sn *sandbox.Snapshot) bool { sn.State = sandbox.SnapshotDeleted; return true }); err != nil {
			t.Fatal(err)
		}
	}
	snap("snp_1", "key_a")
	if _, err := e.svc.Delete(ctx, "key_a", img.ID); errdefs.Code(err) != "image_in_use" {
		t.Fatalf("delete with a snapshot: %v", err)
	}
	gone("snp_1")
	// The builder's cached steps on it are dropped, asked by the catalog.
	snap("snp_cache", "system:build")
	var forgot []string
	e.b.forget = func(id string) error { forgot = append(forgot, id); gone("snp_cache"); return nil }
	if _, err := e.svc.Delete(ctx, "key_a", img.ID); err != nil {
		t.Fatalf("delete after its sandbox went: %v", err)
	}
	if len(forgot) != 1 || forgot[0] != img.ID {
		t.Errorf("ForgetImage calls %v", forgot)
	}
}

// A follower wakes for each line and ends with the image.
func TestFollow(t *testing.T) {
	e := newEnv(t, "")
	ctx := context.Background()
	img, err := e.svc.Create(ctx, "key_a", recipe("block"))
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var got []string
	done := make(chan *catalog.Image, 1)
	go func() {
		final, _, err := e.svc.Follow(ctx, "key_a", img.ID, 0, time.Minute, func(l catalog.LogLine) error {
			mu.Lock()
			got = append(got, l.Text)
			mu.Unlock()
			return nil
		})
		if err != nil {
			t.Error(err)
		}
		done <- final
	}()
	deadline := time.Now().Add(10 * time.Second)
	for {
		mu.Lock()
		n := len(got)
		mu.Unlock()
		if n >= 4 { // queued, started, step, two lines
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("follower saw %q", got)
		}
		time.Sleep(10 * time.Millisecond)
	}
	close(e.b.release)
	select {
	case final := <-done:
		if final == nil || final.State != catalog.StateReady {
			t.Fatalf("follow ended with %+v", final)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("follow did not end with the build")
	}
	if last := got[len(got)-1]; !strings.HasPrefix(last, "ready in") {
		t.Errorf("last line %q", last)
	}
}

func TestCreateValidation(t *testing.T) {
	e := newEnv(t, "")
	ctx := context.Background()
	for name, req := range map[string]catalog.CreateRequest{
		"no source":   {},
		"two sources": {Source: catalog.Source{Recipe: &catalog.Recipe{}, Reference: "python:3"}},
		"bad name":    {Name: "Bad Name", Source: catalog.Source{Reference: "x"}},
		"default":     {Name: "default", Source: catalog.Source{Reference: "x"}},
		"bad start":   {Source: catalog.Source{Reference: "x", Start: &catalog.StartSpec{Command: "x", ReadyPort: 70000}}},
		"missing ctx": {Source: catalog.Source{Dockerfile: "FROM default", Context: &catalog.Context{Archive: catalog.ContextArchive{
			SHA256: strings.Repeat("a", 64), Size: 10, Chunks: []string{strings.Repeat("b", 64)}}}}},
	} {
		if _, err := e.svc.Create(ctx, "k", req); !errdefs.IsInvalidArgument(err) {
			t.Errorf("%s: %v, want invalid", name, err)
		}
	}
}

// Context chunks: checked by sha256, bounded, assembled for the builder.
func TestContextChunks(t *testing.T) {
	e := newEnv(t, "")
	ctx := context.Background()
	data := []byte("context bytes")
	sum := sha256.Sum256(data)
	d := hex.EncodeToString(sum[:])
	missing, err := e.svc.Missing("k", []string{d})
	if err != nil || len(missing) != 1 {
		t.Fatalf("missing %v %v", missing, err)
	}
	if err := e.svc.PutChunk("k", d, strings.NewReader("other")); errdefs.Code(err) != "digest_mismatch" {
		t.Errorf("wrong bytes: %v", err)
	}
	if err := e.svc.PutChunk("k", d, strings.NewReader(strings.Repeat("x", catalog.MaxChunkBytes+1))); errdefs.Code(err) != "too_large" {
		t.Errorf("oversize chunk: %v", err)
	}
	if err := e.svc.PutChunk("k", d, strings.NewReader(string(data))); err != nil {
		t.Fatal(err)
	}
	if missing, _ := e.svc.Missing("k", []string{d}); len(missing) != 0 {
		t.Errorf("still missing %v", missing)
	}
	// The sweep keeps what was asked about since the cutoff.
	if n, err := e.svc.SweepChunks(time.Now().Add(-time.Hour)); err != nil || n != 0 {
		t.Errorf("sweep of a fresh chunk: %d %v", n, err)
	}
	img, err := e.svc.Create(ctx, "k", catalog.CreateRequest{Source: catalog.Source{Dockerfile: "FROM default",
		Context: &catalog.Context{Archive: catalog.ContextArchive{SHA256: d, Size: int64(len(data)), Chunks: []string{d}}}}})
	if err != nil {
		t.Fatal(err)
	}
	e.wait("k", img.ID)
	e.b.mu.Lock()
	job := e.b.jobs[len(e.b.jobs)-1]
	e.b.mu.Unlock()
	if n, err := e.svc.SweepChunks(time.Now().Add(time.Hour)); err != nil || n != 1 {
		t.Errorf("sweep of an old chunk: %d %v", n, err)
	}
	if missing, _ := e.svc.Missing("k", []string{d}); len(missing) != 1 {
		t.Errorf("a swept chunk is not missing: %v", missing)
	}
	if job.DiskMiB != catalog.DefaultBuildDiskMiB || job.Timeout != catalog.DefaultBuildTimeout || !job.Cache {
		t.Errorf("job limits %+v cache %v", job.Limits, job.Cache)
	}
	if job.ContextDir == "" || job.Context == nil || job.Dockerfile != "FROM default" {
		t.Errorf("job %+v", job)
	}
	// A base: the default image is an empty ref (booted as the server's
	// own); another owner's image is not found; this owner's is.
	def, err := job.Resolve(ctx, "default")
	if err != nil || def.Ref != (sandbox.ImageRef{}) || def.Digest != "sha256:"+strings.Repeat("d", 64) {
		t.Errorf("resolve default: %+v %v", def, err)
	}
	if _, err := job.Resolve(ctx, img.ID); err != nil {
		t.Errorf("resolve its own image: %v", err)
	}
	if _, err := job.Resolve(ctx, "nope"); errdefs.Code(err) != "image_not_found" {
		t.Errorf("resolve nope: %v", err)
	}
}

// An imported file is a ready image; the same bytes share one blob.
func TestImport(t *testing.T) {
	e := newEnv(t, "")
	ctx := context.Background()
	file := filepath.Join(e.dir, "disk.img")
	if err := os.WriteFile(file, []byte("ext4 bytes"), 0o600); err != nil {
		t.Fatal(err)
	}
	a, err := e.svc.Import(ctx, catalog.ImportRequest{File: file, Owner: "key_a", Name: "imp",
		Start: &catalog.StartSpec{Command: "serve", ReadyPort: 80}})
	if err != nil {
		t.Fatal(err)
	}
	if a.State != catalog.StateReady || a.Kind != catalog.SourceArchive || a.Public || a.Start == nil || len(a.Tags) != 1 {
		t.Fatalf("imported %+v", a)
	}
	b, err := e.svc.Import(ctx, catalog.ImportRequest{File: file, Public: true, Name: "imp2"})
	if err != nil {
		t.Fatal(err)
	}
	if b.Rootfs != a.Rootfs || !b.Public {
		t.Errorf("second import %+v, want the same blob, public", b)
	}
	if got, err := e.svc.Resolve(ctx, "key_b", "imp2"); err != nil || got.ID != b.ID {
		t.Errorf("key_b resolves the public import: %v %v", got, err)
	}
	if _, err := e.svc.Resolve(ctx, "key_b", "imp"); errdefs.Code(err) != "image_not_found" {
		t.Errorf("key_b resolves key_a's import: %v", err)
	}
	if _, err := e.svc.Publish(ctx, a.ID, true); err != nil {
		t.Fatal(err)
	}
	if got, err := e.svc.Resolve(ctx, "key_b", "imp"); err != nil || got.ID != a.ID {
		t.Errorf("published: %v %v", got, err)
	}
}

// A build whose image is deleted meanwhile is cancelled and leaves
// nothing: the image stays deleted, no blob is kept.
func TestDeleteWhileBuilding(t *testing.T) {
	e := newEnv(t, "")
	ctx := context.Background()
	img, err := e.svc.Create(ctx, "key_a", recipe("block"))
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		cur, _ := e.svc.Get(ctx, "key_a", img.ID)
		if cur.State == catalog.StateBuilding {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("never building")
		}
		time.Sleep(10 * time.Millisecond)
	}
	del, err := e.svc.Delete(ctx, "key_a", img.ID)
	if err != nil || del.State != catalog.StateDeleted {
		t.Fatalf("delete while building: %+v %v", del, err)
	}
	// The next build runs once the cancelled one let go of the worker.
	next, err := e.svc.Create(ctx, "key_a", recipe("after"))
	if err != nil {
		t.Fatal(err)
	}
	if got := e.wait("key_a", next.ID); got.State != catalog.StateReady {
		t.Fatalf("next build: %s %q", got.State, got.Error)
	}
	if cur, _ := e.svc.Get(ctx, "key_a", img.ID); cur.State != catalog.StateDeleted || cur.Digest != "" {
		t.Errorf("deleted image came back: %+v", cur)
	}
	blobs, _ := filepath.Glob(filepath.Join(e.dir, "images", "blobs", "*"))
	if len(blobs) != 1 {
		t.Errorf("blobs %v, want only the next build's", blobs)
	}
}

type pathBuilder struct{}

func (pathBuilder) Build(ctx context.Context, job catalog.Job, log catalog.LogSink) (catalog.Result, error) {
	return catalog.Result{}, errors.New("open " + filepath.Join(job.WorkDir, "x") + ": no such file")
}

// A build's error reaches the image's owner without host paths.
func TestBuildErrorHidesHostPaths(t *testing.T) {
	e := newEnv(t, "")
	e.svc.SetBuilder(pathBuilder{})
	img, err := e.svc.Create(context.Background(), "k", recipe("x"))
	if err != nil {
		t.Fatal(err)
	}
	img = e.wait("k", img.ID)
	if img.State != catalog.StateFailed || strings.Contains(img.Error, e.dir) || img.Error != "open <build>/x: no such file" {
		t.Errorf("error %q", img.Error)
	}
}

type templateRemover func(rootfs string) error

func (f templateRemover) RemoveTemplates(rootfs string) error { return f(rootfs) }
