package api

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"path"
	"strconv"
	"strings"

	"github.com/emberbox/emberbox/internal/errdefs"
	"github.com/emberbox/emberbox/internal/guest"
	"github.com/emberbox/emberbox/internal/upload"
)

// Chunked uploads: files over 1 MiB, which the files content PUT refuses.
//
//	POST …/uploads                      {path, size, sha256, mode?} → {uploadId, chunkBytes, …}
//	PUT  …/uploads/{uploadId}?offset=N  raw chunk bytes
//	POST …/uploads/{uploadId}:commit    {} → the file's entry
//	POST …/uploads/{uploadId}:abort     {} → {aborted: true}
//
// internal/upload stages them, checks them and enforces their limits (one
// key's, an idle TTL); these handlers decode requests, encode answers and
// give the commit the sandbox's guest to write into.

// Uploads stages the chunked uploads of a server, of files and of
// directory archives, under one set of limits; the commit's writer is a
// sandbox's guest, whose answer it keeps.
type Uploads = upload.Store[committed]

// committed is what a commit wrote: a file's entry, or what an archive
// put in place.
type committed struct {
	entry    *guest.FileEntry
	unpacked *unpackedJSON
}

// NewUploads returns a staging store for Config.Uploads. It removes the
// staging files an earlier run left in cfg.Dir.
func NewUploads(cfg upload.Config) (*Uploads, error) {
	return upload.New[committed](cfg)
}

const (
	// uploadRoot is where uploads may write.
	uploadRoot = "/workspace"
	// uploadRetryAfterMs is the wait suggested to a key at its upload limit.
	uploadRetryAfterMs = 5000
)

// errNoUploads answers upload requests of a server configured without
// staging.
var errNoUploads = errdefs.New(errdefs.ErrUnavailable, "uploads_unavailable", "Chunked uploads are not available on this server.")

// uploadStore returns the server's staging store, or why there is none.
func (s uploadsAPI) uploadStore() (*Uploads, error) {
	if s.uploads == nil {
		return nil, errNoUploads
	}
	return s.uploads, nil
}

