package store

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/emberbox/emberbox/internal/errdefs"
)

func TestBuildCache(t *testing.T) {
	ctx := context.Background()
	s, _ := openTest(t)
	t0 := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	if _, err := s.GetBuildCache(ctx, "k1", t0); !errdefs.IsNotFound(err) {
		t.Fatalf("get of nothing: %v", err)
	}
	for i, k := range []string{"k1", "k2", "k3"} {
		if old, err := s.PutBuildCache(ctx, k, "snap-"+k, t0.Add(time.Duration(i)*time.Minute)); err != nil || old != "" {
			t.Fatalf("put %s: %q %v", k, old, err)
		}
	}
	if old, err := s.PutBuildCache(ctx, "k2", "snap-k2b", t0.Add(3*time.Minute)); err != nil || old != "snap-k2" {
		t.Fatalf("replace: %q %v, want the old snapshot", old, err)
	}
	// k1 used last: k3 is now the least recently used.
	if id, err := s.GetBuildCache(ctx, "k1", t0.Add(4*time.Minute)); err != nil || id != "snap-k1" {
		t.Fatalf("get: %q %v", id, err)
	}
	evicted, err := s.EvictBuildCache(ctx, 2)
	if err != nil || !slices.Equal(evicted, []string{"snap-k3"}) {
		t.Fatalf("evict: %q %v, want snap-k3", evicted, err)
	}
	if err := s.DeleteBuildCache(ctx, "k1"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.GetBuildCache(ctx, "k1", t0); !errdefs.IsNotFound(err) {
		t.Fatalf("get after delete: %v", err)
	}
	if id, err := s.GetBuildCache(ctx, "k2", t0); err != nil || id != "snap-k2b" {
		t.Fatalf("get k2: %q %v", id, err)
	}
	if all, err := s.BuildCacheSnapshots(ctx); err != nil || len(all) != 1 || all["k2"] != "snap-k2b" {
		t.Fatalf("list: %v %v", all, err)
	}
}
