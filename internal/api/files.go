package api

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/emberbox/emberbox/internal/errdefs"
	"github.com/emberbox/emberbox/internal/guest"
)

// Limits of file requests.
const (
	maxPathLen   = 4096
	maxListDepth = 32
	maxListLimit = 10_000
)

// fileJSON is the wire form of a file entry.
type fileJSON struct {
	Exists        *bool     `json:"exists,omitempty"` // stat only
	Name          string    `json:"name"`
	Path          string    `json:"path"`
	Type          string    `json:"type"`
	Size          int64     `json:"size"`
	Mode          string    `json:"mode"`
	ModifiedAt    *jsonTime `json:"modifiedAt"`
	UID           int       `json:"uid"`
	GID           int       `json:"gid"`
	Owner         string    `json:"owner,omitempty"`
	Group         string    `json:"group,omitempty"`
	SymlinkTarget string    `json:"symlinkTarget,omitempty"`
}

func toFileJSON(e *guest.FileEntry) fileJSON {
	return fileJSON{Name: e.Name, Path: e.Path, Type: e.Type, Size: e.Size, Mode: e.Mode,
		ModifiedAt: optTime(&e.ModifiedAt), UID: e.UID, GID: e.GID, Owner: e.Owner, Group: e.Group,
		SymlinkTarget: e.SymlinkTarget}
}

func pathIssue(field, p string) []issue {
	switch {
	case p == "":
		return []issue{{Path: field, Message: "is required"}}
	case len(p) > maxPathLen:
		return []issue{{Path: field, Message: fmt.Sprintf("must be at most %d bytes", maxPathLen)}}
	case strings.IndexByte(p, 0) >= 0:
		return []issue{{Path: field, Message: "must not contain NUL"}}
	case !utf8.ValidString(p):
		// Answers are JSON: a path that is not UTF-8 could not be named
		// back to the caller as it was sent.
		return []issue{{Path: field, Message: "must be valid UTF-8"}}
	}
	return nil
}

// queryPath returns the required query parameter path.
func queryPath(r *http.Request) (string, error) {
	p := r.URL.Query().Get("path")
	if issues := pathIssue("path", p); issues != nil {
		return "", invalid(issues)
	}
	return p, nil
}

func (s files) read(w http.ResponseWriter, r *http.Request, c *call) error {
	p, err := queryPath(r)
	if err != nil {
		return err
	}
	_, g, err := s.mgr.Guest(r.Context(), c.owner, r.PathValue("id"))
	if err != nil {
		return err
	}
	entry, rc, err := g.ReadFile(r.Context(), p)
	if err != nil {
		return err
	}
	defer rc.Close()
	h := w.Header()
	h.Set("Content-Type", "application/octet-stream")
	h.Set("Cache-Control", "no-store")
	if entry.Size <= maxBody {
		// Small: read it whole, so length and hash describe exactly what is
		// sent even if the file changed since its entry was taken.
		data, err := io.ReadAll(io.LimitReader(rc, maxBody+1))
		if err != nil {
			return err
		}
		if len(data) <= maxBody {
			sum := sha256.Sum256(data)
			h.Set("x-content-length", strconv.Itoa(len(data)))
			h.Set("x-content-sha256", hex.EncodeToString(sum[:]))
			h.Set("Content-Length", strconv.Itoa(len(data)))
			w.WriteHeader(http.StatusOK)
			_, _ = w.Write(data)
			return nil
		}
		// It grew past 1 MiB while read: send what there is, unchecked.
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write(data)
		s.copyFile(w, r, rc, -1)
		return nil
	}
	// Large: stream exactly the size announced. A file that shrank leaves
	// the body short, which the client detects against x-content-length.
	size := strconv.FormatInt(entry.Size, 10)
	h.Set("x-content-length", size)
	h.Set("Content-Length", size)
	w.WriteHeader(http.StatusOK)
	s.copyFile(w, r, rc, entry.Size)
	return nil
}

// copyFile streams a file body; n < 0 copies to the end.
func (s *server) copyFile(w http.ResponseWriter, r *http.Request, rc io.Reader, n int64) {
	_ = http.NewResponseController(w).SetWriteDeadline(time.Time{})
	var err error
	if n < 0 {
		_, err = io.Copy(w, rc)
	} else {
		_, err = io.CopyN(w, rc, n)
	}
	if err != nil && r.Context().Err() == nil {
		s.log.LogAttrs(r.Context(), slog.LevelWarn, "file read cut short",
			slog.String("request_id", requestID(r.Context())), slog.Any("err", err))
	}
}

// parseMode parses octal permission bits such as "755".
func parseMode(v string) (uint32, bool) {
	if len(v) < 1 || len(v) > 4 {
		return 0, false
	}
	m, err := strconv.ParseUint(v, 8, 32)
	if err != nil || m > 0o7777 {
		return 0, false
	}
	return uint32(m), true
}

