package catalog

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
)

var (
	digestRE = regexp.MustCompile(`^sha256:[a-f0-9]{64}$`)
	hexRE    = regexp.MustCompile(`^[a-f0-9]{64}$`)
)

// blobStore keeps image disks by digest: <dir>/<hex>/rootfs.img, one file
// however many images share the digest.
type blobStore struct{ dir string }

func (b blobStore) path(digest string) string {
	return filepath.Join(b.dir, digest[len("sha256:"):], "rootfs.img")
}

// put moves file into the store under digest, or drops it when the blob
// is there already (dedupe). It returns the blob's path.
func (b blobStore) put(digest, file string) (string, error) {
	if !digestRE.MatchString(digest) {
		return "", fmt.Errorf("image digest %q is not sha256:<hex>", digest)
	}
	dst := b.path(digest)
	if _, err := os.Stat(dst); err == nil {
		return dst, os.Remove(file)
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return "", err
	}
	// Readable by the VMs' confined uids, never writable: every sandbox of
	// the image boots it read only under its own overlay.
	if err := os.Chmod(file, 0o644); err != nil {
		return "", err
	}
	if err := os.Rename(file, dst); err != nil {
		return "", fmt.Errorf("storing the image disk: %w", err)
	}
	return dst, nil
}

func (b blobStore) remove(digest string) error {
	if !digestRE.MatchString(digest) {
		return nil
	}
	if err := os.RemoveAll(filepath.Dir(b.path(digest))); err != nil {
		return fmt.Errorf("removing image blob %s: %w", digest, err)
	}
	return nil
}

// fileDigest hashes a file, for a build that gave no digest.
func fileDigest(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil)), nil
}

// Bounds of build contexts, as the SDK packs them.
const (
	MaxChunkBytes   = 1 << 20
	MaxContextBytes = 100 << 20
	maxChunks       = MaxContextBytes/MaxChunkBytes + 1
)

// Bounds of an uploaded image archive (an OCI layout or docker save
// tarball, uploaded in chunks like a context): uncompressed layers, so
// larger than a context.
const (
	MaxArchiveBytes  = 8 << 30
	maxArchiveChunks = MaxArchiveBytes/MaxChunkBytes + 1
)

// archiveBounds names what a chunked archive is checked against.
type archiveBounds struct {
	field     string // the request field, for errors
	maxBytes  int64
	maxChunks int
}

var (
	contextBounds = archiveBounds{"context.archive", MaxContextBytes, maxChunks}
	imageBounds   = archiveBounds{"archive", MaxArchiveBytes, maxArchiveChunks}
)
