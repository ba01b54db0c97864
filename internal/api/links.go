package api

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net/http"
	"path"
	"strconv"
	"strings"
	"time"
	"unicode"

	"github.com/emberbox/emberbox/internal/errdefs"
	"github.com/emberbox/emberbox/internal/guest"
	"github.com/emberbox/emberbox/internal/links"
	"github.com/emberbox/emberbox/internal/sandbox"
	"github.com/emberbox/emberbox/internal/upload"
)

// Signed file links (internal/links): POST …/files:link makes a URL that
// anyone may GET (download a file, or a directory as .tar.gz) or PUT (write
// a file) without a key until it expires; POST …/files:revoke-links ends
// every link of the sandbox. The link itself, /v1/links/{token}, is a
// public route: its token, checked by the signer, is the authority, and
// acts as the key that made it.

const (
	// linkWakeWait bounds how long a link waits for a sandbox it woke.
	linkWakeWait = 90 * time.Second
	// maxLinkFilename bounds a download's name.
	maxLinkFilename = 255
)

var errNoLinks = errdefs.New(errdefs.ErrUnavailable, "file_links_unavailable", "File links are not available on this server.")

type linkRequest struct {
	Path             string `json:"path"`
	Method           string `json:"method"`
	ExpiresInSeconds *int64 `json:"expiresInSeconds"`
	Filename         string `json:"filename"`
	Wake             bool   `json:"wake"`
	Archive          bool   `json:"archive"`
	MaxBytes         *int64 `json:"maxBytes"`
}

type linkJSON struct {
	URL       string    `json:"url"`
	Method    string    `json:"method"`
	Path      string    `json:"path"`
	ExpiresAt *jsonTime `json:"expiresAt"`
	Archive   bool      `json:"archive,omitempty"`
	MaxBytes  int64     `json:"maxBytes,omitempty"`
}

