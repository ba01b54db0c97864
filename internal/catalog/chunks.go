package catalog

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/emberbox/emberbox/internal/errdefs"
	"github.com/emberbox/emberbox/internal/upload"
)

// ChunkLimits bound the context chunks (of build contexts and uploaded
// image archives) the server keeps: per key, and the free space they must
// leave on the data dir's file system, where the database lives too.
type ChunkLimits struct {
	BytesPerKey int64 // default DefaultChunkBytesPerKey
	PerKey      int   // chunks; default DefaultChunksPerKey
	// FreeReserve is left free: a chunk that would eat into it is
	// refused (default upload.DefaultFreeReserve, as upload staging).
	FreeReserve int64
	// FreeSpace returns the bytes available in dir; nil asks the file
	// system (upload.FreeSpace).
	FreeSpace func(dir string) (int64, error)
}

// Defaults of ChunkLimits: room for the largest archive (MaxArchiveBytes
// in maxArchiveChunks) and some contexts besides.
const (
	DefaultChunkBytesPerKey = int64(10) << 30
	DefaultChunksPerKey     = 10_000
)

// ChunkTTL is how long an uploaded context chunk is kept after its last
// upload or check: long enough for the build that names it to start.
const ChunkTTL = 24 * time.Hour

// Codes of chunk refusals.
const (
	CodeChunkQuota  = "quota_exceeded" // 429: the key keeps its most chunks or bytes
	CodeStorageFull = "storage_full"   // 409: the data dir's file system is at its reserve
)

func (l ChunkLimits) withDefaults() ChunkLimits {
	if l.BytesPerKey <= 0 {
		l.BytesPerKey = DefaultChunkBytesPerKey
	}
	if l.PerKey <= 0 {
		l.PerKey = DefaultChunksPerKey
	}
	if l.FreeReserve <= 0 {
		l.FreeReserve = upload.DefaultFreeReserve
	}
	if l.FreeSpace == nil {
		l.FreeSpace = upload.FreeSpace
	}
	return l
}

// chunkStore keeps uploaded context chunks per owner, by their sha256:
// <dir>/<owner's directory>/<hex>. A key reads, checks and builds from
// its own chunks only, so asking which chunks exist tells nothing of what
// another key uploaded.
type chunkStore struct {
	dir string
	lim ChunkLimits

	mu    sync.Mutex
	usage map[string]*chunkUsage // by owner directory; read from disk at first use
}

type chunkUsage struct {
	count int
	bytes int64
}

func newChunkStore(dir string, lim ChunkLimits) *chunkStore {
	return &chunkStore{dir: dir, lim: lim.withDefaults(), usage: map[string]*chunkUsage{}}
}

// ownerDir is owner's directory: a hash of its id, so any id is one plain
// name.
func (c *chunkStore) ownerDir(owner string) string {
	sum := sha256.Sum256([]byte("emberbox context chunks\n" + owner))
	return filepath.Join(c.dir, hex.EncodeToString(sum[:16]))
}

func (c *chunkStore) path(owner, digest string) string {
	return filepath.Join(c.ownerDir(owner), digest)
}

// usageLocked returns what owner keeps, reading its directory the first
// time.
func (c *chunkStore) usageLocked(owner string) (*chunkUsage, error) {
	dir := c.ownerDir(owner)
	if u, ok := c.usage[dir]; ok {
		return u, nil
	}
	entries, err := os.ReadDir(dir)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("reading the context chunks: %w", err)
	}
	u := &chunkUsage{}
	for _, e := range entries {
		fi, err := e.Info()
		if err != nil || !fi.Mode().IsRegular() || !hexRE.MatchString(e.Name()) {
			continue // an upload under way, or cut short
		}
		u.count++
		u.bytes += fi.Size()
	}
	c.usage[dir] = u
	return u, nil
}

// Missing returns the digests among these that owner has not stored.
func (s *Service) Missing(owner string, digests []string) ([]string, error) {
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
		if err := os.Chtimes(s.chunks.path(owner, d), now, now); err != nil {
			missing = append(missing, d)
		}
	}
	return missing, nil
}

