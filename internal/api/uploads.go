package api

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/emberbox/emberbox/internal/errdefs"
	"github.com/emberbox/emberbox/internal/sandbox"
)

// Chunked uploads: files over 1 MiB, which the files content PUT refuses.
//
//	POST …/uploads                      {path, size, sha256, mode?} → {uploadId, chunkBytes, …}
//	PUT  …/uploads/{uploadId}?offset=N  raw chunk bytes
//	POST …/uploads/{uploadId}:commit    {} → the file's entry
//	POST …/uploads/{uploadId}:abort     {} → {aborted: true}
//
// Chunks are staged on the host in a sparse file (WriteAt at their offset),
// so they may come in any order, in parallel and more than once; nothing
// but one chunk (the request body, at most 1 MiB) is ever held in memory.
// The commit checks that every chunk came and that the SHA-256 matches,
// then streams the staged file into the guest with Manager.WriteFile.
//
// An upload belongs to the key that began it (other keys get 404), ends
// after uploadTTL without a request, and each key may have
// maxUploadsPerKey open at once. Expired uploads are swept lazily on every
// upload request, so no goroutine outlives the server.
const (
	uploadChunkBytes = 1 << 20
	maxUploadSize    = 4 << 30
	maxUploadsPerKey = 16
	uploadTTL        = time.Hour
	uploadRoot       = "/workspace"
	chmodTimeoutMs   = 10_000
	uploadFilePrefix = "upl_"
	uploadFileSuffix = ".part"
)

type uploadState int

const (
	uploadOpen       uploadState = iota
	uploadCommitting             // streaming into the guest; no chunk, abort or second commit
	uploadCommitted              // done; kept until it expires so a repeated commit answers again
)

type upload struct {
	id, owner, sandboxID, path string
	size                       int64
	sha256                     string // lower-case hex
	mode                       uint32 // 0: the default (0644)
	modeSet                    bool

	// Guarded by uploadStore.mu.
	state    uploadState
	have     []bool // chunk i arrived
	received int
	writing  int // chunk writes in flight
	lastUsed time.Time
	entry    *sandbox.FileEntry // once committed
	file     *os.File           // nil once committed or removed
	name     string             // staging file
}

func (u *upload) chunks() int { return len(u.have) }

// uploadStore keeps the uploads of one server.
type uploadStore struct {
	dir string

	mu     sync.Mutex
	cond   *sync.Cond // signalled when a chunk write ends
	byID   map[string]*upload
	swept  bool // orphaned staging files of an earlier run removed
	logger *slog.Logger
}

func newUploadStore(dir string, log *slog.Logger) *uploadStore {
	if dir == "" {
		dir = filepath.Join(os.TempDir(), "emberbox-uploads")
	}
	st := &uploadStore{dir: dir, byID: map[string]*upload{}, logger: log}
	st.cond = sync.NewCond(&st.mu)
	return st
}

// sweepLocked drops uploads idle for longer than uploadTTL. The staging
// files are closed and removed by the caller, outside the lock.
func (st *uploadStore) sweepLocked(now time.Time) (dead []*upload) {
	for id, u := range st.byID {
		if u.state == uploadCommitting || u.writing > 0 || now.Sub(u.lastUsed) < uploadTTL {
			continue
		}
		delete(st.byID, id)
		dead = append(dead, u)
	}
	return dead
}

// discard closes and removes the staging files of uploads no longer in the
// store.
func (st *uploadStore) discard(us ...*upload) {
	for _, u := range us {
		if u.file != nil {
			_ = u.file.Close()
			u.file = nil
		}
		if u.name != "" {
			if err := os.Remove(u.name); err != nil && !errors.Is(err, os.ErrNotExist) {
				st.logger.Warn("removing upload staging file", "file", u.name, "err", err)
			}
			u.name = ""
		}
	}
}