func (req *linkRequest) check() []issue {
	issues := pathIssue("path", req.Path)
	if req.Method == "" {
		req.Method = http.MethodGet
	}
	if req.Method != http.MethodGet && req.Method != http.MethodPut {
		issues = append(issues, issue{Path: "method", Message: `must be "GET" or "PUT"`})
	}
	if e := req.ExpiresInSeconds; e != nil && (*e < 1 || *e > int64(links.MaxTTL/time.Second)) {
		issues = append(issues, issue{Path: "expiresInSeconds", Message: fmt.Sprintf("must be from 1 to %d", int64(links.MaxTTL/time.Second))})
	}
	if len(req.Filename) > maxLinkFilename || strings.ContainsAny(req.Filename, `/\`) ||
		strings.IndexFunc(req.Filename, unicode.IsControl) >= 0 {
		issues = append(issues, issue{Path: "filename", Message: fmt.Sprintf("must be a file name of at most %d bytes, without slashes", maxLinkFilename)})
	}
	if req.Method == http.MethodPut && (req.Archive || req.Filename != "") {
		issues = append(issues, issue{Path: "method", Message: "archive and filename are for GET links"})
	}
	if m := req.MaxBytes; m != nil && (req.Method != http.MethodPut || *m < 0 || *m > upload.MaxSize) {
		issues = append(issues, issue{Path: "maxBytes", Message: fmt.Sprintf("is for PUT links, from 0 to %d", int64(upload.MaxSize))})
	}
	return issues
}

func (s linksAPI) make(w http.ResponseWriter, r *http.Request, c *call) error {
	var req linkRequest
	if err := decode(c, &req); err != nil {
		return err
	}
	if issues := req.check(); len(issues) > 0 {
		return invalid(sortIssues(issues))
	}
	if s.links == nil {
		return errNoLinks
	}
	sb, err := s.mgr.Get(r.Context(), c.owner, r.PathValue("id"))
	if err != nil {
		return err
	}
	cl := links.Claims{SandboxID: sb.ID, Owner: c.owner, Path: req.Path, Method: req.Method,
		Archive: req.Archive, Filename: req.Filename, Wake: req.Wake}
	if req.Method == http.MethodPut {
		cl.MaxBytes = upload.MaxSize
		if req.MaxBytes != nil {
			cl.MaxBytes = *req.MaxBytes
		}
	}
	var ttl time.Duration
	if req.ExpiresInSeconds != nil {
		ttl = time.Duration(*req.ExpiresInSeconds) * time.Second
	}
	token, exp, err := s.links.Sign(r.Context(), cl, ttl)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, linkJSON{URL: publicBase(r) + "/v1/links/" + token, Method: req.Method, Path: req.Path,
		ExpiresAt: optTime(&exp), Archive: req.Archive, MaxBytes: cl.MaxBytes})
	return nil
}

// publicBase is the scheme and host the caller reached this server at,
// which a link it shares must name too.
func publicBase(r *http.Request) string {
	scheme := "http"
	if r.TLS != nil || strings.EqualFold(r.Header.Get("X-Forwarded-Proto"), "https") {
		scheme = "https"
	}
	return scheme + "://" + r.Host
}

func (s linksAPI) revoke(w http.ResponseWriter, r *http.Request, c *call) error {
	if len(c.body) > 0 {
		if err := decode(c, &struct{}{}); err != nil {
			return err
		}
	}
	if s.links == nil {
		return errNoLinks
	}
	sb, err := s.mgr.Get(r.Context(), c.owner, r.PathValue("id"))
	if err != nil {
		return err
	}
	g, err := s.links.Revoke(r.Context(), sb.ID)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, map[string]any{"revoked": true, "sandboxId": sb.ID, "generation": g})
	return nil
}

// linkGuest opens a link's token and returns its claims and its sandbox's
// guest, waking the sandbox first if the link asks to.
func (s linksAPI) linkGuest(r *http.Request, method string) (*links.Claims, guest.Handle, error) {
	if s.links == nil {
		return nil, guest.Handle{}, errNoLinks
	}
	cl, err := s.links.Open(r.Context(), r.PathValue("token"))
	if err != nil {
		return nil, guest.Handle{}, err
	}
	if cl.Method != method {
		return nil, guest.Handle{}, newError(http.StatusMethodNotAllowed, "method_not_allowed", "This link is for "+cl.Method+".")
	}
	if cl.Wake {
		if err := s.wakeForLink(r.Context(), cl); err != nil {
			return nil, guest.Handle{}, err
		}
	}
	_, g, err := s.mgr.Guest(r.Context(), cl.Owner, cl.SandboxID)
	if err != nil {
		return nil, guest.Handle{}, err
	}
	return cl, g, nil
}

// wakeForLink wakes the link's sandbox if it is paused (Guest itself wakes
// one whose autoWake is on) and waits for it to run.
func (s linksAPI) wakeForLink(ctx context.Context, cl *links.Claims) error {
	sb, err := s.mgr.Get(ctx, cl.Owner, cl.SandboxID)
	if err != nil || !sb.State.Paused() || sb.AutoWake {
		return err
	}
	if _, err := s.mgr.Wake(ctx, cl.Owner, cl.SandboxID, nil); err != nil && errdefs.Code(err) != "not_paused" {
		return err
	}
	wctx, cancel := context.WithTimeout(ctx, linkWakeWait)
	defer cancel()
	_, err = s.mgr.WaitFor(wctx, cl.Owner, cl.SandboxID, sandbox.StateRunning)
	return err
}

// download serves a GET link: the file (one byte range if asked), or
// the directory as .tar.gz.
func (s linksAPI) download(w http.ResponseWriter, r *http.Request, _ *call) error {
	cl, g, err := s.linkGuest(r, http.MethodGet)
	if err != nil {
		return err
	}
	h := w.Header()
	h.Set("Cache-Control", "no-store")
	name := cl.Filename
	if cl.Archive {
		if name == "" {
			name = path.Base(cl.Path) + ".tar.gz"
		}
		h.Set("Content-Disposition", mime.FormatMediaType("attachment", map[string]string{"filename": name}))
		if r.Method == http.MethodHead {
			h.Set("Content-Type", "application/gzip")
			w.WriteHeader(http.StatusOK)
			return nil
		}
		rc, err := g.Archive(r.Context(), cl.Path, "", true, nil)
		if err != nil {
			return err
		}
		defer rc.Close()
		h.Set("Content-Type", "application/gzip")
		w.WriteHeader(http.StatusOK)
		_ = http.NewResponseController(w).SetWriteDeadline(time.Time{})
		if _, err := io.Copy(w, rc); err != nil {
			panic(http.ErrAbortHandler) // cut short: never end the body as if complete
		}
		return nil
	}
	if name == "" {
		name = path.Base(cl.Path)
	}
	h.Set("Content-Disposition", mime.FormatMediaType("attachment", map[string]string{"filename": name}))
	h.Set("Accept-Ranges", "bytes")
	if r.Method == http.MethodHead {
		e, err := g.Stat(r.Context(), cl.Path)
		if err != nil {
			return err
		}
		h.Set("Content-Type", "application/octet-stream")
		h.Set("Content-Length", strconv.FormatInt(e.Size, 10))
		w.WriteHeader(http.StatusOK)
		return nil
	}
	entry, rc, err := g.ReadFile(r.Context(), cl.Path)
	if err != nil {
		return err
	}
	defer rc.Close()
	h.Set("Content-Type", "application/octet-stream")
	start, n, status := int64(0), entry.Size, http.StatusOK
	if spec := r.Header.Get("Range"); spec != "" {
		var ok bool
		if start, n, ok = parseRange(spec, entry.Size); !ok {
			h.Set("Content-Range", "bytes */"+strconv.FormatInt(entry.Size, 10))
			return newError(http.StatusRequestedRangeNotSatisfiable, "range_not_satisfiable",
				"The range asked for is not within the file's "+strconv.FormatInt(entry.Size, 10)+" bytes.")
		}
		status = http.StatusPartialContent
		h.Set("Content-Range", fmt.Sprintf("bytes %d-%d/%d", start, start+n-1, entry.Size))
		// The guest streams from the start; skip to the range.
		if _, err := io.CopyN(io.Discard, rc, start); err != nil {
			return fmt.Errorf("skipping to byte %d: %w", start, err)
		}
	}
	h.Set("Content-Length", strconv.FormatInt(n, 10))
	w.WriteHeader(status)
	s.copyFile(w, r, rc, n)
	return nil
}

// parseRange parses one "bytes=a-b", "bytes=a-" or "bytes=-n" range of a
// file of size bytes into its start and length. Several ranges are not
// served (ok false).
func parseRange(spec string, size int64) (start, n int64, ok bool) {
	v, found := strings.CutPrefix(spec, "bytes=")
	if !found || strings.Contains(v, ",") {
		return 0, 0, false
	}
	a, b, found := strings.Cut(strings.TrimSpace(v), "-")
	if !found {
		return 0, 0, false
	}
	if a == "" { // the last b bytes
		last, err := strconv.ParseInt(b, 10, 64)
		if err != nil || last <= 0 || size == 0 {
			return 0, 0, false
		}
		last = min(last, size)
		return size - last, last, true
	}
	first, err := strconv.ParseInt(a, 10, 64)
	if err != nil || first < 0 || first >= size {
		return 0, 0, false
	}
	end := size - 1
	if b != "" {
		if end, err = strconv.ParseInt(b, 10, 64); err != nil || end < first {
			return 0, 0, false
		}
		end = min(end, size-1)
	}
	return first, end - first + 1, true
}

// upload serves a PUT link: the body, whose Content-Length is
// required, atomically replaces the file.
func (s linksAPI) upload(w http.ResponseWriter, r *http.Request, _ *call) error {
	cl, g, err := s.linkGuest(r, http.MethodPut)
	if err != nil {
		return err
	}
	size := r.ContentLength
	switch {
	case size < 0:
		return newError(http.StatusLengthRequired, "length_required", "A link upload needs a Content-Length.")
	case size > cl.MaxBytes:
		return newError(http.StatusRequestEntityTooLarge, "too_large",
			fmt.Sprintf("This link takes at most %d bytes, not %d.", cl.MaxBytes, size))
	}
	_ = http.NewResponseController(w).SetReadDeadline(time.Time{})
	entry, err := g.WriteFile(r.Context(), cl.Path, 0, size, http.MaxBytesReader(w, r.Body, size))
	if err != nil {
		if r.Context().Err() == nil {
			s.log.LogAttrs(r.Context(), slog.LevelDebug, "link upload failed",
				slog.String("request_id", requestID(r.Context())), slog.Any("err", err))
		}
		return err
	}
	writeJSON(w, http.StatusOK, toFileJSON(entry))
	return nil
}