// uploadError adds to a store error what its code needs in HTTP.
func uploadError(err error) error {
	if c := errdefs.Code(err); c != upload.CodeTooMany && c != upload.CodeFull {
		return err
	}
	ae := toAPIError(err)
	ae.RetryAfterMs = uploadRetryAfterMs
	return ae
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

func (s uploadsAPI) begin(w http.ResponseWriter, r *http.Request, c *call) error {
	var req beginUploadRequest
	if err := decode(c, &req); err != nil {
		return err
	}
	// Every field is checked here, so one answer lists all the problems;
	// the store checks its own limits again.
	p, issues := workspacePath("path", req.Path)
	switch {
	case req.Size == nil:
		issues = append(issues, issue{Path: "size", Message: "is required"})
	case *req.Size < 0 || *req.Size > upload.MaxSize:
		issues = append(issues, issue{Path: "size", Message: fmt.Sprintf("must be from 0 to %d", int64(upload.MaxSize))})
	}
	if !upload.ValidSHA256(strings.ToLower(req.SHA256)) {
		issues = append(issues, issue{Path: "sha256", Message: "must be 64 hexadecimal characters"})
	}
	var mode uint32
	if req.Mode != nil {
		m, ok := parseMode(*req.Mode)
		if !ok {
			issues = append(issues, issue{Path: "mode", Message: `must be octal permission bits such as "644"`})
		}
		mode = m & 0o777 // what a file write applies
	}
	if len(issues) > 0 {
		return invalid(sortIssues(issues))
	}
	sb, _, err := s.guest(r, c)
	if err != nil {
		return err
	}
	st, err := s.uploadStore()
	if err != nil {
		return err
	}
	if disk := int64(sb.DiskMiB) << 20; sb.DiskMiB > 0 && *req.Size > disk {
		return invalid([]issue{{Path: "size", Message: fmt.Sprintf("is larger than the sandbox's disk (%d MiB)", sb.DiskMiB)}})
	}
	u, err := st.Begin(upload.Spec{Owner: c.owner, SandboxID: sb.ID, Path: p, Size: *req.Size, SHA256: req.SHA256, Mode: mode})
	if err != nil {
		return uploadError(err)
	}
	out := beginUploadJSON{UploadID: u.ID, ChunkBytes: upload.ChunkSize, Chunks: u.Chunks, Path: u.Path, Size: u.Size,
		SHA256: u.SHA256, ExpiresAt: optTime(&u.ExpiresAt)}
	// Report the mode only if the commit applies exactly it; withruntime
	// follows with files:chmod when the answer's mode differs from its own.
	if req.Mode != nil && u.Mode != 0 {
		out.Mode = fmt.Sprintf("%03o", u.Mode)
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// chunkOffset reads a chunk's required offset query parameter; bad is the
// issue's message for one that is not a number.
func chunkOffset(r *http.Request, bad string) (int64, error) {
	v := r.URL.Query().Get("offset")
	off, err := strconv.ParseInt(v, 10, 64)
	switch {
	case v == "":
		return 0, invalid([]issue{{Path: "offset", Message: "is required"}})
	case err != nil:
		return 0, invalid([]issue{{Path: "offset", Message: bad}})
	}
	return off, nil
}

type chunkJSON struct {
	UploadID       string `json:"uploadId"`
	Offset         int64  `json:"offset"`
	Bytes          int    `json:"bytes"`
	ChunksReceived int    `json:"chunksReceived"`
	Chunks         int    `json:"chunks"`
}

func (s uploadsAPI) putChunk(w http.ResponseWriter, r *http.Request, c *call) error {
	st, err := s.uploadStore()
	if err != nil {
		return err
	}
	off, err := chunkOffset(r, fmt.Sprintf("must be a whole number of bytes, a multiple of %d", upload.ChunkSize))
	if err != nil {
		return err
	}
	p, err := st.Put(c.owner, r.PathValue("id"), r.PathValue("uploadId"), off, c.body)
	if err != nil {
		return uploadError(err)
	}
	writeJSON(w, http.StatusOK, chunkJSON{UploadID: p.ID, Offset: p.Offset, Bytes: p.Bytes,
		ChunksReceived: p.ChunksReceived, Chunks: p.Chunks})
	return nil
}

func (s uploadsAPI) commit(w http.ResponseWriter, r *http.Request, c *call) error {
	if err := decode(c, &struct{}{}); err != nil {
		return err
	}
	st, err := s.uploadStore()
	if err != nil {
		return err
	}
	sbID := r.PathValue("id")
	// The guest is looked up only once the upload passed its checks.
	write := func(ctx context.Context, p string, mode uint32, size int64, rd io.Reader) (committed, error) {
		_, g, err := s.mgr.Guest(ctx, c.owner, sbID)
		if err != nil {
			return committed{}, err
		}
		e, err := g.WriteFile(ctx, p, mode, size, rd)
		return committed{entry: e}, err
	}
	done, err := st.Commit(r.Context(), c.owner, sbID, r.PathValue("uploadId"), write)
	if err != nil {
		return uploadError(err)
	}
	writeJSON(w, http.StatusOK, toFileJSON(done.entry))
	return nil
}

func (s uploadsAPI) abort(w http.ResponseWriter, r *http.Request, c *call) error {
	return s.abortStaged(w, r, c, false)
}

// abortStaged answers the abort of a staged upload: a file's, or with
// archive a directory archive's.
func (s uploadsAPI) abortStaged(w http.ResponseWriter, r *http.Request, c *call, archive bool) error {
	if err := decode(c, &struct{}{}); err != nil {
		return err
	}
	st, err := s.uploadStore()
	if err != nil {
		return err
	}
	abort := st.Abort
	if archive {
		abort = st.AbortOpen
	}
	id := r.PathValue("uploadId")
	if err := abort(c.owner, r.PathValue("id"), id); err != nil {
		return uploadError(err)
	}
	writeJSON(w, http.StatusOK, map[string]any{"aborted": true, "uploadId": id})
	return nil
}