// sweep removes expired uploads, and once per server the staging files an
// earlier run left behind (those not touched for uploadTTL).
func (st *uploadStore) sweep(now time.Time) {
	st.mu.Lock()
	dead := st.sweepLocked(now)
	orphans := !st.swept
	st.swept = true
	st.mu.Unlock()
	st.discard(dead...)
	if !orphans {
		return
	}
	ents, err := os.ReadDir(st.dir)
	if err != nil {
		return
	}
	for _, e := range ents {
		name := e.Name()
		if !e.Type().IsRegular() || !strings.HasPrefix(name, uploadFilePrefix) || !strings.HasSuffix(name, uploadFileSuffix) {
			continue
		}
		info, err := e.Info()
		if err != nil || now.Sub(info.ModTime()) < uploadTTL {
			continue
		}
		st.mu.Lock()
		_, live := st.byID[strings.TrimSuffix(name, uploadFileSuffix)]
		st.mu.Unlock()
		if !live {
			_ = os.Remove(filepath.Join(st.dir, name))
		}
	}
}

// lookup returns the upload id of owner in sandbox sbID, or upload_not_found.
// It must be called with st.mu held.
func (st *uploadStore) lookupLocked(owner, sbID, id string, now time.Time) (*upload, error) {
	u := st.byID[id]
	if u == nil || u.owner != owner || u.sandboxID != sbID ||
		(u.state != uploadCommitting && u.writing == 0 && now.Sub(u.lastUsed) >= uploadTTL) {
		return nil, errUploadNotFound(id)
	}
	return u, nil
}

func errUploadNotFound(id string) *apiError {
	return newError(http.StatusNotFound, "upload_not_found", fmt.Sprintf("No upload %s in this sandbox.", id)).
		withHint("Uploads end when committed or aborted and after an hour without a request; begin a new one with POST /v1/sandboxes/{id}/uploads.")
}

func errUploadCommitting(id string) *apiError {
	return newError(http.StatusConflict, "upload_committing", fmt.Sprintf("Upload %s is being committed.", id)).
		withHint("Wait for the commit to answer.")
}

func errUploadCommitted(id string) *apiError {
	return newError(http.StatusConflict, "upload_committed", fmt.Sprintf("Upload %s is already committed.", id)).
		withHint("Begin a new upload to write the file again.")
}

func newUploadID() string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return uploadFilePrefix + hex.EncodeToString(b[:])
}

// workspacePath resolves p (relative paths from /workspace) and checks it
// names something under /workspace.
func workspacePath(field, p string) (string, []issue) {
	if issues := pathIssue(field, p); issues != nil {
		return "", issues
	}
	if !path.IsAbs(p) {
		p = path.Join(uploadRoot, p)
	}
	clean := path.Clean(p)
	if !strings.HasPrefix(clean, uploadRoot+"/") {
		return "", []issue{{Path: field, Message: "must name a file under " + uploadRoot}}
	}
	return clean, nil
}

func validSHA256(s string) bool {
	if len(s) != 64 {
		return false
	}
	_, err := hex.DecodeString(s)
	return err == nil
}

type beginUploadRequest struct {
	Path   string  `json:"path"`
	Size   *int64  `json:"size"`
	SHA256 string  `json:"sha256"`
	Mode   *string `json:"mode"`
}

type beginUploadJSON struct {
	UploadID   string    `json:"uploadId"`
	ChunkBytes int64     `json:"chunkBytes"`
	Chunks     int       `json:"chunks"`
	Path       string    `json:"path"`
	Size       int64     `json:"size"`
	SHA256     string    `json:"sha256"`
	Mode       string    `json:"mode,omitempty"` // the mode the commit applies, when asked for
	ExpiresAt  *jsonTime `json:"expiresAt"`
}

