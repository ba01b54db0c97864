package api

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"math/rand/v2"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/emberbox/emberbox/internal/errdefs"
	"github.com/emberbox/emberbox/internal/sandbox"
	"github.com/emberbox/emberbox/internal/upload"
)

// newUploadEnv is a test env with a running sandbox sbx_r of key_a whose
// uploads are staged in a test directory.
func newUploadEnv(t *testing.T) *testEnv {
	t.Helper()
	e := newEnv(t)
	e.uploadDir = t.TempDir()
	st, err := NewUploads(upload.Config{Dir: e.uploadDir, Now: func() time.Time { return e.s.now() }})
	if err != nil {
		t.Fatal(err)
	}
	e.s.uploads = st
	e.m.add("key_a", "sbx_r", sandbox.StateRunning, time.Hour)
	return e
}

func payload(n int) []byte {
	r := rand.New(rand.NewPCG(1, uint64(n)))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

func sumHex(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// begin starts an upload of data to p and returns its id.
func (e *testEnv) begin(p string, data []byte, extra string) string {
	e.t.Helper()
	w := e.do("POST", "/v1/sandboxes/sbx_r/uploads",
		fmt.Sprintf(`{"path":%q,"size":%d,"sha256":%q%s}`, p, len(data), sumHex(data), extra))
	if w.Code != 200 {
		e.t.Fatalf("begin: %d %s", w.Code, w.Body)
	}
	got := decodeBody[map[string]any](e.t, w)
	if got["chunkBytes"] != float64(1<<20) {
		e.t.Fatalf("begin: %v", got)
	}
	return got["uploadId"].(string)
}

func (e *testEnv) chunk(id string, data []byte, off int, headers ...string) *httptest.ResponseRecorder {
	e.t.Helper()
	end := min(off+1<<20, len(data))
	return e.do("PUT", fmt.Sprintf("/v1/sandboxes/sbx_r/uploads/%s?offset=%d", id, off), string(data[off:end]),
		append([]string{"Content-Type", "application/octet-stream"}, headers...)...)
}

func stagedFiles(t *testing.T, e *testEnv) []os.DirEntry {
	t.Helper()
	ents, err := os.ReadDir(e.uploadDir)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	return ents
}

func TestUploadOutOfOrderAndRepeated(t *testing.T) {
	e := newUploadEnv(t)
	data := payload(5 << 19) // 2.5 MiB: chunks at 0, 1 MiB and 2 MiB
	id := e.begin("/workspace/dir/big.bin", data, `,"mode":"755"`)

	// Out of order and in parallel; the middle one twice, once retried with
	// the same Idempotency-Key and once as a fresh request.
	var wg sync.WaitGroup
	for _, off := range []int{2 << 20, 0} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if w := e.chunk(id, data, off); w.Code != 200 {
				t.Errorf("chunk %d: %d %s", off, w.Code, w.Body)
			}
		}()
	}
	wg.Wait()
	for i := 0; i < 2; i++ {
		if w := e.chunk(id, data, 1<<20, "Idempotency-Key", "chunk-1"); w.Code != 200 {
			t.Fatalf("chunk 1: %d %s", w.Code, w.Body)
		}
	}
	w := e.chunk(id, data, 1<<20)
	if got := decodeBody[map[string]any](t, w); got["chunksReceived"] != 3.0 || got["chunks"] != 3.0 {
		t.Errorf("chunk answer: %v", got)
	}

	w = e.do("POST", "/v1/sandboxes/sbx_r/uploads/"+id+":commit", "{}")
	if w.Code != 200 {
		t.Fatalf("commit: %d %s", w.Code, w.Body)
	}
	got := decodeBody[map[string]any](t, w)
	if got["path"] != "/workspace/dir/big.bin" || got["size"] != float64(len(data)) || got["type"] != "file" {
		t.Errorf("entry: %v", got)
	}
	if !bytes.Equal(e.m.files["sbx_r\x00/workspace/dir/big.bin"], data) {
		t.Errorf("the guest got other bytes")
	}
	if e.m.lastMode != 0o755 {
		t.Errorf("mode %o", e.m.lastMode)
	}
	if ents := stagedFiles(t, e); len(ents) != 0 {
		t.Errorf("staging left behind: %v", ents)
	}
	// A repeated commit answers the same entry; chunks and abort are refused.
	if w := e.do("POST", "/v1/sandboxes/sbx_r/uploads/"+id+":commit", "{}"); w.Code != 200 {
		t.Errorf("second commit: %d %s", w.Code, w.Body)
	}
	if w := e.chunk(id, data, 0); w.Code != 409 || errorOf(t, w).Code != "upload_committed" {
		t.Errorf("chunk after commit: %d %s", w.Code, w.Body)
	}
}

