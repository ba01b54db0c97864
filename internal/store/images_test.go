package store

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/emberbox/emberbox/internal/catalog"
	"github.com/emberbox/emberbox/internal/errdefs"
	"github.com/emberbox/emberbox/internal/sandbox"
)

func newImage(id, owner, name string, at time.Time) *catalog.Image {
	return &catalog.Image{ID: id, Owner: owner, Name: name, State: catalog.StateReady, Kind: catalog.SourceRecipe,
		Source: []byte(`{"recipe":{}}`), Digest: "sha256:" + id, Rootfs: "/blobs/" + id, SizeBytes: 10, DiskMiB: 3072,
		Env: map[string]string{"A": "1"}, Start: &catalog.StartSpec{Command: "serve", ReadyPort: 80}, CreatedAt: at, ReadyAt: &at}
}

// Versions count per owner and name; tags move; a record round-trips and
// survives a reopen; owners do not see each other's names.
func TestImagesVersionsTagsOwners(t *testing.T) {
	s, path := openTest(t)
	ctx := t.Context()
	a1, a2 := newImage("i1", "key_a", "app", base), newImage("i2", "key_a", "app", base.Add(time.Second))
	b1 := newImage("i3", "key_b", "app", base.Add(2*time.Second))
	for _, img := range []*catalog.Image{a1, a2, b1} {
		if err := s.CreateImage(ctx, img); err != nil {
			t.Fatal(err)
		}
	}
	if a1.Version != 1 || a2.Version != 2 || b1.Version != 1 {
		t.Fatalf("versions %d %d %d, want 1 2 1", a1.Version, a2.Version, b1.Version)
	}
	for _, st := range []struct{ owner, tag, id string }{{"key_a", "latest", "i1"}, {"key_a", "latest", "i2"}, {"key_b", "latest", "i3"}} {
		if err := s.SetTag(ctx, st.owner, "app", st.tag, st.id); err != nil {
			t.Fatal(err)
		}
	}
	s.Close()
	s, err := Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	got, err := s.ImageByTag(ctx, "key_a", "app", "latest")
	if err != nil || got.ID != "i2" {
		t.Fatalf("key_a app:latest = %v %v, want i2 (the tag moved)", got, err)
	}
	a2.Tags = []string{"latest"}
	if diff := cmp.Diff(a2, got); diff != "" {
		t.Errorf("round trip (-want +got):\n%s", diff)
	}
	if old, _ := s.GetImage(ctx, "i1"); len(old.Tags) != 0 {
		t.Errorf("i1 kept tags %v", old.Tags)
	}
	if got, err := s.ImageByVersion(ctx, "key_b", "app", 1); err != nil || got.ID != "i3" {
		t.Errorf("key_b app@1 = %v %v", got, err)
	}
	if _, err := s.ImageByVersion(ctx, "key_b", "app", 2); errdefs.Code(err) != "image_not_found" {
		t.Errorf("key_b app@2: %v", err)
	}
	list, err := s.ListImages(ctx, catalog.ListOptions{Owner: "key_a", Limit: 10})
	if err != nil || len(list) != 2 || list[0].ID != "i2" || list[1].ID != "i1" {
		t.Errorf("key_a's list: %v %v", list, err)
	}
	page, _ := s.ListImages(ctx, catalog.ListOptions{Owner: "key_a", Limit: 10, Cursor: "i2"})
	if len(page) != 1 || page[0].ID != "i1" {
		t.Errorf("after cursor i2: %v", page)
	}
	// Public images are everyone's, found by name and tag or version.
	b1.Public = true
	if err := s.UpdateImage(ctx, b1); err != nil {
		t.Fatal(err)
	}
	if got, err := s.PublicImage(ctx, "app", "latest", 0); err != nil || got.ID != "i3" {
		t.Errorf("public app:latest = %v %v", got, err)
	}
	if list, _ := s.ListImages(ctx, catalog.ListOptions{Owner: "key_a", Limit: 10}); len(list) != 3 {
		t.Errorf("key_a lists %d images, want its 2 and the public one", len(list))
	}
	if removed, err := s.RemoveTag(ctx, "key_a", "app", "latest", "i1"); err != nil || removed {
		t.Errorf("untag from the wrong version: %v %v", removed, err)
	}
	if removed, err := s.RemoveTag(ctx, "key_a", "app", "latest", "i2"); err != nil || !removed {
		t.Errorf("untag: %v %v", removed, err)
	}
}

