// Package upload stages chunked uploads on the host. Each upload has a sparse
// staging file that chunks are written into at their offsets, so they may come
// in any order, in parallel and more than once, and nothing but one chunk is
// ever held in memory. A commit checks that every chunk came and that the
// SHA-256 matches, then streams the staged bytes to a writer the caller gives
// (the sandbox's guest).
//
// An open-ended upload (Spec.Open: a directory archive, whose length its sender
// may not know ahead) takes its chunks in sequence instead, has no SHA-256, and
// its length is what arrived when it is committed; it counts against the byte
// bounds as it grows, up to MaxSize.
//
// An upload belongs to the owner (API key) that began it and to one sandbox,
// ends after TTL without a call and MaxAge after it began, and an owner may
// have MaxPerOwner open at once. The sizes of open uploads are bounded per
// owner and in all, and a begin never eats into a reserve of free space on the
// staging file system. Errors are errdefs.CodedError with the codes the API
// answers.
//
// `New` removes the `upl_*.part` files no upload owns, left by a crash; `Sweep`
// (which `Run` calls every minute) ends uploads past their TTL or `MaxAge`.
// Uploads of the two kinds are never found through each other's calls.
package upload

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/emberbox/emberbox/internal/errdefs"
)

// Limits of uploads.
const (
	ChunkSize   = 1 << 20 // every chunk but the last is exactly this long
	MaxSize     = 4 << 30
	MaxPerOwner = 16
	TTL         = time.Hour // an upload ends this long after its last call
	MaxPathLen  = 4096
	MaxUserLen  = 64

	// Defaults of Config's bounds.
	DefaultMaxBytes         = 16 << 30 // staged by all owners together
	DefaultMaxBytesPerOwner = 8 << 30  // staged by one owner
	DefaultFreeReserve      = 2 << 30  // left free on the staging file system
	DefaultMaxAge           = 6 * time.Hour

	// sweepEvery is how often Run sweeps.
	sweepEvery = time.Minute
	// Staging files are <Dir>/upl_<hex>.part; the id is the name's stem.
	filePrefix = "upl_"
	fileSuffix = ".part"
)

// Config configures a Store. Zero bounds take their defaults.
type Config struct {
	Dir    string           // staging directory, created 0700 if missing; required
	Logger *slog.Logger     // nil discards
	Now    func() time.Time // nil: time.Now

	// MaxBytes bounds the sizes of all open uploads together, and
	// MaxBytesPerOwner those of one owner: staging files are sparse, but
	// each will grow to its size.
	MaxBytes         int64
	MaxBytesPerOwner int64
	// FreeReserve is left free on the staging file system: a begin is
	// refused if its size and what open uploads still have to write would
	// eat into it, a chunk if the free space is below half of it.
	FreeReserve int64
	// MaxAge ends an upload this long after it began, however busy.
	MaxAge time.Duration
	// FreeSpace returns the bytes available to the server in dir; nil
	// asks the file system (statfs).
	FreeSpace func(dir string) (int64, error)
}

// Spec describes the file an upload writes when committed.
type Spec struct {
	Owner     string
	SandboxID string
	Path      string // where the writer puts the file
	Size      int64  // 0 to MaxSize
	SHA256    string // hex, either case
	Mode      uint32 // permission bits (at most 07777) for the writer; 0: its default
	// Open makes an open-ended upload: Size and SHA256 are left empty.
	Open bool
	User string // for the writer, at most MaxUserLen bytes
}

// Upload describes an upload that began.
type Upload struct {
	ID        string
	Path      string
	Size      int64
	SHA256    string // lower-case hex
	Mode      uint32
	Open      bool
	User      string
	Chunks    int // 0 for an open-ended upload
	ExpiresAt time.Time
}

// Progress is the state of an upload after a chunk.
type Progress struct {
	ID             string
	Offset         int64
	Bytes          int
	ChunksReceived int
	Chunks         int   // of an open-ended upload: those received
	Received       int64 // bytes of an open-ended upload so far
}

// WriteFunc writes exactly size bytes from r to path with mode and
// describes the written file. Commit calls it with the staged bytes.
type WriteFunc[E any] func(ctx context.Context, path string, mode uint32, size int64, r io.Reader) (E, error)

// OpenWriteFunc writes exactly u.Size bytes from r where u says (an
// open-ended upload's user and path) and describes what it wrote.
type OpenWriteFunc[E any] func(ctx context.Context, u *Upload, r io.Reader) (E, error)

type state int