func TestUploadBeginAnswer(t *testing.T) {
	e := newUploadEnv(t)
	data := payload(3 << 20)
	w := e.do("POST", "/v1/sandboxes/sbx_r/uploads",
		fmt.Sprintf(`{"path":"rel/../x.bin","size":%d,"sha256":%q,"mode":"0755"}`, len(data), strings.ToUpper(sumHex(data))))
	got := decodeBody[map[string]any](t, w)
	if w.Code != 200 || got["path"] != "/workspace/x.bin" || got["mode"] != "755" || got["chunks"] != 3.0 {
		t.Errorf("begin: %d %v", w.Code, got)
	}
	// Without a mode none is reported, so the SDK's check stays quiet.
	w = e.do("POST", "/v1/sandboxes/sbx_r/uploads", fmt.Sprintf(`{"path":"/workspace/y","size":0,"sha256":%q}`, sumHex(nil)))
	got = decodeBody[map[string]any](t, w)
	if _, ok := got["mode"]; w.Code != 200 || ok {
		t.Errorf("begin without mode: %d %v", w.Code, got)
	}
	// An empty upload commits with no chunk at all.
	w = e.do("POST", "/v1/sandboxes/sbx_r/uploads/"+got["uploadId"].(string)+":commit", "")
	if w.Code != 200 || len(e.m.files["sbx_r\x00/workspace/y"]) != 0 {
		t.Errorf("empty commit: %d %s", w.Code, w.Body)
	}
}

func TestUploadBeginValidation(t *testing.T) {
	e := newUploadEnv(t)
	sum := sumHex(nil)
	for _, body := range []string{
		`{"path":"/workspace/a","size":1,"sha256":"` + sum + `","extra":1}`,
		`{"path":"/workspace/a","sha256":"` + sum + `"}`,
		`{"path":"/workspace/a","size":-1,"sha256":"` + sum + `"}`,
		`{"path":"/workspace/a","size":5000000000,"sha256":"` + sum + `"}`,
		`{"path":"/workspace/a","size":1,"sha256":"abc"}`,
		`{"path":"/workspace/a","size":1,"sha256":"` + strings.Repeat("g", 64) + `"}`,
		`{"path":"/workspace/a","size":1,"sha256":"` + sum + `","mode":"999"}`,
		`{"path":"/workspace/a","size":1,"sha256":"` + sum + `","mode":"rwx"}`,
		`{"path":"/etc/passwd","size":1,"sha256":"` + sum + `"}`,
		`{"path":"/workspace/../etc/x","size":1,"sha256":"` + sum + `"}`,
		`{"path":"../x","size":1,"sha256":"` + sum + `"}`,
		`{"path":"/workspace","size":1,"sha256":"` + sum + `"}`,
		`{"path":"","size":1,"sha256":"` + sum + `"}`,
		`{"path":"/workspace/a","size":"1","sha256":"` + sum + `"}`,
	} {
		if w := e.do("POST", "/v1/sandboxes/sbx_r/uploads", body); w.Code != 400 || errorOf(t, w).Code != "invalid_request" {
			t.Errorf("%s: %d %s", body, w.Code, w.Body)
		}
	}
	// Larger than the sandbox's disk (4096 MiB in the fake).
	e.m.sandboxes["sbx_r"].DiskMiB = 2
	if w := e.do("POST", "/v1/sandboxes/sbx_r/uploads", fmt.Sprintf(`{"path":"a","size":%d,"sha256":%q}`, 3<<20, sum)); w.Code != 400 {
		t.Errorf("over the disk: %d %s", w.Code, w.Body)
	}
	e.m.add("key_a", "sbx_s", sandbox.StateStopped, time.Hour)
	if w := e.do("POST", "/v1/sandboxes/sbx_s/uploads", fmt.Sprintf(`{"path":"a","size":1,"sha256":%q}`, sum)); w.Code != 409 || errorOf(t, w).Code != "not_running" {
		t.Errorf("stopped sandbox: %d %s", w.Code, w.Body)
	}
	e.m.add("key_b", "sbx_b", sandbox.StateRunning, time.Hour)
	if w := e.do("POST", "/v1/sandboxes/sbx_b/uploads", fmt.Sprintf(`{"path":"a","size":1,"sha256":%q}`, sum)); w.Code != 404 {
		t.Errorf("another key's sandbox: %d %s", w.Code, w.Body)
	}
	if ents := stagedFiles(t, e); len(ents) != 0 {
		t.Errorf("refused begins staged files: %v", ents)
	}
}

