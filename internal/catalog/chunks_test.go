package catalog_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/emberbox/emberbox/internal/catalog"
	"github.com/emberbox/emberbox/internal/errdefs"
)

func digestOf(b string) string {
	sum := sha256.Sum256([]byte(b))
	return hex.EncodeToString(sum[:])
}

func archiveOf(chunks ...string) *catalog.ContextArchive {
	a := &catalog.ContextArchive{SHA256: digestOf(strings.Join(chunks, "")), Size: int64(len(strings.Join(chunks, "")))}
	for _, c := range chunks {
		a.Chunks = append(a.Chunks, digestOf(c))
	}
	return a
}

// A key's chunks are its own: another key asking about them hears they
// are missing, and cannot build from them.
func TestContextChunksPerOwner(t *testing.T) {
	e := newEnv(t, "")
	ctx := context.Background()
	data := "only a's file"
	d := digestOf(data)
	if err := e.svc.PutChunk("a", d, strings.NewReader(data)); err != nil {
		t.Fatal(err)
	}
	if missing, err := e.svc.Missing("a", []string{d}); err != nil || len(missing) != 0 {
		t.Errorf("the owner's chunk: missing %v %v", missing, err)
	}
	if missing, err := e.svc.Missing("b", []string{d}); err != nil || len(missing) != 1 {
		t.Errorf("another key's chunk: missing %v %v, want it missing", missing, err)
	}
	req := catalog.CreateRequest{Source: catalog.Source{Archive: archiveOf(data)}}
	if _, err := e.svc.Create(ctx, "b", req); errdefs.Code(err) != "context_missing" {
		t.Errorf("b building from a's chunk: %v, want context_missing", err)
	}
	if _, err := e.svc.Create(ctx, "a", req); err != nil {
		t.Errorf("a building from its chunk: %v", err)
	}
	// b uploading the same bytes keeps its own copy; a's sweep leaves it.
	if err := e.svc.PutChunk("b", d, strings.NewReader(data)); err != nil {
		t.Fatal(err)
	}
	if missing, _ := e.svc.Missing("b", []string{d}); len(missing) != 0 {
		t.Errorf("b's own upload is missing: %v", missing)
	}
}

// Per-key quotas of chunks and bytes: the key over one is refused with
// quota_exceeded, another key is not, and a sweep frees the room.
func TestContextChunkQuotas(t *testing.T) {
	e := newEnvWith(t, "", func(c *catalog.Config) {
		c.Chunks = catalog.ChunkLimits{PerKey: 2, BytesPerKey: 10}
	})
	put := func(owner, data string) error { return e.svc.PutChunk(owner, digestOf(data), strings.NewReader(data)) }
	for _, c := range []string{"aaaa", "bbbb", "aaaa"} { // the same chunk again counts once
		if err := put("k", c); err != nil {
			t.Fatalf("chunk %q within the quota: %v", c, err)
		}
	}
	var ce *errdefs.CodedError
	if err := put("k", "cc"); !errors.As(err, &ce) || ce.Code != catalog.CodeChunkQuota || !strings.Contains(ce.Message, "2 context chunks") {
		t.Errorf("a third chunk: %v, want %s naming the count", err, catalog.CodeChunkQuota)
	}
	if missing, _ := e.svc.Missing("k", []string{digestOf("cc")}); len(missing) != 1 {
		t.Error("a refused chunk was kept")
	}
	if err := put("j", "123456"); err != nil {
		t.Fatal(err)
	}
	if err := put("j", "abcdef"); !errors.As(err, &ce) || ce.Code != catalog.CodeChunkQuota || !strings.Contains(ce.Message, "MiB") {
		t.Errorf("12 bytes over a quota of 10: %v, want %s naming the bytes", err, catalog.CodeChunkQuota)
	}
	if err := put("m", "cc"); err != nil {
		t.Errorf("another key, under its quota: %v", err)
	}
	if n, err := e.svc.SweepChunks(time.Now().Add(time.Hour)); err != nil || n != 4 {
		t.Errorf("sweep: %d %v, want 4 chunks", n, err)
	}
	if err := put("k", "cc"); err != nil {
		t.Errorf("after the sweep: %v", err)
	}
}

// A chunk that would eat into the free-space reserve of the data dir's
// file system is refused (409 storage_full, with a retry delay); the
// catalog keeps working.
func TestContextChunkReserve(t *testing.T) {
	var free atomic.Int64
	free.Store(64 << 20)
	e := newEnvWith(t, "", func(c *catalog.Config) {
		c.Chunks = catalog.ChunkLimits{FreeReserve: 32 << 20, FreeSpace: func(string) (int64, error) { return free.Load(), nil }}
	})
	data := "fits"
	if err := e.svc.PutChunk("k", digestOf(data), strings.NewReader(data)); err != nil {
		t.Fatalf("with room: %v", err)
	}
	free.Store(32<<20 + catalog.MaxChunkBytes - 1)
	var ce *errdefs.CodedError
	err := e.svc.PutChunk("k", digestOf("more"), strings.NewReader("more"))
	if !errors.As(err, &ce) || ce.Code != catalog.CodeStorageFull || !errdefs.IsConflict(err) || ce.RetryAfter <= 0 {
		t.Fatalf("into the reserve: %v, want a 409 %s with a retry delay", err, catalog.CodeStorageFull)
	}
	if missing, _ := e.svc.Missing("k", []string{digestOf("more")}); len(missing) != 1 {
		t.Error("a refused chunk was kept")
	}
	if _, err := e.svc.Create(context.Background(), "k", catalog.CreateRequest{Source: catalog.Source{Archive: archiveOf(data)}}); err != nil {
		t.Errorf("a build from the chunk kept, at the reserve: %v", err)
	}
}