const (
	creating   state = iota // its staging file is being made
	open                    // takes chunks
	committing              // being checked and written; no chunk, abort or second commit
	committed               // done; kept until it expires so a repeated commit answers again
)

type upload[E any] struct {
	id        string
	owner     string
	sandboxID string
	path      string
	size      int64
	sha256    string
	mode      uint32
	openEnded bool
	user      string
	name      string // staging file

	// Guarded by Store.mu.
	state    state
	began    time.Time
	have     []bool // chunk i arrived; unused when open
	received int
	lastOff  int64 // offset of the last chunk of an open upload; -1 before one
	writing  int   // chunk writes in flight
	lastUsed time.Time
	file     *os.File // nil once committed or discarded
	entry    E        // once committed
}

// expired reports whether u ended for lack of calls. An upload with work
// in flight never does.
func (u *upload[E]) expired(now time.Time, maxAge time.Duration) bool {
	return u.state != creating && u.state != committing && u.writing == 0 &&
		(now.Sub(u.lastUsed) >= TTL || now.Sub(u.began) >= maxAge)
}

// staged reports whether u holds (or will hold) staging bytes.
func (u *upload[E]) staged() bool { return u.state != committed }

// unwritten is an estimate of the bytes u's staging file has yet to take.
func (u *upload[E]) unwritten() int64 {
	if u.openEnded { // its size is what it has written
		return 0
	}
	return max(0, u.size-int64(u.received)*ChunkSize)
}

// Store keeps the uploads of one server. E is what the commit's writer
// returns, kept to answer a repeated commit. It is safe for concurrent use.
type Store[E any] struct {
	dir string
	log *slog.Logger
	now func() time.Time
	cfg Config

	mu   sync.Mutex
	cond *sync.Cond // signalled when a chunk write ends
	byID map[string]*upload[E]
}

// New returns a store staging in cfg.Dir. Staging files there belong to no
// upload yet (a previous run left them), so it removes them.
func New[E any](cfg Config) (*Store[E], error) {
	if cfg.Dir == "" {
		return nil, errors.New("upload: no staging directory")
	}
	if cfg.MaxBytes == 0 {
		cfg.MaxBytes = DefaultMaxBytes
	}
	if cfg.MaxBytesPerOwner == 0 {
		cfg.MaxBytesPerOwner = DefaultMaxBytesPerOwner
	}
	if cfg.FreeReserve == 0 {
		cfg.FreeReserve = DefaultFreeReserve
	}
	if cfg.MaxAge == 0 {
		cfg.MaxAge = DefaultMaxAge
	}
	if cfg.FreeSpace == nil {
		cfg.FreeSpace = FreeSpace
	}
	s := &Store[E]{dir: cfg.Dir, log: cfg.Logger, now: cfg.Now, cfg: cfg, byID: map[string]*upload[E]{}}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	if s.now == nil {
		s.now = time.Now
	}
	s.cond = sync.NewCond(&s.mu)
	if err := os.MkdirAll(s.dir, 0o700); err != nil {
		return nil, fmt.Errorf("creating the upload staging directory: %w", err)
	}
	if err := s.sweepOrphans(); err != nil {
		return nil, err
	}
	return s, nil
}

// Run sweeps every minute until ctx ends.
func (s *Store[E]) Run(ctx context.Context) {
	t := time.NewTicker(sweepEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			s.Sweep()
		}
	}
}

// Sweep ends the uploads idle for TTL and removes staging files that
// belong to no upload.
func (s *Store[E]) Sweep() {
	s.sweepExpired()
	if err := s.sweepOrphans(); err != nil {
		s.log.Warn("sweeping upload staging files", "err", err)
	}
}

// sweepExpired drops the uploads idle for TTL, with their staging files.
// Every call runs it first, so an owner's count and the disk stay current
// without Run.
func (s *Store[E]) sweepExpired() {
	now := s.now()
	var dead []*os.File
	var names []string
	s.mu.Lock()
	for id, u := range s.byID {
		if u.expired(now, s.cfg.MaxAge) {
			delete(s.byID, id)
			f, name := u.detachLocked()
			dead, names = append(dead, f), append(names, name)
		}
	}
	s.mu.Unlock()
	for i := range dead {
		s.removeStaging(dead[i], names[i])
	}
}

