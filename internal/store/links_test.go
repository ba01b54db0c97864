package store

import (
	"context"
	"testing"
)

func TestLinkGenerations(t *testing.T) {
	s, path := openTest(t)
	ctx := context.Background()
	if g, err := s.LinkGeneration(ctx, "sbx_1"); err != nil || g != 0 {
		t.Fatalf("before a revoke: %d %v", g, err)
	}
	for want := int64(1); want <= 2; want++ {
		if g, err := s.RevokeLinks(ctx, "sbx_1"); err != nil || g != want {
			t.Fatalf("revoke: %d %v, want %d", g, err, want)
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s, err := Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if g, err := s.LinkGeneration(ctx, "sbx_1"); err != nil || g != 2 {
		t.Fatalf("after reopening: %d %v", g, err)
	}
	if g, _ := s.LinkGeneration(ctx, "sbx_2"); g != 0 {
		t.Fatalf("another sandbox: %d", g)
	}
}