func TestUploadChecksumMismatch(t *testing.T) {
	e := newUploadEnv(t)
	data := payload(3 << 19)
	id := e.begin("/workspace/c.bin", data, "")
	bad := bytes.Clone(data)
	bad[len(bad)-1] ^= 0xff
	e.chunk(id, bad, 0)
	e.chunk(id, bad, 1<<20)
	w := e.do("POST", "/v1/sandboxes/sbx_r/uploads/"+id+":commit", "{}")
	if w.Code != 400 || errorOf(t, w).Code != "checksum_mismatch" {
		t.Fatalf("commit: %d %s", w.Code, w.Body)
	}
	if _, ok := e.m.files["sbx_r\x00/workspace/c.bin"]; ok {
		t.Error("a mismatched upload reached the guest")
	}
	// The upload stays open: the right chunk fixes it.
	e.chunk(id, data, 1<<20)
	if w := e.do("POST", "/v1/sandboxes/sbx_r/uploads/"+id+":commit", "{}"); w.Code != 200 {
		t.Fatalf("commit after the fix: %d %s", w.Code, w.Body)
	}
	if !bytes.Equal(e.m.files["sbx_r\x00/workspace/c.bin"], data) {
		t.Error("wrong bytes")
	}
}

func TestUploadIncomplete(t *testing.T) {
	e := newUploadEnv(t)
	data := payload(5 << 19)
	id := e.begin("/workspace/i.bin", data, "")
	e.chunk(id, data, 1<<20)
	w := e.do("POST", "/v1/sandboxes/sbx_r/uploads/"+id+":commit", "{}")
	er := errorOf(t, w)
	if w.Code != 409 || er.Code != "upload_incomplete" {
		t.Fatalf("commit: %d %s", w.Code, w.Body)
	}
	if miss, _ := er.Details["missingOffsets"].([]any); len(miss) != 2 || miss[0] != 0.0 || miss[1] != float64(2<<20) {
		t.Errorf("details: %v", er.Details)
	}
	if len(e.m.files) != 0 {
		t.Error("an incomplete upload reached the guest")
	}
}

func TestUploadAbort(t *testing.T) {
	e := newUploadEnv(t)
	data := payload(3 << 19)
	id := e.begin("/workspace/a.bin", data, "")
	e.chunk(id, data, 0)
	if len(stagedFiles(t, e)) != 1 {
		t.Fatal("no staging file")
	}
	w := e.do("POST", "/v1/sandboxes/sbx_r/uploads/"+id+":abort", "{}")
	if got := decodeBody[map[string]any](t, w); w.Code != 200 || got["aborted"] != true {
		t.Fatalf("abort: %d %s", w.Code, w.Body)
	}
	if ents := stagedFiles(t, e); len(ents) != 0 {
		t.Errorf("staging left behind: %v", ents)
	}
	for _, w := range []*httptest.ResponseRecorder{
		e.chunk(id, data, 1<<20),
		e.do("POST", "/v1/sandboxes/sbx_r/uploads/"+id+":commit", "{}"),
		e.do("POST", "/v1/sandboxes/sbx_r/uploads/"+id+":abort", "{}"),
	} {
		if w.Code != 404 || errorOf(t, w).Code != "upload_not_found" {
			t.Errorf("after abort: %d %s", w.Code, w.Body)
		}
	}
}

