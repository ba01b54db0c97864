package integration

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"
)

// tarGz packs files (name → bytes) as a tar.gz.
func tarGz(t *testing.T, files map[string][]byte) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	tw := tar.NewWriter(zw)
	for name, data := range files {
		if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(data)), Typeflag: tar.TypeReg}); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write(data); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// untarGz reads a tar.gz into name → bytes of its regular files.
func untarGz(t *testing.T, data []byte) map[string][]byte {
	t.Helper()
	zr, err := gzip.NewReader(bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]byte{}
	tr := tar.NewReader(zr)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		if h.Typeflag == tar.TypeReg {
			b, err := io.ReadAll(tr)
			if err != nil {
				t.Fatal(err)
			}
			out[strings.TrimPrefix(h.Name, "./")] = b
		}
	}
}

func noise(seed uint64, n int) []byte {
	r := rand.New(rand.NewPCG(seed, 9))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

// TestFilesChunkedArchiveLinksWatches uploads a directory archive over
// 1 MiB through the chunked route and reads it back, uses a signed link
// without a key and sees it refused (403 link_revoked) once revoked, and
// watches a directory see create, modify and delete, against one real VM.
func TestFilesChunkedArchiveLinksWatches(t *testing.T) {
	needVMs(t)
	s := startServer(t, t.TempDir())
	c := s.client(s.AdminKey)
	sb := c.createRunning(t, nil)
	base := "/v1/sandboxes/" + sb.ID

	files := map[string][]byte{"big.bin": noise(1, 3<<20), "sub/small.txt": []byte("small\n"), "sub/mid.bin": noise(2, 300<<10)}
	archive := tarGz(t, files)
	if len(archive) <= 1<<20 {
		t.Fatalf("archive of %d bytes does not need chunks", len(archive))
	}
	key := func(k string) http.Header { return http.Header{"Idempotency-Key": {k}} }
	begin, _ := call[struct {
		UploadID   string `json:"uploadId"`
		ChunkBytes int    `json:"chunkBytes"`
	}](t, c, "POST", base+"/files/archive/uploads", map[string]any{"path": "/workspace/tree", "gzip": true, "user": "sandbox"}, key("b1"))
	up := base + "/files/archive/uploads/" + begin.UploadID
	for off := 0; off < len(archive); off += begin.ChunkBytes {
		end := min(off+begin.ChunkBytes, len(archive))
		call[map[string]any](t, c, "PUT", fmt.Sprintf("%s?offset=%d", up, off), archive[off:end], key(fmt.Sprintf("c%d", off)))
	}
	done, _ := call[struct{ Entries, Bytes int64 }](t, c, "POST", up+":commit", map[string]any{}, key("commit"))
	var unpacked int64
	for _, b := range files {
		unpacked += int64(len(b))
	}
	if done.Bytes != unpacked || done.Entries < 3 {
		t.Errorf("commit answered %+v", done)
	}
	sum := func(b []byte) string { h := sha256.Sum256(b); return hex.EncodeToString(h[:]) }
	out := c.sh(t, sb.ID, "cd /workspace/tree && sha256sum big.bin sub/mid.bin")
	for _, name := range []string{"big.bin", "sub/mid.bin"} {
		if !strings.Contains(out, sum(files[name])+"  "+name) {
			t.Errorf("%s in the guest: %s", name, out)
		}
	}
	r := c.raw(t, "GET", base+"/files/archive?path=/workspace/tree", nil, nil, requestTimeout)
	if r.err != nil || r.Status != 200 {
		t.Fatalf("archive download: %v", r)
	}
	back := untarGz(t, r.Body)
	for name, data := range files {
		if !bytes.Equal(back[name], data) {
			t.Errorf("%s came back as %d bytes, want %d", name, len(back[name]), len(data))
		}
	}

	// A signed link, used without a key.
	anon := s.client("")
	link := func(body map[string]any) string {
		l, _ := call[struct{ URL, ExpiresAt string }](t, c, "POST", base+"/files:link", body, nil)
		u, err := url.Parse(l.URL)
		if err != nil || l.ExpiresAt == "" || !strings.HasPrefix(l.URL, s.URL+"/v1/links/") {
			t.Fatalf("link %v: %q %q", body, l.URL, l.ExpiresAt)
		}
		return u.Path
	}
	get := link(map[string]any{"path": "/workspace/tree/big.bin", "method": "GET", "expiresInSeconds": 600})
	if r := anon.raw(t, "GET", get, nil, nil, requestTimeout); r.Status != 200 || !bytes.Equal(r.Body, files["big.bin"]) {
		t.Fatalf("download through the link: %v", r)
	}
	if r := anon.raw(t, "GET", get, nil, http.Header{"Range": {"bytes=10-19"}}, requestTimeout); r.Status != 206 || !bytes.Equal(r.Body, files["big.bin"][10:20]) {
		t.Errorf("ranged download: %v", r)
	}
	dir := link(map[string]any{"path": "/workspace/tree", "archive": true})
	if r := anon.raw(t, "GET", dir, nil, nil, requestTimeout); r.Status != 200 || !bytes.Equal(untarGz(t, r.Body)["sub/small.txt"], files["sub/small.txt"]) {
		t.Errorf("directory through an archive link: %v", r)
	}
	put := link(map[string]any{"path": "/workspace/via-link.txt", "method": "PUT"})
	if r := anon.raw(t, "PUT", put, []byte("through a link\n"), nil, requestTimeout); r.Status != 200 {
		t.Fatalf("upload through the link: %v", r)
	}
	if got := c.sh(t, sb.ID, "cat /workspace/via-link.txt"); got != "through a link\n" {
		t.Errorf("uploaded through the link: %q", got)
	}
	call[map[string]any](t, c, "POST", base+"/files:revoke-links", nil, nil)
	for _, p := range []string{get, dir} {
		if r := anon.raw(t, "GET", p, nil, nil, requestTimeout); r.Status != 403 || r.Err == nil || r.Err.Code != "link_revoked" {
			t.Errorf("a revoked link: %v", r)
		}
	}
	if r := anon.raw(t, "PUT", put, []byte("x"), nil, requestTimeout); r.Status != 403 {
		t.Errorf("a revoked upload link: %v", r)
	}

	// A recursive watch sees create, modify and delete, in a directory
	// made after it began too.
	wat, _ := call[struct {
		ID     string
		Cursor int64
	}](t, c, "POST", base+"/files/watches", map[string]any{"path": "/workspace", "recursive": true}, nil)
	c.sh(t, sb.ID, "mkdir -p /workspace/w/new")
	want := []string{"create /workspace/w", "create /workspace/w/new"}
	var seen []string
	cursor := wat.Cursor
	have := func() bool {
		for _, w := range want {
			found := false
			for _, s := range seen {
				found = found || s == w
			}
			if !found {
				return false
			}
		}
		return true
	}
	poll := func() bool {
		b, _ := call[struct {
			Events []struct {
				Type, Path string
				At         time.Time
			}
			NextCursor int64
		}](t, c, "GET", fmt.Sprintf("%s/files/watches/%s/events?cursor=%d&waitMs=5000", base, wat.ID, cursor), nil, nil)
		cursor = b.NextCursor
		for _, e := range b.Events {
			if e.At.IsZero() {
				t.Errorf("event without a time: %+v", e)
			}
			seen = append(seen, e.Type+" "+e.Path)
		}
		return have()
	}
	read := func() {
		t.Helper()
		if !waitUntil(60*time.Second, 0, poll) {
			t.Errorf("watch saw %q, want %q", seen, want)
		}
	}
	read()
	// The new directory is watched once its create was seen.
	c.sh(t, sb.ID, "printf 1 > /workspace/w/new/f.txt; printf 2 >> /workspace/w/new/f.txt; rm /workspace/w/new/f.txt")
	want = append(want, "create /workspace/w/new/f.txt", "modify /workspace/w/new/f.txt", "delete /workspace/w/new/f.txt")
	read()
	if r, _ := call[struct{ Stopped bool }](t, c, "DELETE", base+"/files/watches/"+wat.ID, nil, nil); !r.Stopped {
		t.Errorf("stop: %v", r)
	}
}