// Digest users count images not deleted; image users count sandboxes and
// snapshots not deleted; a deleted image stays deleted.
func TestImageRefcounts(t *testing.T) {
	s, _ := openTest(t)
	ctx := t.Context()
	a, b := newImage("i1", "key_a", "", base), newImage("i2", "key_a", "", base)
	b.Digest = a.Digest
	for _, img := range []*catalog.Image{a, b} {
		if err := s.CreateImage(ctx, img); err != nil {
			t.Fatal(err)
		}
	}
	if n, _ := s.DigestUsers(ctx, a.Digest); n != 2 {
		t.Errorf("digest users %d, want 2", n)
	}
	a.State = catalog.StateDeleted
	if err := s.UpdateImage(ctx, a); err != nil {
		t.Fatal(err)
	}
	if n, _ := s.DigestUsers(ctx, a.Digest); n != 1 {
		t.Errorf("digest users after a delete %d, want 1", n)
	}
	a.State = catalog.StateReady
	if err := s.UpdateImage(ctx, a); errdefs.Code(err) != "image_not_found" {
		t.Errorf("a deleted image brought back: %v", err)
	}
	sb := newSandbox("sbx_1", "key_a", base)
	sb.ImageID = "i2"
	if err := s.InsertSandbox(ctx, sb, ""); err != nil {
		t.Fatal(err)
	}
	if n, m, _, err := s.ImageUsers(ctx, "i2"); err != nil || n != 1 || m != 0 {
		t.Errorf("image users %d %d %v", n, m, err)
	}
	if _, err := s.UpdateSandbox(ctx, "sbx_1", func(sb *sandbox.Sandbox) bool { sb.State = sandbox.StateDeleted; return true }); err != nil {
		t.Fatal(err)
	}
	if n, _, _, _ := s.ImageUsers(ctx, "i2"); n != 0 {
		t.Errorf("a deleted sandbox still uses the image")
	}
	// Logs: appended in order, read after a seq.
	last, err := s.AppendImageLog(ctx, "i2", []catalog.LogLine{{At: base, Stream: "build", Text: "a"}, {At: base, Stream: "stdout", Text: "b"}})
	if err != nil || last != 2 {
		t.Fatalf("append: %d %v", last, err)
	}
	lines, _ := s.ImageLog(ctx, "i2", 1, 10)
	if len(lines) != 1 || lines[0].Seq != 2 || lines[0].Text != "b" || lines[0].Stream != "stdout" {
		t.Errorf("lines after 1: %+v", lines)
	}
	if _, err := s.AppendImageLog(ctx, "nope", []catalog.LogLine{{At: base, Text: "x"}}); errdefs.Code(err) != "image_not_found" {
		t.Errorf("log of no image: %v", err)
	}
}

// FinishImage makes a build's outcome and its tags visible together, or
// neither: an image deleted while it built gets no tag.
func TestFinishImageTagsAtomically(t *testing.T) {
	s, _ := openTest(t)
	ctx := t.Context()
	img := newImage("i1", "key_a", "app", base)
	img.State, img.ReadyAt = catalog.StateBuilding, nil
	if err := s.CreateImage(ctx, img); err != nil {
		t.Fatal(err)
	}
	img.State, img.ReadyAt = catalog.StateReady, &base
	if err := s.FinishImage(ctx, img, []string{"latest", "v1"}); err != nil {
		t.Fatal(err)
	}
	for _, tag := range []string{"latest", "v1"} {
		if got, err := s.ImageByTag(ctx, "key_a", "app", tag); err != nil || got.ID != "i1" || got.State != catalog.StateReady {
			t.Errorf("app:%s = %v %v, want i1 ready", tag, got, err)
		}
	}

	gone := newImage("i2", "key_a", "app", base.Add(time.Second))
	gone.State = catalog.StateDeleted
	if err := s.CreateImage(ctx, gone); err != nil {
		t.Fatal(err)
	}
	gone.State = catalog.StateReady
	if err := s.FinishImage(ctx, gone, []string{"latest"}); errdefs.Code(err) != "image_not_found" {
		t.Fatalf("finishing a deleted image: %v, want image_not_found", err)
	}
	if got, err := s.ImageByTag(ctx, "key_a", "app", "latest"); err != nil || got.ID != "i1" {
		t.Errorf("app:latest moved to a deleted image: %v %v", got, err)
	}
}