func TestUploadOtherKey(t *testing.T) {
	e := newUploadEnv(t)
	data := payload(3 << 19)
	id := e.begin("/workspace/o.bin", data, "")
	b := []string{"Authorization", "Bearer secret-b"}
	for _, w := range []*httptest.ResponseRecorder{
		e.do("PUT", "/v1/sandboxes/sbx_r/uploads/"+id+"?offset=0", string(data[:1<<20]), b...),
		e.do("POST", "/v1/sandboxes/sbx_r/uploads/"+id+":commit", "{}", b...),
		e.do("POST", "/v1/sandboxes/sbx_r/uploads/"+id+":abort", "{}", b...),
	} {
		if w.Code != 404 || errorOf(t, w).Code != "upload_not_found" {
			t.Errorf("key b: %d %s", w.Code, w.Body)
		}
	}
	// Nor through another sandbox of the owner.
	e.m.add("key_a", "sbx_other", sandbox.StateRunning, time.Hour)
	if w := e.do("POST", "/v1/sandboxes/sbx_other/uploads/"+id+":abort", "{}"); w.Code != 404 {
		t.Errorf("other sandbox: %d %s", w.Code, w.Body)
	}
	if w := e.chunk(id, data, 0); w.Code != 200 {
		t.Errorf("the owner still can: %d %s", w.Code, w.Body)
	}
}

func TestUploadOffsetValidation(t *testing.T) {
	e := newUploadEnv(t)
	data := payload(5 << 19)
	id := e.begin("/workspace/v.bin", data, "")
	base := "/v1/sandboxes/sbx_r/uploads/" + id
	for _, tc := range []struct{ query, body string }{
		{"", string(data[:1<<20])},
		{"?offset=", string(data[:1<<20])},
		{"?offset=x", string(data[:1<<20])},
		{"?offset=-1048576", string(data[:1<<20])},
		{"?offset=1000", string(data[:1<<20])},
		{"?offset=3145728", string(data[:1<<20])},   // past the end
		{"?offset=0", string(data[:1000])},          // short chunk
		{"?offset=2097152", string(data[:1<<20])},   // the last chunk is 512 KiB
		{"?offset=2097152", string(data[:1<<19+1])}, // one byte too many
	} {
		if w := e.do("PUT", base+tc.query, tc.body); w.Code != 400 || errorOf(t, w).Code != "invalid_request" {
			t.Errorf("%q (%d bytes): %d %s", tc.query, len(tc.body), w.Code, w.Body)
		}
	}
	if w := e.do("PUT", base+"?offset=0", strings.Repeat("x", 1<<20+1)); w.Code != 413 {
		t.Errorf("oversized chunk: %d", w.Code)
	}
	if w := e.do("PUT", "/v1/sandboxes/sbx_r/uploads/upl_nope?offset=0", "x"); w.Code != 404 {
		t.Errorf("unknown upload: %d", w.Code)
	}
	if w := e.do("POST", base+":commit", `{"force":true}`); w.Code != 400 {
		t.Errorf("commit with an unknown field: %d", w.Code)
	}
}

func TestUploadLimitAndExpiry(t *testing.T) {
	e := newUploadEnv(t)
	now := time.Now()
	e.s.now = func() time.Time { return now }
	var ids []string
	for range upload.MaxPerOwner {
		ids = append(ids, e.begin("/workspace/l", nil, ""))
	}
	w := e.do("POST", "/v1/sandboxes/sbx_r/uploads", fmt.Sprintf(`{"path":"l","size":0,"sha256":%q}`, sumHex(nil)))
	if w.Code != 429 || errorOf(t, w).Code != "rate_limited" || errorOf(t, w).RetryAfterMs == 0 {
		t.Fatalf("17th: %d %s", w.Code, w.Body)
	}
	// Another key has its own allowance.
	e.m.add("key_b", "sbx_b", sandbox.StateRunning, time.Hour)
	if w := e.do("POST", "/v1/sandboxes/sbx_b/uploads", fmt.Sprintf(`{"path":"l","size":0,"sha256":%q}`, sumHex(nil)),
		"Authorization", "Bearer secret-b"); w.Code != 200 {
		t.Errorf("key b: %d %s", w.Code, w.Body)
	}
	// Aborting one frees a slot.
	e.do("POST", "/v1/sandboxes/sbx_r/uploads/"+ids[0]+":abort", "{}")
	e.begin("/workspace/l", nil, "")
	// An hour later every idle upload is gone, with its staging file.
	now = now.Add(upload.TTL + time.Second)
	if w := e.do("POST", "/v1/sandboxes/sbx_r/uploads/"+ids[1]+":commit", "{}"); w.Code != 404 {
		t.Errorf("expired: %d %s", w.Code, w.Body)
	}
	if n := len(stagedFiles(t, e)); n != 0 {
		t.Errorf("expired uploads kept %d staging files", n)
	}
	for range upload.MaxPerOwner { // and no slot
		e.begin("/workspace/l", nil, "")
	}
}