func (s *server) beginUpload(w http.ResponseWriter, r *http.Request, c *call) error {
	var req beginUploadRequest
	if err := decode(c, &req); err != nil {
		return err
	}
	p, issues := workspacePath("path", req.Path)
	switch {
	case req.Size == nil:
		issues = append(issues, issue{Path: "size", Message: "is required"})
	case *req.Size < 0 || *req.Size > maxUploadSize:
		issues = append(issues, issue{Path: "size", Message: fmt.Sprintf("must be from 0 to %d", int64(maxUploadSize))})
	}
	sum := strings.ToLower(req.SHA256)
	if !validSHA256(sum) {
		issues = append(issues, issue{Path: "sha256", Message: "must be 64 hexadecimal characters"})
	}
	var mode uint32
	if req.Mode != nil {
		m, ok := parseMode(*req.Mode)
		if !ok {
			issues = append(issues, issue{Path: "mode", Message: `must be octal permission bits such as "644"`})
		}
		mode = m
	}
	if len(issues) > 0 {
		return invalid(sortIssues(issues))
	}
	sb, _, err := s.guest(r, c)
	if err != nil {
		return err
	}
	if disk := int64(sb.DiskMiB) << 20; sb.DiskMiB > 0 && *req.Size > disk {
		return invalid([]issue{{Path: "size", Message: fmt.Sprintf("is larger than the sandbox's disk (%d MiB)", sb.DiskMiB)}})
	}

	st := s.uploads
	now := s.now()
	st.sweep(now)
	n := int((*req.Size + uploadChunkBytes - 1) / uploadChunkBytes)
	u := &upload{id: newUploadID(), owner: c.owner, sandboxID: sb.ID, path: p, size: *req.Size, sha256: sum,
		mode: mode & 0o777, modeSet: req.Mode != nil, have: make([]bool, n), lastUsed: now}

	// Reserve the slot before touching the disk, so that a burst of begins
	// cannot go past the limit.
	st.mu.Lock()
	open := 0
	for _, o := range st.byID {
		if o.owner == c.owner && o.state != uploadCommitted {
			open++
		}
	}
	if open >= maxUploadsPerKey {
		st.mu.Unlock()
		e := newError(http.StatusTooManyRequests, "rate_limited",
			fmt.Sprintf("This key has %d uploads open, the most allowed.", maxUploadsPerKey)).
			withHint("Commit or abort an upload (POST …/uploads/{uploadId}:commit or :abort) before beginning another; idle uploads end after an hour.")
		e.RetryAfterMs = 5000
		return e
	}
	u.state = uploadCommitting // not usable until its file exists
	st.byID[u.id] = u
	st.mu.Unlock()

	f, err := createStagingFile(st.dir, u.id, u.size)
	st.mu.Lock()
	if err != nil {
		delete(st.byID, u.id)
		st.mu.Unlock()
		return fmt.Errorf("staging upload: %w: %w", err, errdefs.ErrInternal)
	}
	u.file, u.name, u.state = f, f.Name(), uploadOpen
	st.mu.Unlock()

	out := beginUploadJSON{UploadID: u.id, ChunkBytes: uploadChunkBytes, Chunks: n, Path: p, Size: u.size, SHA256: sum}
	// Report the mode only if the commit applies exactly it; withruntime
	// follows with files:chmod when the answer's mode differs from its own.
	if u.modeSet && u.mode != 0 {
		out.Mode = fmt.Sprintf("%03o", u.mode)
	}
	exp := now.Add(uploadTTL)
	out.ExpiresAt = optTime(&exp)
	writeJSON(w, http.StatusOK, out)
	return nil
}

// createStagingFile makes the sparse staging file of an upload.
func createStagingFile(dir, id string, size int64) (*os.File, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(filepath.Join(dir, id+uploadFileSuffix), os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, err
	}
	if err := f.Truncate(size); err != nil {
		_ = f.Close()
		_ = os.Remove(f.Name())
		return nil, err
	}
	return f, nil
}

type chunkJSON struct {
	UploadID       string `json:"uploadId"`
	Offset         int64  `json:"offset"`
	Bytes          int    `json:"bytes"`
	ChunksReceived int    `json:"chunksReceived"`
	Chunks         int    `json:"chunks"`
}