func (s files) write(w http.ResponseWriter, r *http.Request, c *call) error {
	p, err := queryPath(r)
	if err != nil {
		return err
	}
	var mode uint32
	if v := r.URL.Query().Get("mode"); v != "" {
		m, ok := parseMode(v)
		if !ok {
			return invalid([]issue{{Path: "mode", Message: `must be octal permission bits such as "644"`}})
		}
		mode = m
	}
	return guestJSON(s.server, w, r, c, func(ctx context.Context, g guest.Handle) (*guest.FileEntry, error) {
		return g.WriteFile(ctx, p, mode, int64(len(c.body)), bytes.NewReader(c.body))
	}, toFileJSON)
}

func (s files) list(w http.ResponseWriter, r *http.Request, c *call) error {
	q := r.URL.Query()
	req := guest.FileRequest{Path: q.Get("path"), Depth: 1}
	if req.Path == "" {
		req.Path = "/workspace"
	}
	issues := pathIssue("path", req.Path)
	intParam := func(name string, lo, hi int, dst *int) {
		v := q.Get(name)
		if v == "" {
			return
		}
		n, err := strconv.Atoi(v)
		if err != nil || n < lo || n > hi {
			issues = append(issues, issue{Path: name, Message: fmt.Sprintf("must be from %d to %d", lo, hi)})
			return
		}
		*dst = n
	}
	intParam("depth", 1, maxListDepth, &req.Depth)
	intParam("limit", 1, maxListLimit, &req.Limit)
	var err error
	if req.Hidden, err = boolParam(q.Get("hidden")); err != nil {
		issues = append(issues, issue{Path: "hidden", Message: "must be true or false"})
	}
	if len(issues) > 0 {
		return invalid(issues)
	}
	if pattern := q.Get("glob"); pattern != "" {
		return s.globFiles(w, r, c, req, pattern)
	}
	return guestJSON(s.server, w, r, c, func(ctx context.Context, g guest.Handle) ([]guest.FileEntry, error) {
		return g.List(ctx, req)
	}, entriesJSON)
}

// entriesJSON is the wire form of a list of file entries.
func entriesJSON(entries []guest.FileEntry) dataJSON[fileJSON] {
	return dataOf(entries, toFileJSON)
}

type existsJSON struct {
	Exists bool `json:"exists"`
}

func (s files) stat(w http.ResponseWriter, r *http.Request, c *call) error {
	p, err := queryPath(r)
	if err != nil {
		return err
	}
	id := r.PathValue("id")
	_, g, err := s.mgr.Guest(r.Context(), c.owner, id)
	if err != nil {
		return err
	}
	entry, err := g.Stat(r.Context(), p)
	if err != nil {
		if !s.fileMissing(r, c, id, err) {
			return err
		}
		writeJSON(w, http.StatusOK, existsJSON{Exists: false})
		return nil
	}
	out := toFileJSON(entry)
	yes := true
	out.Exists = &yes
	writeJSON(w, http.StatusOK, out)
	return nil
}

// fileMissing tells a missing file apart from a missing sandbox, both of
// class not-found: a file_not_found code is the file; another code is not;
// a bare class is the file only if the sandbox can be read.
func (s files) fileMissing(r *http.Request, c *call, id string, err error) bool {
	if !errdefs.IsNotFound(err) {
		return false
	}
	switch errdefs.Code(err) {
	case guest.CodeFileNotFound:
		return true
	case "":
		_, gerr := s.mgr.Get(r.Context(), c.owner, id)
		return gerr == nil
	}
	return false
}

type mkdirRequest struct {
	Path    string `json:"path"`
	Parents bool   `json:"parents"`
}

func (s files) mkdir(w http.ResponseWriter, r *http.Request, c *call) error {
	req, err := decodeChecked(c, func(req *mkdirRequest) []issue { return pathIssue("path", req.Path) })
	if err != nil {
		return err
	}
	return guestJSON(s.server, w, r, c, func(ctx context.Context, g guest.Handle) (*guest.FileEntry, error) {
		return g.Mkdir(ctx, req.Path, req.Parents)
	}, toFileJSON)
}

type removeRequest struct {
	Path      string `json:"path"`
	Recursive bool   `json:"recursive"`
}

func (s files) remove(w http.ResponseWriter, r *http.Request, c *call) error {
	req, err := decodeChecked(c, func(req *removeRequest) []issue { return pathIssue("path", req.Path) })
	if err != nil {
		return err
	}
	return guestJSON(s.server, w, r, c, func(ctx context.Context, g guest.Handle) (bool, error) {
		return g.Remove(ctx, req.Path, req.Recursive)
	}, func(removed bool) map[string]bool { return map[string]bool{"removed": removed} })
}

type chmodRequest struct {
	Path string `json:"path"`
	Mode string `json:"mode"`
}

// chmod sets a file's permission bits as the sandbox user (the files API
// writes as that user, so it owns what it wrote) and answers the new entry.
func (s files) chmod(w http.ResponseWriter, r *http.Request, c *call) error {
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
	return guestJSON(s.server, w, r, c, func(ctx context.Context, g guest.Handle) (*guest.FileEntry, error) {
		entry, err := g.Chmod(ctx, req.Path, mode)
		if errdefs.Code(err) == "permission_denied" {
			ae := toAPIError(err)
			ae.Hint = "The sandbox user can change only the modes of files it owns."
			return nil, ae
		}
		return entry, err
	}, toFileJSON)
}
