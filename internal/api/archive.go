package api

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/emberbox/emberbox/internal/guest"
)

// Directory archives, glob and rename: the files routes whose work the
// guest's agent does (file.archive, file.unarchive, file.glob,
// file.rename); these handlers check requests and shape answers.

// fileUser maps the SDK's user of a files call to the agent's: "sandbox"
// (or nothing) is the sandbox user, "root" is root.
func fileUser(v string) (string, []issue) {
	switch v {
	case "", "sandbox", "user":
		return "", nil
	case "root":
		return "root", nil
	}
	return "", []issue{{Path: "user", Message: `must be "sandbox" or "root"`}}
}

// globFiles answers files/list with a glob: what under path matches it.
func (s files) globFiles(w http.ResponseWriter, r *http.Request, c *call, req guest.FileRequest, pattern string) error {
	if len(pattern) > guest.MaxGlobLen {
		return invalid([]issue{{Path: "glob", Message: fmt.Sprintf("must be at most %d bytes", guest.MaxGlobLen)}})
	}
	if !strings.HasPrefix(req.Path, "/") {
		req.Path = "/workspace/" + req.Path
	}
	// An absolute pattern under the root is taken relative to it.
	if strings.HasPrefix(pattern, "/") {
		rel, ok := strings.CutPrefix(pattern, strings.TrimSuffix(req.Path, "/")+"/")
		if !ok {
			return invalid([]issue{{Path: "glob", Message: "must be relative to path, or under it"}})
		}
		pattern = rel
	}
	return guestJSON(s.server, w, r, c, func(ctx context.Context, g guest.Handle) ([]guest.FileEntry, error) {
		return g.Glob(ctx, req.Path, pattern, req.Hidden, req.Limit)
	}, entriesJSON)
}

type renameRequest struct {
	From      string `json:"from"`
	To        string `json:"to"`
	Overwrite bool   `json:"overwrite"`
}

// rename moves a file or directory as the sandbox user with rename(2):
// within one file system, refusing to replace unless overwrite.
func (s files) rename(w http.ResponseWriter, r *http.Request, c *call) error {
	req, err := decodeChecked(c, func(req *renameRequest) []issue {
		return append(pathIssue("from", req.From), pathIssue("to", req.To)...)
	})
	if err != nil {
		return err
	}
	return guestJSON(s.server, w, r, c, func(ctx context.Context, g guest.Handle) (*guest.FileEntry, error) {
		return g.Rename(ctx, req.From, req.To, req.Overwrite)
	}, toFileJSON)
}

// archiveQuery reads path, user and, for a download, gzip and exclude.
func archiveQuery(r *http.Request, download bool) (p, user string, gz bool, exclude []string, err error) {
	q := r.URL.Query()
	p = q.Get("path")
	issues := pathIssue("path", p)
	user, uissues := fileUser(q.Get("user"))
	issues = append(issues, uissues...)
	if download {
		gz = true
		if v := q.Get("gzip"); v != "" {
			if gz, err = boolParam(v); err != nil {
				issues = append(issues, issue{Path: "gzip", Message: "must be true or false"})
			}
		}
		exclude = q["exclude"]
		if len(exclude) > guest.MaxArchiveExcludes {
			issues = append(issues, issue{Path: "exclude", Message: fmt.Sprintf("at most %d paths", guest.MaxArchiveExcludes)})
		}
		for _, e := range exclude {
			if pathIssue("exclude", e) != nil || strings.HasPrefix(e, "/") {
				issues = append(issues, issue{Path: "exclude", Message: "must be paths relative to path"})
				break
			}
		}
	}
	if len(issues) > 0 {
		return "", "", false, nil, invalid(sortIssues(issues))
	}
	return p, user, gz, exclude, nil
}

// downloadArchive streams a directory as a tar or tar.gz packed by the
// guest as it goes. Its length is not known ahead, so none is promised; a
// failure after the first byte breaks the connection rather than end the
// body as if it were complete.
func (s files) downloadArchive(w http.ResponseWriter, r *http.Request, c *call) error {
	p, user, gz, exclude, err := archiveQuery(r, true)
	if err != nil {
		return err
	}
	_, g, err := s.guest(r, c)
	if err != nil {
		return err
	}
	rc, err := g.Archive(r.Context(), p, user, gz, exclude)
	if err != nil {
		return err
	}
	defer rc.Close()
	h := w.Header()
	h.Set("Content-Type", "application/x-tar")
	if gz {
		h.Set("Content-Type", "application/gzip")
	}
	h.Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusOK)
	_ = http.NewResponseController(w).SetWriteDeadline(time.Time{})
	if _, err := io.Copy(w, rc); err != nil {
		if r.Context().Err() == nil {
			s.log.LogAttrs(r.Context(), slog.LevelWarn, "archive cut short",
				slog.String("request_id", requestID(r.Context())), slog.Any("err", err))
		}
		panic(http.ErrAbortHandler)
	}
	return nil
}

type unpackedJSON struct {
	Path    string `json:"path"`
	Entries int    `json:"entries"`
	Bytes   int64  `json:"bytes"`
}

// uploadArchive unpacks a tar or tar.gz body (at most 1 MiB; gzip is told
// by its magic) into a directory, made if missing.
func (s files) uploadArchive(w http.ResponseWriter, r *http.Request, c *call) error {
	p, user, _, _, err := archiveQuery(r, false)
	if err != nil {
		return err
	}
	return guestJSON(s.server, w, r, c, func(ctx context.Context, g guest.Handle) (*guest.Unpacked, error) {
		return g.Unarchive(ctx, p, user, int64(len(c.body)), bytes.NewReader(c.body))
	}, func(u *guest.Unpacked) unpackedJSON {
		return unpackedJSON{Path: p, Entries: u.Entries, Bytes: u.Bytes}
	})
}