// PutChunk stores owner's chunk whose sha256 is digest, reading at most
// MaxChunkBytes from r; the bytes are hashed here, whatever digest says.
func (s *Service) PutChunk(owner, digest string, r io.Reader) error {
	if !hexRE.MatchString(digest) {
		return invalidField("digest", "must be 64 lowercase hex digits")
	}
	c := s.chunks
	if err := c.checkReserve(MaxChunkBytes); err != nil {
		return err
	}
	dir := c.ownerDir(owner)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("storing a context chunk: %w", err)
	}
	tmp, err := os.CreateTemp(dir, ".put-*")
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
	return c.commit(owner, digest, tmp.Name(), n)
}

// checkReserve refuses a write of n bytes that would leave less than the
// reserve free on the chunks' file system.
func (c *chunkStore) checkReserve(n int64) error {
	avail, err := c.lim.FreeSpace(c.dir)
	if err != nil {
		return fmt.Errorf("context chunks: free space: %w", err)
	}
	if avail-n < c.lim.FreeReserve {
		e := errdefs.New(errdefs.ErrConflict, CodeStorageFull,
			"The server's data disk is nearly full: it stores no more context chunks now.").
			WithHint("Retry later; the operator keeps --image-context-reserve-mib free for the server's own data.")
		e.RetryAfter = time.Minute
		return e
	}
	return nil
}

// commit moves a chunk of n bytes, uploaded to tmp, into owner's place
// for digest, within owner's quotas. A chunk uploaded again replaces
// itself (its time is renewed) and counts once.
func (c *chunkStore) commit(owner, digest, tmp string, n int64) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	u, err := c.usageLocked(owner)
	if err != nil {
		return err
	}
	dst := c.path(owner, digest)
	count, old := u.count+1, int64(0)
	if fi, err := os.Stat(dst); err == nil {
		count, old = u.count, fi.Size()
	}
	switch {
	case count > c.lim.PerKey:
		return errChunkQuota("This key keeps %d context chunks, the most allowed.", c.lim.PerKey)
	case u.bytes-old+n > c.lim.BytesPerKey:
		return errChunkQuota("This key's context chunks would take more than %d MiB, the most allowed.", c.lim.BytesPerKey>>20)
	}
	if err := os.Rename(tmp, dst); err != nil {
		return fmt.Errorf("storing a context chunk: %w", err)
	}
	u.count, u.bytes = count, u.bytes-old+n
	return nil
}

func errChunkQuota(format string, args ...any) error {
	return errdefs.New(errdefs.ErrConflict, CodeChunkQuota, format, args...).
		WithHint("Build from the chunks uploaded (a chunk is removed 24 hours after its last upload or check), or ask the operator to raise --image-context-quota-mib or --image-context-quota-chunks.")
}

// sweep removes chunks last written or checked before cutoff, what an
// upload cut short left, and the chunks of the shared layout of earlier
// versions (never read now).
func (c *chunkStore) sweep(cutoff time.Time) (int, error) {
	entries, err := os.ReadDir(c.dir)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, e := range entries {
		p := filepath.Join(c.dir, e.Name())
		if e.IsDir() {
			n += c.sweepOwner(p, cutoff)
			continue
		}
		if fi, err := e.Info(); err == nil && fi.Mode().IsRegular() && fi.ModTime().Before(cutoff) && os.Remove(p) == nil {
			n++
		}
	}
	return n, nil
}

// sweepOwner sweeps one owner's directory; its usage is read again at its
// next use.
func (c *chunkStore) sweepOwner(dir string, cutoff time.Time) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.usage, dir)
	entries, err := os.ReadDir(dir)
	if err != nil {
		return 0
	}
	n := 0
	for _, e := range entries {
		fi, err := e.Info()
		if err != nil || !fi.Mode().IsRegular() || !fi.ModTime().Before(cutoff) {
			continue
		}
		if os.Remove(filepath.Join(dir, e.Name())) == nil {
			n++
		}
	}
	return n
}

// check says whether an archive's chunks are all owner's and within
// bounds.
func (c *chunkStore) check(owner string, a ContextArchive, b archiveBounds) error {
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
		if _, err := os.Stat(c.path(owner, d)); err != nil {
			return errdefs.New(errdefs.ErrInvalidArgument, "context_missing", "Chunk %s of the context was not uploaded.", d).
				WithHint("Upload it with PUT /v1/images/context/{digest}, or use images.upload_context.")
		}
	}
	return nil
}

// assemble writes owner's chunks of an archive, in order, to dst and
// checks its size and sha256.
func (c *chunkStore) assemble(owner string, a ContextArchive, b archiveBounds, dst string) error {
	if err := c.check(owner, a, b); err != nil {
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
		f, err := os.Open(c.path(owner, d))
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
