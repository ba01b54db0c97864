package cluster

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// BenchmarkMoveImage measures what moving an image's disk from one node to
// another costs over the node channel (mutual TLS 1.3, the extents stream
// a snapshot fetch uses), with the receiver's content check (SHA-256, as
// an image is content-addressed): the figure issue 28's placement policy
// weighs against placing a sandbox where its image already is. Two disks:
// a 4 GiB one that is data throughout (the worst case: an image filled to
// its size) and, when the server's guest image is cached on this host
// ($EMBERBOX_BENCH_ROOTFS, or the default image under ~/.cache), that
// real ext4 disk, holes and all. Both ends run on this host, so the
// figure is the CPU's (TLS, hashing, writes), not a network's.
func BenchmarkMoveImage(b *testing.B) {
	ca, err := NewCA()
	if err != nil {
		b.Fatal(err)
	}
	a, err := ca.Issue("a", "127.0.0.1")
	if err != nil {
		b.Fatal(err)
	}
	c, err := ca.Issue("c", "127.0.0.1")
	if err != nil {
		b.Fatal(err)
	}
	dense := filepath.Join(b.TempDir(), "disk.img")
	if err := writeRandom(dense, 4<<30); err != nil {
		b.Fatal(err)
	}
	disks := map[string]string{"dense4GiB": dense}
	if p := cachedRootfs(); p != "" {
		disks["defaultRootfs"] = p
	}
	for name, path := range disks {
		b.Run(name, func(b *testing.B) { benchMove(b, path, a, c) })
	}
}

func benchMove(b *testing.B, path string, from, to *NodeTLS) {
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := writeExtents(w, map[string]string{"rootfs.img": path}); err != nil {
			b.Error(err)
		}
	}))
	srv.TLS = from.Server
	srv.StartTLS()
	defer srv.Close()
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: to.Client.Clone(), ForceAttemptHTTP2: false,
		TLSNextProto: map[string]func(string, *tls.Conn) http.RoundTripper{}}}
	want, err := fileSum(path)
	if err != nil {
		b.Fatal(err)
	}
	st, _ := os.Stat(path)
	b.SetBytes(st.Size())
	var moved, checked time.Duration
	b.ResetTimer()
	for range b.N {
		dir := b.TempDir()
		start := time.Now()
		resp, err := client.Get(srv.URL)
		if err != nil {
			b.Fatal(err)
		}
		err = readExtents(resp.Body, dir)
		resp.Body.Close()
		if err != nil {
			b.Fatal(err)
		}
		moved += time.Since(start)
		start = time.Now()
		got, err := fileSum(filepath.Join(dir, "rootfs.img"))
		if err != nil {
			b.Fatal(err)
		}
		checked += time.Since(start)
		if !bytes.Equal(got, want) {
			b.Fatal("the moved disk differs from the source")
		}
		os.RemoveAll(dir)
	}
	b.ReportMetric(moved.Seconds()/float64(b.N), "s/move")
	b.ReportMetric(checked.Seconds()/float64(b.N), "s/check")
}

// writeRandom writes size random bytes to path.
func writeRandom(path string, size int64) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := io.CopyN(f, rand.Reader, size); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func fileSum(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return nil, err
	}
	return h.Sum(nil), nil
}

// cachedRootfs is a guest image's disk on this host, or "".
func cachedRootfs() string {
	if p := os.Getenv("EMBERBOX_BENCH_ROOTFS"); p != "" {
		return p
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return ""
	}
	m, _ := filepath.Glob(filepath.Join(home, ".cache", "emberbox", "images", "*", "rootfs.img"))
	if len(m) == 0 {
		return ""
	}
	return m[0]
}
