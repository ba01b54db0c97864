package store

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/emberbox/emberbox/internal/errdefs"
	"github.com/emberbox/emberbox/internal/sandbox"
)

func TestPreviewsSurviveReopenAndGoWithTheirSandbox(t *testing.T) {
	s, path := openTest(t)
	ctx := t.Context()
	for _, id := range []string{"sbx_a", "sbx_b"} {
		if err := s.InsertSandbox(ctx, newSandbox(id, "key_a", base), ""); err != nil {
			t.Fatal(err)
		}
	}
	p := &sandbox.Preview{ID: "pv1", SandboxID: "sbx_a", OwnerKeyID: "key_a", Port: 8080, Visibility: sandbox.PreviewPrivate,
		Secret: []byte("s1"), EmbedOrigins: []string{"https://x.example"}, CreatedAt: base, UpdatedAt: base, ExpiresAt: ptr(base.Add(time.Hour))}
	if err := s.PutPreview(ctx, p); err != nil {
		t.Fatal(err)
	}
	if err := s.PutPreview(ctx, &sandbox.Preview{ID: "pv2", SandboxID: "sbx_b", OwnerKeyID: "key_a", Port: 8080,
		Visibility: sandbox.PreviewPublic, Secret: []byte("s2"), CreatedAt: base, UpdatedAt: base}); err != nil {
		t.Fatal(err)
	}
	// A second put of the same port replaces it and keeps its id.
	p2 := *p
	p2.ID, p2.Secret, p2.Visibility = "pv-other", []byte("rotated"), sandbox.PreviewPublic
	if err := s.PutPreview(ctx, &p2); err != nil {
		t.Fatal(err)
	}
	s.Close()
	s, err := Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	got, err := s.PreviewByID(ctx, "pv1")
	if err != nil {
		t.Fatal(err)
	}
	want := *p
	want.Secret, want.Visibility = []byte("rotated"), sandbox.PreviewPublic
	if d := cmp.Diff(&want, got); d != "" {
		t.Errorf("after reopen (-want +got):\n%s", d)
	}
	if list, err := s.ListPreviews(ctx, "sbx_a"); err != nil || len(list) != 1 {
		t.Errorf("list: %v %v", list, err)
	}
	if err := s.DeletePreviews(ctx, "sbx_a", 0); err != nil {
		t.Fatal(err)
	}
	if _, err := s.GetPreview(ctx, "sbx_a", 8080); !errdefs.IsNotFound(err) {
		t.Errorf("deleted: %v", err)
	}
	if _, err := s.GetPreview(ctx, "sbx_b", 8080); err != nil {
		t.Errorf("another sandbox's preview went too: %v", err)
	}
}