// sweepOrphans removes the staging files in the directory that no upload
// owns. A new upload is registered, with its file's name, before the file
// is made, so a file being made is never taken for an orphan.
func (s *Store[E]) sweepOrphans() error {
	ents, err := os.ReadDir(s.dir)
	if err != nil {
		return fmt.Errorf("reading the upload staging directory: %w", err)
	}
	for _, e := range ents {
		name := e.Name()
		if !strings.HasPrefix(name, filePrefix) || !strings.HasSuffix(name, fileSuffix) || !e.Type().IsRegular() {
			continue
		}
		p := filepath.Join(s.dir, name)
		s.mu.Lock()
		u := s.byID[strings.TrimSuffix(name, fileSuffix)]
		owned := u != nil && u.name == p
		s.mu.Unlock()
		if owned {
			continue
		}
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			s.log.Warn("removing an orphaned upload staging file", "file", p, "err", err)
		} else if err == nil {
			s.log.Info("removed an orphaned upload staging file", "file", p)
		}
	}
	return nil
}

// detachLocked takes u's staging file away from it, for removeStaging.
func (u *upload[E]) detachLocked() (*os.File, string) {
	f, name := u.file, u.name
	u.file, u.name = nil, ""
	return f, name
}

// removeStaging closes and removes a detached staging file.
func (s *Store[E]) removeStaging(f *os.File, name string) {
	if f != nil {
		_ = f.Close()
	}
	if name == "" {
		return
	}
	if err := os.Remove(name); err != nil && !errors.Is(err, os.ErrNotExist) {
		s.log.Warn("removing an upload staging file", "file", name, "err", err)
	}
}

// Begin starts an upload of spec and makes its staging file.
func (s *Store[E]) Begin(spec Spec) (*Upload, error) {
	sum := strings.ToLower(spec.SHA256)
	if err := checkSpec(spec, sum); err != nil {
		return nil, err
	}
	s.sweepExpired()
	now := s.now()
	id := newID()
	u := &upload[E]{
		id: id, owner: spec.Owner, sandboxID: spec.SandboxID, path: spec.Path,
		size: spec.Size, sha256: sum, mode: spec.Mode, openEnded: spec.Open, user: spec.User, lastOff: -1,
		name:  filepath.Join(s.dir, id+fileSuffix),
		state: creating, began: now, have: make([]bool, chunks(spec.Size)), lastUsed: now,
	}
	if spec.Size > s.cfg.MaxBytesPerOwner || spec.Size > s.cfg.MaxBytes {
		return nil, errTooLarge(spec.Size, min(s.cfg.MaxBytesPerOwner, s.cfg.MaxBytes))
	}
	avail, err := s.cfg.FreeSpace(s.dir)
	if err != nil {
		return nil, fmt.Errorf("staging upload: free space: %w: %w", err, errdefs.ErrInternal)
	}
	// Take the slot before touching the disk, so that a burst of begins
	// cannot go past the limits.
	s.mu.Lock()
	n := 0
	var owned, all, pending int64
	for _, o := range s.byID {
		if !o.staged() {
			continue
		}
		all += o.size
		pending += o.unwritten()
		if o.owner == spec.Owner {
			n++
			owned += o.size
		}
	}
	switch {
	case n >= MaxPerOwner:
		s.mu.Unlock()
		return nil, errTooMany()
	case owned+spec.Size > s.cfg.MaxBytesPerOwner:
		s.mu.Unlock()
		return nil, errOwnerBytes(s.cfg.MaxBytesPerOwner)
	case all+spec.Size > s.cfg.MaxBytes || avail-pending-spec.Size < s.cfg.FreeReserve:
		s.mu.Unlock()
		return nil, errStagingFull()
	}
	s.byID[id] = u
	s.mu.Unlock()

	f, err := createStaging(s.dir, u.name, u.size)
	s.mu.Lock()
	defer s.mu.Unlock()
	if err != nil {
		delete(s.byID, id)
		return nil, fmt.Errorf("staging upload: %w: %w", err, errdefs.ErrInternal)
	}
	u.file, u.state = f, open
	return &Upload{ID: id, Path: u.path, Size: u.size, SHA256: sum, Mode: u.mode, Open: u.openEnded, User: u.user,
		Chunks: len(u.have), ExpiresAt: now.Add(min(TTL, s.cfg.MaxAge))}, nil
}

