package upload_test

import (
	"bytes"
	"context"
	"io"
	"path/filepath"
	"testing"

	"github.com/emberbox/emberbox/internal/errdefs"
	"github.com/emberbox/emberbox/internal/upload"
)

func collectOpen(_ context.Context, u *upload.Upload, r io.Reader) (*entry, error) {
	data, err := io.ReadAll(r)
	if err != nil {
		return nil, err
	}
	return &entry{path: u.Path + " " + u.User, data: data}, nil
}

// TestOpenUploadInSequence: chunks of an open-ended upload append in
// order, the last one may come again (shorter, even), and the commit gets
// exactly the bytes that arrived.
func TestOpenUploadInSequence(t *testing.T) {
	s, dir, _ := newStore(t)
	u, err := s.Begin(upload.Spec{Owner: "key_a", SandboxID: "sbx_1", Path: "/w", Open: true, User: "root"})
	if err != nil {
		t.Fatal(err)
	}
	if !u.Open || u.Chunks != 0 {
		t.Fatalf("begin: %+v", u)
	}
	data := payload(upload.ChunkSize + 100)
	if _, err := s.Append("key_a", "sbx_1", u.ID, 5, data[:5]); errdefs.Code(err) != upload.CodeInvalid {
		t.Fatalf("an offset out of sequence: %v", err)
	}
	if _, err := s.Put("key_a", "sbx_1", u.ID, 0, data[:upload.ChunkSize]); errdefs.Code(err) != upload.CodeNotFound {
		t.Fatalf("Put on an open upload: %v", err)
	}
	if _, err := s.Append("key_a", "sbx_1", u.ID, 0, data[:upload.ChunkSize]); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Append("key_a", "sbx_1", u.ID, upload.ChunkSize, make([]byte, 500)); err != nil {
		t.Fatal(err)
	}
	p, err := s.Append("key_a", "sbx_1", u.ID, upload.ChunkSize, data[upload.ChunkSize:])
	if err != nil || p.Received != int64(len(data)) || p.ChunksReceived != 2 {
		t.Fatalf("retry of the last chunk: %+v %v", p, err)
	}
	if _, err := s.Append("key_a", "sbx_1", u.ID, 0, data[:10]); errdefs.Code(err) != upload.CodeInvalid {
		t.Fatalf("a chunk before the last: %v", err)
	}
	if _, err := s.Append("key_a", "sbx_1", u.ID, int64(len(data)), make([]byte, upload.ChunkSize+1)); errdefs.Code(err) != upload.CodeInvalid {
		t.Fatalf("an oversized chunk: %v", err)
	}
	if _, err := s.Commit(context.Background(), "key_a", "sbx_1", u.ID, collect); errdefs.Code(err) != upload.CodeNotFound {
		t.Fatalf("Commit of an open upload: %v", err)
	}
	e, err := s.CommitOpen(context.Background(), "key_a", "sbx_1", u.ID, collectOpen)
	if err != nil || !bytes.Equal(e.data, data) || e.path != "/w root" {
		t.Fatalf("commit: %v", err)
	}
	if m, _ := filepath.Glob(filepath.Join(dir, "*")); len(m) != 0 {
		t.Fatalf("staging left: %v", m)
	}
}

// TestOpenUploadBounds: an open-ended upload counts against the owner's
// bytes as it grows.
func TestOpenUploadBounds(t *testing.T) {
	dir := t.TempDir()
	s, err := upload.New[*entry](upload.Config{Dir: dir, MaxBytesPerOwner: 3 * upload.ChunkSize,
		FreeSpace: func(string) (int64, error) { return 1 << 40, nil }})
	if err != nil {
		t.Fatal(err)
	}
	a, _ := s.Begin(upload.Spec{Owner: "key_a", SandboxID: "sbx_1", Path: "/w", Open: true})
	b, _ := s.Begin(upload.Spec{Owner: "key_a", SandboxID: "sbx_1", Path: "/v", Open: true})
	chunk := payload(upload.ChunkSize)
	for i := range 2 {
		if _, err := s.Append("key_a", "sbx_1", a.ID, int64(i)*upload.ChunkSize, chunk); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.Append("key_a", "sbx_1", b.ID, 0, chunk); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Append("key_a", "sbx_1", b.ID, upload.ChunkSize, chunk[:1]); errdefs.Code(err) != upload.CodeTooMany {
		t.Fatalf("past the owner's bytes: %v", err)
	}
	if err := s.AbortOpen("key_a", "sbx_1", a.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Append("key_a", "sbx_1", b.ID, upload.ChunkSize, chunk[:1]); err != nil {
		t.Fatalf("after an abort freed room: %v", err)
	}
	if _, err := s.Begin(upload.Spec{Owner: "key_a", SandboxID: "sbx_1", Path: "/v", Open: true, Size: 3}); errdefs.Code(err) != upload.CodeInvalid {
		t.Fatalf("an open upload with a size: %v", err)
	}
}
