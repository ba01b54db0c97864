package catalog_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/emberbox/emberbox/internal/catalog"
	"github.com/emberbox/emberbox/internal/errdefs"
	"github.com/emberbox/emberbox/internal/store"
)

// openCatalog starts a catalog with BuildsPerKey 2 over dir's store,
// without running its queue (builds stay queued).
func openCatalog(t *testing.T, dir string, st *store.Store) *catalog.Service {
	t.Helper()
	return openCatalogWith(t, dir, st, func(*catalog.Config) {})
}

func openCatalogWith(t *testing.T, dir string, st *store.Store, edit func(*catalog.Config)) *catalog.Service {
	t.Helper()
	def := filepath.Join(dir, "default.img")
	if err := os.WriteFile(def, []byte("default"), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg := catalog.Config{Store: catalog.Store{ImageRecords: st, ImageTags: st, ImageHolders: st, BuildLogs: st}, Builder: &fakeBuilder{release: make(chan struct{})}, DataDir: dir,
		DefaultRootfs: def, DefaultDigest: strings.Repeat("d", 64), BuildsPerKey: 2}
	edit(&cfg)
	svc, err := catalog.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := svc.Recover(context.Background()); err != nil {
		t.Fatal(err)
	}
	return svc
}

func refusedBuild(t *testing.T, err error) {
	t.Helper()
	var ce *errdefs.CodedError
	if !errors.As(err, &ce) || ce.Code != "quota_exceeded" || !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("got %v, want quota_exceeded", err)
	}
	if ce.Details["quota"] != "imageBuilds" || ce.RetryAfter <= 0 || !strings.Contains(ce.Hint, "--quota-image-builds") {
		t.Errorf("refusal: details %v, retry %v, hint %q", ce.Details, ce.RetryAfter, ce.Hint)
	}
}

// TestBuildsPerKey: a key has at most BuildsPerKey builds queued or
// running, whatever other keys do; the count is the store's, so it holds
// across a restart; a build that ends gives its place back.
func TestBuildsPerKey(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	st, err := store.Open(ctx, filepath.Join(dir, "db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	svc := openCatalog(t, dir, st)
	for range 2 {
		if _, err := svc.Create(ctx, "key_a", recipe("true")); err != nil {
			t.Fatal(err)
		}
	}
	_, err = svc.Create(ctx, "key_a", recipe("true"))
	refusedBuild(t, err)
	if _, err := svc.Create(ctx, "key_b", recipe("true")); err != nil {
		t.Fatalf("another key's build: %v", err)
	}

	// Restart: the queued builds are queued again and still count.
	svc = openCatalog(t, dir, st)
	_, err = svc.Create(ctx, "key_a", recipe("true"))
	refusedBuild(t, err)

	runCtx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { svc.Run(runCtx); close(done) }()
	defer func() { stop(); <-done }()
	// Once key_a's builds have ended, it may build again.
	deadline := time.Now().Add(20 * time.Second)
	for {
		_, err = svc.Create(ctx, "key_a", recipe("true"))
		if err == nil {
			break
		}
		if errdefs.Code(err) != "quota_exceeded" || time.Now().After(deadline) {
			t.Fatalf("a build after key_a's ended: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestBuildsPerKeyConcurrent: creates at once cannot pass the cap together.
func TestBuildsPerKeyConcurrent(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	st, err := store.Open(ctx, filepath.Join(dir, "db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	svc := openCatalog(t, dir, st)
	var ok atomic.Int32
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			_, err := svc.Create(ctx, "key_a", recipe("true"))
			switch {
			case err == nil:
				ok.Add(1)
			case errdefs.Code(err) != "quota_exceeded":
				t.Errorf("create: %v", err)
			}
		})
	}
	wg.Wait()
	if ok.Load() != 2 {
		t.Errorf("%d of 8 builds queued at once were taken, want the cap's 2", ok.Load())
	}
}

// TestBuildNeedsRoomForItsImage: a build whose image could eat into the
// data dir's free-space reserve fails saying so, and starts once there is
// room.
func TestBuildNeedsRoomForItsImage(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	st, err := store.Open(ctx, filepath.Join(dir, "db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	var free atomic.Int64
	free.Store(catalog.DefaultBuildDiskMiB + 2047)
	svc := openCatalogWith(t, dir, st, func(c *catalog.Config) {
		c.DiskFreeMiB = func() (int64, error) { return free.Load(), nil }
		c.DiskReserveMiB = 2048
	})
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { svc.Run(runCtx); close(done) }()
	defer func() { stop(); <-done }()
	waitBuilt := func(id string) *catalog.Image {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for {
			img, err := svc.Get(ctx, "key_a", id)
			if err != nil {
				t.Fatal(err)
			}
			if img.State != catalog.StateQueued && img.State != catalog.StateBuilding {
				return img
			}
			if time.Now().After(deadline) {
				t.Fatalf("image %s still %s", id, img.State)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	img, err := svc.Create(ctx, "key_a", recipe("true"))
	if err != nil {
		t.Fatal(err)
	}
	if got := waitBuilt(img.ID); got.State != catalog.StateFailed || !strings.Contains(got.Error, "no disk space for this build's image") {
		t.Fatalf("a build without room: %s %q", got.State, got.Error)
	}
	free.Store(catalog.DefaultBuildDiskMiB + 2048)
	if img, err = svc.Create(ctx, "key_a", recipe("true")); err != nil {
		t.Fatal(err)
	}
	if got := waitBuilt(img.ID); got.State != catalog.StateReady {
		t.Fatalf("a build with room: %s %q", got.State, got.Error)
	}
}
