package api

import (
	"context"
	"fmt"
	"io"
	"net/http"

	"github.com/emberbox/emberbox/internal/upload"
)

// Chunked archive uploads: a directory archive over 1 MiB, which the
// files/archive PUT refuses.
//
//	POST …/files/archive/uploads                      {path, gzip?, user?} → {uploadId, chunkBytes, …}
//	PUT  …/files/archive/uploads/{uploadId}?offset=N  raw bytes, in sequence
//	POST …/files/archive/uploads/{uploadId}:commit    {} → {path, entries, bytes}
//	POST …/files/archive/uploads/{uploadId}:abort     {} → {aborted: true}
//
// They are open-ended uploads of the same staging store as files (one set
// of per-key and server limits): the sender need not know the length, so
// chunks come in sequence, there is no hash, and the commit streams what
// arrived into the guest's file.unarchive, whose tar checks the archive.

type beginArchiveUploadRequest struct {
	Path string `json:"path"`
	Gzip *bool  `json:"gzip"` // informational: the guest tells gzip by its magic
	User string `json:"user"`
}

type beginArchiveUploadJSON struct {
	UploadID   string    `json:"uploadId"`
	ChunkBytes int64     `json:"chunkBytes"`
	MaxBytes   int64     `json:"maxBytes"`
	Path       string    `json:"path"`
	User       string    `json:"user"`
	ExpiresAt  *jsonTime `json:"expiresAt"`
}

func (s uploadsAPI) beginArchiveUpload(w http.ResponseWriter, r *http.Request, c *call) error {
	var req beginArchiveUploadRequest
	if err := decode(c, &req); err != nil {
		return err
	}
	issues := pathIssue("path", req.Path)
	user, uissues := fileUser(req.User)
	if issues = append(issues, uissues...); len(issues) > 0 {
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
	u, err := st.Begin(upload.Spec{Owner: c.owner, SandboxID: sb.ID, Path: req.Path, Open: true, User: user})
	if err != nil {
		return uploadError(err)
	}
	writeJSON(w, http.StatusOK, beginArchiveUploadJSON{UploadID: u.ID, ChunkBytes: upload.ChunkSize, MaxBytes: upload.MaxSize,
		Path: u.Path, User: sdkUser(u.User), ExpiresAt: optTime(&u.ExpiresAt)})
	return nil
}

// sdkUser names an agent user as the SDK does.
func sdkUser(u string) string {
	if u == "" {
		return "sandbox"
	}
	return u
}

type archiveChunkJSON struct {
	UploadID       string `json:"uploadId"`
	Offset         int64  `json:"offset"`
	Bytes          int    `json:"bytes"`
	ChunksReceived int    `json:"chunksReceived"`
	Received       int64  `json:"received"`
	NextOffset     int64  `json:"nextOffset"`
}

func (s uploadsAPI) putArchiveChunk(w http.ResponseWriter, r *http.Request, c *call) error {
	st, err := s.uploadStore()
	if err != nil {
		return err
	}
	off, err := chunkOffset(r, "must be a whole number of bytes")
	if err != nil {
		return err
	}
	p, err := st.Append(c.owner, r.PathValue("id"), r.PathValue("uploadId"), off, c.body)
	if err != nil {
		return uploadError(err)
	}
	writeJSON(w, http.StatusOK, archiveChunkJSON{UploadID: p.ID, Offset: p.Offset, Bytes: p.Bytes,
		ChunksReceived: p.ChunksReceived, Received: p.Received, NextOffset: p.Received})
	return nil
}

func (s uploadsAPI) commitArchiveUpload(w http.ResponseWriter, r *http.Request, c *call) error {
	if err := decode(c, &struct{}{}); err != nil {
		return err
	}
	st, err := s.uploadStore()
	if err != nil {
		return err
	}
	sbID := r.PathValue("id")
	write := func(ctx context.Context, u *upload.Upload, rd io.Reader) (committed, error) {
		if u.Size == 0 {
			return committed{}, invalid([]issue{{Path: "body", Message: "no chunk arrived: an archive is not empty"}})
		}
		_, g, err := s.mgr.Guest(ctx, c.owner, sbID)
		if err != nil {
			return committed{}, err
		}
		n, err := g.Unarchive(ctx, u.Path, u.User, u.Size, rd)
		if err != nil {
			return committed{}, fmt.Errorf("unpacking upload %s: %w", u.ID, err)
		}
		return committed{unpacked: &unpackedJSON{Path: u.Path, Entries: n.Entries, Bytes: n.Bytes}}, nil
	}
	done, err := st.CommitOpen(r.Context(), c.owner, sbID, r.PathValue("uploadId"), write)
	if err != nil {
		return uploadError(err)
	}
	writeJSON(w, http.StatusOK, done.unpacked)
	return nil
}

func (s uploadsAPI) abortArchiveUpload(w http.ResponseWriter, r *http.Request, c *call) error {
	return s.abortStaged(w, r, c, true)
}
