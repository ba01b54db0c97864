package api

import (
	"bytes"
	"fmt"
	"testing"

	"github.com/emberbox/emberbox/internal/errdefs"
)

func (e *testEnv) archiveChunk(id string, data []byte, off int) (int, map[string]any) {
	e.t.Helper()
	end := min(off+1<<20, len(data))
	w := e.do("PUT", fmt.Sprintf("/v1/sandboxes/sbx_r/files/archive/uploads/%s?offset=%d", id, off), string(data[off:end]),
		"Content-Type", "application/octet-stream", "Idempotency-Key", fmt.Sprintf("chunk-%s-%d", id, off))
	return w.Code, decodeBody[map[string]any](e.t, w)
}

// TestArchiveUploadFlow sends a 2.5 MiB archive the way withruntime's
// unarchive does (begin, chunks in sequence, commit, each with a key) and
// checks what reached the guest, retries, order and the kinds kept apart.
func TestArchiveUploadFlow(t *testing.T) {
	e := newUploadEnv(t)
	data := payload(5 << 19)
	w := e.do("POST", "/v1/sandboxes/sbx_r/files/archive/uploads", `{"path":"/workspace/tree","gzip":true,"user":"root"}`,
		"Idempotency-Key", "begin-1")
	if w.Code != 200 {
		t.Fatalf("begin: %d %s", w.Code, w.Body)
	}
	begin := decodeBody[map[string]any](t, w)
	id, _ := begin["uploadId"].(string)
	if id == "" || begin["chunkBytes"] != float64(1<<20) || begin["user"] != "root" {
		t.Fatalf("begin answered %v", begin)
	}
	// A chunk out of sequence is refused; so is the file upload route.
	if w := e.do("PUT", fmt.Sprintf("/v1/sandboxes/sbx_r/files/archive/uploads/%s?offset=%d", id, 1<<20), "x"); w.Code != 400 {
		t.Fatalf("chunk ahead of sequence: %d %s", w.Code, w.Body)
	}
	if w := e.chunk(id, data, 0); w.Code != 404 || errorOf(t, w).Code != "upload_not_found" {
		t.Fatalf("an archive upload through the file chunk route: %d %s", w.Code, w.Body)
	}
	for off := 0; off < len(data); off += 1 << 20 {
		code, got := e.archiveChunk(id, data, off)
		if code != 200 || got["offset"] != float64(off) || got["nextOffset"] != float64(min(off+1<<20, len(data))) {
			t.Fatalf("chunk %d: %d %v", off, code, got)
		}
	}
	// The last chunk again, without a key (a retry whose answer was lost),
	// replaces itself and changes nothing.
	last := 2 << 20
	if w := e.do("PUT", fmt.Sprintf("/v1/sandboxes/sbx_r/files/archive/uploads/%s?offset=%d", id, last), string(data[last:])); w.Code != 200 {
		t.Fatalf("retry of the last chunk: %d %s", w.Code, w.Body)
	}
	if w := e.do("POST", "/v1/sandboxes/sbx_r/uploads/"+id+":commit", `{}`); w.Code != 404 {
		t.Fatalf("an archive upload committed as a file: %d %s", w.Code, w.Body)
	}
	commit := func() map[string]any {
		w := e.do("POST", "/v1/sandboxes/sbx_r/files/archive/uploads/"+id+":commit", `{}`)
		if w.Code != 200 {
			t.Fatalf("commit: %d %s", w.Code, w.Body)
		}
		return decodeBody[map[string]any](t, w)
	}
	got := commit()
	if got["path"] != "/workspace/tree" || got["bytes"] != float64(len(data)) || got["entries"] != float64(3) {
		t.Fatalf("commit answered %v", got)
	}
	e.m.mu.Lock()
	unpacked, to := e.m.arch.unpacked, e.m.arch.unpackTo
	e.m.arch.unpacked = nil
	e.m.mu.Unlock()
	if !bytes.Equal(unpacked, data) || to != `/workspace/tree user="root"` {
		t.Fatalf("the guest unpacked %d bytes to %s", len(unpacked), to)
	}
	// A repeated commit answers again without unpacking twice.
	if again := commit(); again["bytes"] != got["bytes"] {
		t.Fatalf("repeated commit: %v", again)
	}
	e.m.mu.Lock()
	twice := e.m.arch.unpacked != nil
	e.m.mu.Unlock()
	if twice {
		t.Fatal("a repeated commit unpacked again")
	}
	if len(stagedFiles(t, e)) != 0 {
		t.Fatal("staging file left after commit")
	}
}

func TestArchiveUploadRefusals(t *testing.T) {
	e := newUploadEnv(t)
	for _, body := range []string{`{}`, `{"path":"/w","user":"bob"}`, `{"path":"/w","size":3}`} {
		if w := e.do("POST", "/v1/sandboxes/sbx_r/files/archive/uploads", body); w.Code != 400 {
			t.Errorf("begin %s: %d %s", body, w.Code, w.Body)
		}
	}
	w := e.do("POST", "/v1/sandboxes/sbx_r/files/archive/uploads", `{"path":"/w"}`)
	id := decodeBody[map[string]any](t, w)["uploadId"].(string)
	// Nothing sent: the commit refuses and the upload stays open.
	if w := e.do("POST", "/v1/sandboxes/sbx_r/files/archive/uploads/"+id+":commit", `{}`); w.Code != 400 {
		t.Fatalf("empty commit: %d %s", w.Code, w.Body)
	}
	if code, _ := e.archiveChunk(id, make([]byte, 10), 0); code != 200 {
		t.Fatalf("chunk after a refused commit: %d", code)
	}
	// A failed unpack leaves it open too, to commit again.
	e.m.mu.Lock()
	e.m.arch.unpackErr = errdefs.New(errdefs.ErrInvalidArgument, "invalid_archive", "not a tar")
	e.m.mu.Unlock()
	if w := e.do("POST", "/v1/sandboxes/sbx_r/files/archive/uploads/"+id+":commit", `{}`); w.Code != 400 || errorOf(t, w).Code != "invalid_archive" {
		t.Fatalf("commit of a bad archive: %d %s", w.Code, w.Body)
	}
	if w := e.do("POST", "/v1/sandboxes/sbx_r/files/archive/uploads/"+id+":abort", `{}`); w.Code != 200 {
		t.Fatalf("abort: %d %s", w.Code, w.Body)
	}
	if w := e.do("POST", "/v1/sandboxes/sbx_r/files/archive/uploads/"+id+":abort", `{}`); w.Code != 404 {
		t.Fatalf("second abort: %d %s", w.Code, w.Body)
	}
	if len(stagedFiles(t, e)) != 0 {
		t.Fatal("staging file left after abort")
	}
}