func checkSpec(spec Spec, sum string) error {
	var issues []Issue
	switch {
	case spec.Path == "":
		issues = append(issues, Issue{"path", "is required"})
	case len(spec.Path) > MaxPathLen:
		issues = append(issues, Issue{"path", fmt.Sprintf("must be at most %d bytes", MaxPathLen)})
	case strings.IndexByte(spec.Path, 0) >= 0:
		issues = append(issues, Issue{"path", "must not contain NUL"})
	}
	switch {
	case spec.Open && (spec.Size != 0 || sum != ""):
		issues = append(issues, Issue{"", "an open-ended upload has no size or sha256 ahead"})
	case spec.Open:
	case spec.Size < 0 || spec.Size > MaxSize:
		issues = append(issues, Issue{"size", fmt.Sprintf("must be from 0 to %d", int64(MaxSize))})
	case !ValidSHA256(sum):
		issues = append(issues, Issue{"sha256", "must be 64 hexadecimal characters"})
	}
	if len(spec.User) > MaxUserLen {
		issues = append(issues, Issue{"user", fmt.Sprintf("must be at most %d bytes", MaxUserLen)})
	}
	if spec.Mode > 0o7777 {
		issues = append(issues, Issue{"mode", "must be permission bits, at most 7777 (octal)"})
	}
	if spec.Owner == "" || spec.SandboxID == "" {
		issues = append(issues, Issue{"", "an upload needs an owner and a sandbox"})
	}
	if len(issues) > 0 {
		return invalid(issues...)
	}
	return nil
}

// ValidSHA256 reports whether s is a SHA-256 in hex.
func ValidSHA256(s string) bool {
	if len(s) != 2*sha256.Size {
		return false
	}
	_, err := hex.DecodeString(s)
	return err == nil
}

func chunks(size int64) int { return int((size + ChunkSize - 1) / ChunkSize) }

func newID() string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return filePrefix + hex.EncodeToString(b[:])
}

// createStaging makes the sparse staging file of an upload.
func createStaging(dir, name string, size int64) (*os.File, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil { // removed since New, say
		return nil, err
	}
	f, err := os.OpenFile(name, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, err
	}
	if err := f.Truncate(size); err != nil {
		_ = f.Close()
		_ = os.Remove(name)
		return nil, err
	}
	return f, nil
}

// lookupLocked returns upload id of owner in sandboxID. An expired upload
// is not found even before a sweep removes it.
// An upload of the other kind (open-ended or not) is not found either.
func (s *Store[E]) lookupLocked(owner, sandboxID, id string, openEnded bool) (*upload[E], error) {
	u := s.byID[id]
	if u == nil || u.owner != owner || u.sandboxID != sandboxID || u.openEnded != openEnded || u.state == creating ||
		u.expired(s.now(), s.cfg.MaxAge) {
		return nil, errNotFound(id)
	}
	return u, nil
}

// usableLocked returns upload id if it takes chunks, aborts and commits.
func (s *Store[E]) usableLocked(owner, sandboxID, id string, openEnded bool) (*upload[E], error) {
	u, err := s.lookupLocked(owner, sandboxID, id, openEnded)
	if err != nil {
		return nil, err
	}
	switch u.state {
	case committing:
		return nil, errCommitting(id)
	case committed:
		return nil, errCommitted(id)
	}
	return u, nil
}

// Put writes the chunk at off. Every chunk but the last is ChunkSize bytes;
// a chunk may be written again (a retry), the last write wins.
func (s *Store[E]) Put(owner, sandboxID, id string, off int64, data []byte) (*Progress, error) {
	s.sweepExpired()
	s.mu.Lock()
	u, err := s.usableLocked(owner, sandboxID, id, false)
	if err != nil {
		s.mu.Unlock()
		return nil, err
	}
	if err := checkChunk(u.size, off, len(data)); err != nil {
		s.mu.Unlock()
		return nil, err
	}
	// Begin counted on this space; if something else took it since, the
	// host's disk comes first.
	if avail, err := s.cfg.FreeSpace(s.dir); err == nil && avail-int64(len(data)) < s.cfg.FreeReserve/2 {
		s.mu.Unlock()
		return nil, errStagingFull()
	}
	u.writing++
	u.lastUsed = s.now()
	f := u.file
	s.mu.Unlock()

	_, werr := f.WriteAt(data, off)

	s.mu.Lock()
	defer s.mu.Unlock()
	u.writing--
	s.cond.Broadcast()
	u.lastUsed = s.now()
	if werr != nil {
		return nil, fmt.Errorf("staging chunk: %w: %w", werr, errdefs.ErrInternal)
	}
	if i := off / ChunkSize; !u.have[i] {
		u.have[i] = true
		u.received++
	}
	return &Progress{ID: id, Offset: off, Bytes: len(data), ChunksReceived: u.received, Chunks: len(u.have)}, nil
}