func TestUploadsUnavailable(t *testing.T) {
	e := newEnv(t)
	e.s.uploads = nil // as with no staging directory
	e.m.add("key_a", "sbx_r", sandbox.StateRunning, time.Hour)
	w := e.do("POST", "/v1/sandboxes/sbx_r/uploads", fmt.Sprintf(`{"path":"a","size":0,"sha256":%q}`, sumHex(nil)))
	if w.Code != 503 || errorOf(t, w).Code != "uploads_unavailable" {
		t.Errorf("begin: %d %s", w.Code, w.Body)
	}
}

func TestChmod(t *testing.T) {
	e := newUploadEnv(t)
	e.m.files["sbx_r\x00/workspace/s.sh"] = []byte("#!/bin/sh\n")
	w := e.do("POST", "/v1/sandboxes/sbx_r/files:chmod", `{"path":"/workspace/s.sh","mode":"0755"}`)
	if got := decodeBody[map[string]any](t, w); w.Code != 200 || got["path"] != "/workspace/s.sh" || got["mode"] != "755" {
		t.Fatalf("chmod: %d %s", w.Code, w.Body)
	}
	if e.m.lastChmod != "/workspace/s.sh 755" {
		t.Errorf("guest asked for %q", e.m.lastChmod)
	}
	// Relative paths go to the guest as they are: it resolves them.
	e.do("POST", "/v1/sandboxes/sbx_r/files:chmod", `{"path":"s.sh","mode":"4750"}`)
	if e.m.lastChmod != "s.sh 4750" {
		t.Errorf("guest asked for %q", e.m.lastChmod)
	}
	w = e.do("POST", "/v1/sandboxes/sbx_r/files:chmod", `{"path":"/workspace/n","mode":"644"}`)
	if er := errorOf(t, w); w.Code != 404 || er.Code != "file_not_found" {
		t.Errorf("missing: %d %s", w.Code, w.Body)
	}
	e.m.chmodErr = errdefs.New(errdefs.ErrPermission, "permission_denied", "/etc/passwd: operation not permitted")
	w = e.do("POST", "/v1/sandboxes/sbx_r/files:chmod", `{"path":"/etc/passwd","mode":"777"}`)
	if er := errorOf(t, w); w.Code != 403 || er.Code != "permission_denied" || !strings.Contains(er.Hint, "owns") {
		t.Errorf("not the owner: %d %s", w.Code, w.Body)
	}
	for _, body := range []string{`{"path":"/workspace/s.sh","mode":"9"}`, `{"path":"/workspace/s.sh","mode":"17777"}`,
		`{"path":"/workspace/s.sh","mode":""}`, `{"mode":"644"}`, `{"path":"/a","mode":"644","x":1}`, `{"path":"/a","mode":644}`} {
		if w := e.do("POST", "/v1/sandboxes/sbx_r/files:chmod", body); w.Code != 400 {
			t.Errorf("%s: %d", body, w.Code)
		}
	}
	e.m.add("key_a", "sbx_s", sandbox.StateStopped, time.Hour)
	if w := e.do("POST", "/v1/sandboxes/sbx_s/files:chmod", `{"path":"a","mode":"644"}`); w.Code != 409 || errorOf(t, w).Code != "not_running" {
		t.Errorf("stopped sandbox: %d %s", w.Code, w.Body)
	}
}
