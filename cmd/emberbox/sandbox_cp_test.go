package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"io"
	"io/fs"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"testing/fstest"

	emberbox "github.com/emberbox/emberbox/sdk/go"
)

// TestUploadTreeBatches checks what uploadTree sends: archives of at most
// archiveBatch bytes in walk order, each unpacked into dst, and files over
// bigFile by themselves.
func TestUploadTreeBatches(t *testing.T) {
	noise := func(n int, seed uint64) []byte { // incompressible
		r := rand.New(rand.NewPCG(seed, seed))
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(r.Uint32())
		}
		return b
	}
	tree := fstest.MapFS{
		".":   {Mode: fs.ModeDir | 0o755},
		"a":   {Mode: fs.ModeDir | 0o755},
		"a/x": {Data: []byte("x\n"), Mode: 0o600},
		"big": {Data: noise(bigFile+1, 1), Mode: 0o644},
		"l":   {Data: []byte("a/x"), Mode: fs.ModeSymlink | 0o777},
		"m1":  {Data: noise(400<<10, 2), Mode: 0o644},
		"m2":  {Data: noise(400<<10, 3), Mode: 0o644},
		"m3":  {Data: noise(400<<10, 4), Mode: 0o755},
	}
	var mu sync.Mutex
	var sent []string // one line per request: what it carried
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		line := r.Method + " " + r.URL.Path + " " + r.URL.Query().Get("path")
		if strings.HasSuffix(r.URL.Path, "/files/archive") {
			if len(body) > emberbox.MaxPut {
				t.Errorf("an archive of %d bytes", len(body))
			}
			line += " " + strings.Join(tarEntries(t, body), ",")
			io.WriteString(w, `{}`)
		} else {
			line += " " + r.URL.Query().Get("mode")
			if !bytes.Equal(body, tree["big"].Data) {
				t.Errorf("%s carried %d bytes, not big's", line, len(body))
			}
			w.WriteHeader(http.StatusNoContent)
		}
		mu.Lock()
		sent = append(sent, line)
		mu.Unlock()
	}))
	defer srv.Close()
	c, err := emberbox.NewClient(srv.URL, "k")
	if err != nil {
		t.Fatal(err)
	}
	if err := uploadTree(context.Background(), c, "sbx_1", "/workspace/t", tree); err != nil {
		t.Fatal(err)
	}
	want := []string{
		"PUT /v1/sandboxes/sbx_1/files/content /workspace/t/big 644",
		"PUT /v1/sandboxes/sbx_1/files/archive /workspace/t ./ 755,a/ 755,a/x 600 x\n,l -> a/x,m1 644",
		"PUT /v1/sandboxes/sbx_1/files/archive /workspace/t m2 644",
		"PUT /v1/sandboxes/sbx_1/files/archive /workspace/t m3 755",
	}
	if !slices.Equal(sent, want) {
		t.Errorf("sent\n%s\nwant\n%s", strings.Join(sent, "\n"), strings.Join(want, "\n"))
	}
}

// tarEntries lists a tar.gz's entries: name, mode, and a small file's
// content or a link's target.
func tarEntries(t *testing.T, archive []byte) []string {
	t.Helper()
	gz, err := gzip.NewReader(bytes.NewReader(archive))
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(gz)
	var out []string
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		e := hdr.Name
		switch {
		case hdr.Typeflag == tar.TypeSymlink:
			e += " -> " + hdr.Linkname
		default:
			e += " " + strconv.FormatInt(hdr.Mode&0o777, 8)
			if b, _ := io.ReadAll(tr); len(b) > 0 && len(b) < 100 {
				e += " " + string(b)
			}
		}
		if hdr.Uid != 0 || hdr.Gid != 0 || hdr.Uname != "" || hdr.Gname != "" {
			t.Errorf("%s is owned by %d:%d (%s:%s)", hdr.Name, hdr.Uid, hdr.Gid, hdr.Uname, hdr.Gname)
		}
		out = append(out, e)
	}
}