func checkChunk(size, off int64, n int) error {
	if off < 0 || off%ChunkSize != 0 || off >= size {
		msg := fmt.Sprintf("must be a multiple of %d below the size, %d", ChunkSize, size)
		if size == 0 {
			msg = "must not be given: an empty upload has no chunks"
		}
		return invalid(Issue{"offset", msg})
	}
	if want := min(ChunkSize, size-off); int64(n) != want {
		return invalid(Issue{"body", fmt.Sprintf("must be exactly %d bytes for the chunk at offset %d, not %d", want, off, n)})
	}
	return nil
}

// Commit checks that every chunk arrived and the bytes match the SHA-256,
// then streams them to write and ends the upload. A repeated commit answers
// what the first one wrote. If a check or write fails the upload stays
// open, to be completed and committed again.
func (s *Store[E]) Commit(ctx context.Context, owner, sandboxID, id string, write WriteFunc[E]) (E, error) {
	return s.commit(ctx, owner, sandboxID, id, false, func(ctx context.Context, u *Upload, r io.Reader) (E, error) {
		return write(ctx, u.Path, u.Mode, u.Size, r)
	})
}

func (s *Store[E]) commit(ctx context.Context, owner, sandboxID, id string, openEnded bool, write OpenWriteFunc[E]) (E, error) {
	var zero E
	s.sweepExpired()
	s.mu.Lock()
	u, err := s.lookupLocked(owner, sandboxID, id, openEnded)
	if err != nil {
		s.mu.Unlock()
		return zero, err
	}
	switch u.state {
	case committing:
		s.mu.Unlock()
		return zero, errCommitting(id)
	case committed:
		u.lastUsed = s.now()
		s.mu.Unlock()
		return u.entry, nil
	}
	u.state = committing
	for u.writing > 0 { // a chunk still being written counts once it lands
		s.cond.Wait()
	}
	var missing []int64
	for i, ok := range u.have { // empty when open
		if !ok {
			missing = append(missing, int64(i)*ChunkSize)
		}
	}
	if len(missing) > 0 {
		u.state, u.lastUsed = open, s.now()
		s.mu.Unlock()
		return zero, errIncomplete(missing, len(u.have))
	}
	f, size := u.file, u.size
	s.mu.Unlock()

	reopen := func() {
		s.mu.Lock()
		u.state, u.lastUsed = open, s.now()
		s.mu.Unlock()
	}
	if !openEnded {
		h := sha256.New()
		if _, err := io.Copy(h, ctxReader{ctx, io.NewSectionReader(f, 0, size)}); err != nil {
			reopen()
			if ctx.Err() != nil {
				return zero, ctx.Err()
			}
			return zero, fmt.Errorf("hashing upload: %w: %w", err, errdefs.ErrInternal)
		}
		if got := hex.EncodeToString(h.Sum(nil)); got != u.sha256 {
			reopen()
			return zero, errChecksum(u.sha256, got)
		}
	}
	info := &Upload{ID: u.id, Path: u.path, Size: size, SHA256: u.sha256, Mode: u.mode, Open: u.openEnded, User: u.user}
	entry, err := write(ctx, info, io.NewSectionReader(f, 0, size))
	if err != nil {
		reopen()
		return zero, err
	}
	s.mu.Lock()
	u.state, u.entry, u.lastUsed = committed, entry, s.now()
	sf, name := u.detachLocked() // the record stays, without its file, until it expires
	s.mu.Unlock()
	s.removeStaging(sf, name)
	return entry, nil
}

// Abort ends an open upload and removes its staging file.
func (s *Store[E]) Abort(owner, sandboxID, id string) error {
	return s.abort(owner, sandboxID, id, false)
}

// AbortOpen ends an open-ended upload and removes its staging file.
func (s *Store[E]) AbortOpen(owner, sandboxID, id string) error {
	return s.abort(owner, sandboxID, id, true)
}

func (s *Store[E]) abort(owner, sandboxID, id string, openEnded bool) error {
	s.sweepExpired()
	s.mu.Lock()
	u, err := s.usableLocked(owner, sandboxID, id, openEnded)
	if err != nil {
		s.mu.Unlock()
		return err
	}
	delete(s.byID, id)
	for u.writing > 0 { // let chunk writes in flight end before the file closes
		s.cond.Wait()
	}
	f, name := u.detachLocked()
	s.mu.Unlock()
	s.removeStaging(f, name)
	return nil
}

// ctxReader fails reads once ctx ends, so hashing a large upload stops
// when its caller goes away.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (r ctxReader) Read(p []byte) (int, error) {
	if err := r.ctx.Err(); err != nil {
		return 0, err
	}
	return r.r.Read(p)
}