func (s *server) putUploadChunk(w http.ResponseWriter, r *http.Request, c *call) error {
	id, sbID := r.PathValue("uploadId"), r.PathValue("id")
	st := s.uploads
	now := s.now()
	st.sweep(now)

	st.mu.Lock()
	u, err := st.lookupLocked(c.owner, sbID, id, now)
	if err != nil {
		st.mu.Unlock()
		return err
	}
	switch u.state {
	case uploadCommitting:
		st.mu.Unlock()
		return errUploadCommitting(id)
	case uploadCommitted:
		st.mu.Unlock()
		return errUploadCommitted(id)
	}
	var issues []issue
	v := r.URL.Query().Get("offset")
	off, perr := strconv.ParseInt(v, 10, 64)
	want := int64(0)
	switch {
	case v == "":
		issues = append(issues, issue{Path: "offset", Message: "is required"})
	case perr != nil || off < 0 || off%uploadChunkBytes != 0 || off >= u.size:
		msg := fmt.Sprintf("must be a multiple of %d below the size, %d", uploadChunkBytes, u.size)
		if u.size == 0 {
			msg = "must not be given: an empty upload has no chunks"
		}
		issues = append(issues, issue{Path: "offset", Message: msg})
	default:
		want = min(uploadChunkBytes, u.size-off)
		if int64(len(c.body)) != want {
			issues = append(issues, issue{Path: "body",
				Message: fmt.Sprintf("must be exactly %d bytes for the chunk at offset %d, not %d", want, off, len(c.body))})
		}
	}
	if len(issues) > 0 {
		st.mu.Unlock()
		return invalid(issues)
	}
	u.writing++
	u.lastUsed = now
	f := u.file
	st.mu.Unlock()

	_, werr := f.WriteAt(c.body, off)

	st.mu.Lock()
	u.writing--
	i := int(off / uploadChunkBytes)
	if werr == nil && !u.have[i] {
		u.have[i] = true
		u.received++
	}
	u.lastUsed = s.now()
	out := chunkJSON{UploadID: id, Offset: off, Bytes: len(c.body), ChunksReceived: u.received, Chunks: u.chunks()}
	st.cond.Broadcast()
	st.mu.Unlock()
	if werr != nil {
		return fmt.Errorf("staging chunk: %w: %w", werr, errdefs.ErrInternal)
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

func (s *server) commitUpload(w http.ResponseWriter, r *http.Request, c *call) error {
	if err := decode(c, &struct{}{}); err != nil {
		return err
	}
	id, sbID := r.PathValue("uploadId"), r.PathValue("id")
	st := s.uploads
	now := s.now()
	st.sweep(now)

	st.mu.Lock()
	u, err := st.lookupLocked(c.owner, sbID, id, now)
	if err != nil {
		st.mu.Unlock()
		return err
	}
	switch u.state {
	case uploadCommitting:
		st.mu.Unlock()
		return errUploadCommitting(id)
	case uploadCommitted:
		entry := u.entry
		u.lastUsed = now
		st.mu.Unlock()
		writeJSON(w, http.StatusOK, toFileJSON(entry))
		return nil
	}
	u.state = uploadCommitting
	for u.writing > 0 { // a chunk still being written counts once it lands
		st.cond.Wait()
	}
	var missing []int64
	for i, ok := range u.have {
		if !ok {
			missing = append(missing, int64(i)*uploadChunkBytes)
		}
	}
	if len(missing) > 0 {
		u.state, u.lastUsed = uploadOpen, now
		st.mu.Unlock()
		const show = 20
		e := newError(http.StatusConflict, "upload_incomplete",
			fmt.Sprintf("%d of the upload's %d chunks have not arrived.", len(missing), u.chunks())).
			withHint("PUT the missing chunks (details.missingOffsets) and commit again.")
		e.Details = map[string]any{"missingOffsets": missing[:min(len(missing), show)], "missingChunks": len(missing),
			"chunks": u.chunks(), "chunkBytes": uploadChunkBytes}
		return e
	}
	f := u.file
	st.mu.Unlock()

	reopen := func() {
		st.mu.Lock()
		u.state, u.lastUsed = uploadOpen, s.now()
		st.mu.Unlock()
	}
	h := sha256.New()
	if _, err := io.Copy(h, io.NewSectionReader(f, 0, u.size)); err != nil {
		reopen()
		return fmt.Errorf("hashing upload: %w: %w", err, errdefs.ErrInternal)
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != u.sha256 {
		reopen()
		e := newError(http.StatusBadRequest, "checksum_mismatch",
			"The uploaded bytes do not match the sha256 given when the upload began.").
			withHint("PUT the chunks again and commit, or abort and begin a new upload.")
		e.Details = map[string]any{"expected": u.sha256, "actual": got}
		return e
	}
	_, g, err := s.mgr.Guest(r.Context(), c.owner, u.sandboxID)
	if err != nil {
		reopen()
		return err
	}
	entry, err := g.WriteFile(r.Context(), u.path, u.mode, u.size, io.NewSectionReader(f, 0, u.size))
	if err != nil {
		reopen()
		return err
	}
	st.mu.Lock()
	u.state, u.entry, u.lastUsed = uploadCommitted, entry, s.now()
	st.mu.Unlock()
	st.discard(u) // the record stays, without its staging file, until it expires
	writeJSON(w, http.StatusOK, toFileJSON(entry))
	return nil
}

func (s *server) abortUpload(w http.ResponseWriter, r *http.Request, c *call) error {
	if err := decode(c, &struct{}{}); err != nil {
		return err
	}
	id, sbID := r.PathValue("uploadId"), r.PathValue("id")
	st := s.uploads
	now := s.now()
	st.sweep(now)

	st.mu.Lock()
	u, err := st.lookupLocked(c.owner, sbID, id, now)
	if err != nil {
		st.mu.Unlock()
		return err
	}
	switch u.state {
	case uploadCommitting:
		st.mu.Unlock()
		return errUploadCommitting(id)
	case uploadCommitted:
		st.mu.Unlock()
		return errUploadCommitted(id)
	}
	delete(st.byID, id)
	for u.writing > 0 { // let chunk writes in flight end before the file closes
		st.cond.Wait()
	}
	st.mu.Unlock()
	st.discard(u)
	writeJSON(w, http.StatusOK, map[string]any{"aborted": true, "uploadId": id})
	return nil
}

type chmodRequest struct {
	Path string `json:"path"`
	Mode string `json:"mode"`
}

// chmod runs chmod in the guest as the sandbox user (the files API writes
// as that user, so it owns what it wrote) and answers the new entry.
func (s *server) chmod(w http.ResponseWriter, r *http.Request, c *call) error {
	var req chmodRequest
	if err := decode(c, &req); err != nil {
		return err
	}
	issues := pathIssue("path", req.Path)
	mode, ok := parseMode(req.Mode)
	if !ok {
		issues = append(issues, issue{Path: "mode", Message: `must be octal permission bits such as "755"`})
	}
	if len(issues) > 0 {
		return invalid(issues)
	}
	p := req.Path
	if !path.IsAbs(p) {
		p = path.Join(uploadRoot, p)
	}
	_, g, err := s.guest(r, c)
	if err != nil {
		return err
	}
	res, err := g.Exec(r.Context(), sandbox.ExecRequest{
		Argv: []string{"chmod", strconv.FormatUint(uint64(mode), 8), "--", p},
		Cwd:  uploadRoot, User: "user", TimeoutMs: chmodTimeoutMs, MaxOutput: 4 << 10,
	}, nil)
	if err != nil {
		return err
	}
	if res.TimedOut {
		return newError(http.StatusGatewayTimeout, "timeout", "chmod did not finish in time.")
	}
	if res.ExitCode == nil || *res.ExitCode != 0 {
		return chmodError(p, strings.TrimSpace(text(res.Stderr)))
	}
	entry, err := g.Stat(r.Context(), p)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, toFileJSON(entry))
	return nil
}

// chmodError maps chmod's complaint to the file error codes.
func chmodError(p, stderr string) *apiError {
	msg := "chmod " + p + " failed"
	if stderr != "" {
		msg += ": " + stderr
	}
	switch {
	case strings.Contains(stderr, "No such file or directory"), strings.Contains(stderr, "Not a directory"):
		return newError(http.StatusNotFound, sandbox.CodeFileNotFound, msg+".")
	case strings.Contains(stderr, "Operation not permitted"), strings.Contains(stderr, "Permission denied"),
		strings.Contains(stderr, "Read-only file system"):
		return newError(http.StatusForbidden, "permission_denied", msg+".").
			withHint("The sandbox user can change only the modes of files it owns.")
	}
	return newError(http.StatusBadRequest, "invalid_request", msg+".")
}
