package images

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"time"

	"github.com/emberbox/emberbox/internal/errdefs"
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

// chunkStore keeps uploaded context chunks by their sha256: <dir>/<hex>.
type chunkStore struct{ dir string }

// Missing returns the digests among these that are not stored.
func (s *Service) Missing(digests []string) ([]string, error) {
	if len(digests) > maxArchiveChunks {
		return nil, invalidField("digests", "at most %d", maxArchiveChunks)
	}
	missing := []string{}
	for i, d := range digests {
		if !hexRE.MatchString(d) {
			return nil, invalidField(fmt.Sprintf("digests[%d]", i), "must be 64 lowercase hex digits")
		}
		// A chunk the client will not send again is kept a while longer.
		now := time.Now()
		if err := os.Chtimes(filepath.Join(s.chunks.dir, d), now, now); err != nil {
			missing = append(missing, d)
		}
	}
	return missing, nil
}

// PutChunk stores a chunk whose sha256 is digest, reading at most
// MaxChunkBytes from r.
func (s *Service) PutChunk(digest string, r io.Reader) error {
	if !hexRE.MatchString(digest) {
		return invalidField("digest", "must be 64 lowercase hex digits")
	}
	tmp, err := os.CreateTemp(s.chunks.dir, ".put-*")
	if err != nil {
		return fmt.Errorf("storing a context chunk: %w", err)
	}
	defer os.Remove(tmp.Name())
	defer tmp.Close()
	h := sha256.New()
	n, err := io.Copy(io.MultiWriter(tmp, h), io.LimitReader(r, MaxChunkBytes+1))
	if err != nil {
		return fmt.Errorf("storing a context chunk: %w", err)
	}
	if n > MaxChunkBytes {
		return errdefs.New(errdefs.ErrInvalidArgument, "too_large", "A context chunk is at most %d bytes.", MaxChunkBytes)
	}
	if n == 0 {
		return invalidField("body", "a chunk has at least one byte")
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != digest {
		return errdefs.New(errdefs.ErrInvalidArgument, "digest_mismatch", "The chunk's sha256 is %s, not %s.", got, digest)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("storing a context chunk: %w", err)
	}
	// A chunk uploaded again replaces itself: its time is renewed.
	return os.Rename(tmp.Name(), filepath.Join(s.chunks.dir, digest))
}

// ChunkTTL is how long an uploaded context chunk is kept after its last
// upload: long enough for the build that names it to start.
const ChunkTTL = 24 * time.Hour

// sweep removes chunks last written before cutoff, and what an upload cut
// short left.
func (c chunkStore) sweep(cutoff time.Time) (int, error) {
	entries, err := os.ReadDir(c.dir)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, e := range entries {
		fi, err := e.Info()
		if err != nil || !fi.Mode().IsRegular() || !fi.ModTime().Before(cutoff) {
			continue
		}
		if os.Remove(filepath.Join(c.dir, e.Name())) == nil {
			n++
		}
	}
	return n, nil
}

// check says whether an archive's chunks are all here and within bounds.
func (c chunkStore) check(a ContextArchive, b archiveBounds) error {
	if !hexRE.MatchString(a.SHA256) {
		return invalidField(b.field+".sha256", "must be 64 lowercase hex digits")
	}
	if a.Size <= 0 || a.Size > b.maxBytes {
		return invalidField(b.field+".size", "must be from 1 to %d bytes", b.maxBytes)
	}
	if len(a.Chunks) == 0 || len(a.Chunks) > b.maxChunks {
		return invalidField(b.field+".chunks", "must list 1 to %d chunks", b.maxChunks)
	}
	for i, d := range a.Chunks {
		if !hexRE.MatchString(d) {
			return invalidField(fmt.Sprintf("%s.chunks[%d]", b.field, i), "must be 64 lowercase hex digits")
		}
		if _, err := os.Stat(filepath.Join(c.dir, d)); err != nil {
			return errdefs.New(errdefs.ErrInvalidArgument, "context_missing", "Chunk %s of the context was not uploaded.", d).
				WithHint("Upload it with PUT /v1/images/context/{digest}, or use images.upload_context.")
		}
	}
	return nil
}

// assemble writes an archive's chunks, in order, to dst and checks its
// size and sha256.
func (c chunkStore) assemble(a ContextArchive, b archiveBounds, dst string) error {
	if err := c.check(a, b); err != nil {
		return err
	}
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	defer out.Close()
	h := sha256.New()
	var total int64
	for _, d := range a.Chunks {
		f, err := os.Open(filepath.Join(c.dir, d))
		if err != nil {
			return fmt.Errorf("context chunk %s: %w", d, err)
		}
		n, err := io.Copy(io.MultiWriter(out, h), io.LimitReader(f, MaxChunkBytes+1))
		f.Close()
		if err != nil {
			return err
		}
		if total += n; total > b.maxBytes {
			return fmt.Errorf("%s is larger than %d MiB", b.field, b.maxBytes>>20)
		}
	}
	if total != a.Size || hex.EncodeToString(h.Sum(nil)) != a.SHA256 {
		return fmt.Errorf("the context's chunks make %d bytes with another sha256 than its archive (%d bytes)", total, a.Size)
	}
	return out.Close()
}
