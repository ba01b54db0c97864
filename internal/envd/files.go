package envd

import (
	"compress/gzip"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net/http"
	"strings"

	"github.com/emberbox/emberbox/internal/errdefs"
	"github.com/emberbox/emberbox/internal/guest"
	"github.com/emberbox/emberbox/internal/sandbox"
)

// maxUploadParts bounds the files of one multipart upload.
const maxUploadParts = 1000

// uploaded is an entry of POST /files's answer, as E2B's SDKs read it.
type uploaded struct {
	Name string `json:"name"`
	Type string `json:"type"`
	Path string `json:"path"`
}

// download answers GET /files?path=&username=: the file's bytes, read
// as username, gzipped if the client accepts it.
func (s *Server) download(w http.ResponseWriter, r *http.Request) {
	rt, r, ok := filesTarget(w, r)
	if !ok {
		return
	}
	p, err := checkPath(r.URL.Query().Get("path"))
	if err != nil {
		httpError(w, http.StatusBadRequest, "path is required")
		return
	}
	p = inHome(rt, r.URL.Query().Get("username"), p)
	e, rc, err := rt.Guest.ReadFile(r.Context(), p)
	if err != nil {
		httpGuestError(w, err)
		return
	}
	defer rc.Close()
	h := w.Header()
	h.Set("Content-Type", "application/octet-stream")
	h.Set("Content-Disposition", mime.FormatMediaType("attachment", map[string]string{"filename": e.Name}))
	var out io.Writer = w
	if acceptsGzip(r.Header.Get("Accept-Encoding")) {
		h.Set("Content-Encoding", "gzip")
		h.Add("Vary", "Accept-Encoding")
		gz := gzip.NewWriter(w)
		defer gz.Close()
		out = gz
	}
	if _, err := io.Copy(out, rc); err != nil {
		// The status is sent; the client sees the body cut short.
		s.log.LogAttrs(r.Context(), slog.LevelWarn, "envd download cut short",
			slog.String("sandbox", rt.Sandbox.ID), slog.String("path", p), slog.Any("err", err))
	}
}

// filesTarget returns the routed sandbox and r whose file calls act as
// username=, or answers the error.
func filesTarget(w http.ResponseWriter, r *http.Request) (sandbox.Routed, *http.Request, bool) {
	rt, ok := sandbox.RoutedFrom(r.Context())
	if !ok {
		httpError(w, http.StatusInternalServerError, errNotRouted.Error())
		return rt, r, false
	}
	user := r.URL.Query().Get("username")
	if len(user) > maxUserLen {
		httpError(w, http.StatusBadRequest, "username is too long")
		return rt, r, false
	}
	return rt, r.WithContext(guest.WithFileUser(r.Context(), user)), true
}

// upload answers POST /files (as username=): multipart/form-data with one or more "file"
// parts (each written to path=, or to its file name), or one file's bytes
// as the body (application/octet-stream, maybe gzipped).
func (s *Server) upload(w http.ResponseWriter, r *http.Request) {
	rt, r, ok := filesTarget(w, r)
	if !ok {
		return
	}
	dst := r.URL.Query().Get("path")
	ct, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	var out []uploaded
	var err error
	if ct == "multipart/form-data" {
		out, err = s.uploadMultipart(r, rt, dst)
	} else {
		var e *uploaded
		e, err = s.uploadBody(r, rt, dst)
		if e != nil {
			out = []uploaded{*e}
		}
	}
	if err != nil {
		httpGuestError(w, err)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(out)
}

func (s *Server) uploadMultipart(r *http.Request, rt sandbox.Routed, dst string) ([]uploaded, error) {
	mr, err := r.MultipartReader()
	if err != nil {
		return nil, httpErr(http.StatusBadRequest, "reading the multipart body: %v", err)
	}
	out := []uploaded{}
	for {
		part, err := mr.NextPart()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, httpErr(http.StatusBadRequest, "reading the multipart body: %v", err)
		}
		if part.FormName() != "file" {
			part.Close()
			continue
		}
		if len(out) == maxUploadParts {
			return nil, httpErr(http.StatusBadRequest, "more than %d files in one upload", maxUploadParts)
		}
		p := dst
		if p == "" {
			// The SDKs send the path as the file name, which Part.FileName
			// would cut to its base.
			_, params, _ := mime.ParseMediaType(part.Header.Get("Content-Disposition"))
			p = params["filename"]
		}
		if _, err := checkPath(p); err != nil {
			return nil, httpErr(http.StatusBadRequest, "a file has neither path= nor a file name")
		}
		e, err := writeSpooled(r, rt.Guest, inHome(rt, r.URL.Query().Get("username"), p), part)
		part.Close()
		if err != nil {
			return nil, err
		}
		out = append(out, *e)
	}
	if len(out) == 0 {
		return nil, httpErr(http.StatusBadRequest, `no "file" part in the multipart body`)
	}
	return out, nil
}

// uploadBody writes the request's body to dst: streamed when its length
// is known, else (chunked, or gzipped) through a bounded spool file, as
// the guest takes a file of a known size only.
func (s *Server) uploadBody(r *http.Request, rt sandbox.Routed, dst string) (*uploaded, error) {
	if _, err := checkPath(dst); err != nil {
		return nil, httpErr(http.StatusBadRequest, "path is required")
	}
	g, dst := rt.Guest, inHome(rt, r.URL.Query().Get("username"), dst)
	switch enc := strings.ToLower(strings.TrimSpace(r.Header.Get("Content-Encoding"))); enc {
	case "gzip":
		gz, err := gzip.NewReader(r.Body)
		if err != nil {
			return nil, httpErr(http.StatusBadRequest, "the gzipped body: %v", err)
		}
		defer gz.Close()
		return writeSpooled(r, g, dst, gz)
	case "", "identity":
	default:
		return nil, httpErr(http.StatusUnsupportedMediaType, "Content-Encoding %q is not supported (gzip is)", enc)
	}
	if r.ContentLength < 0 {
		return writeSpooled(r, g, dst, r.Body)
	}
	if r.ContentLength > maxUpload {
		return nil, httpErr(http.StatusRequestEntityTooLarge, "a file is at most %d bytes", int64(maxUpload))
	}
	e, err := g.WriteFile(r.Context(), dst, 0, r.ContentLength, r.Body)
	if err != nil {
		return nil, err
	}
	return &uploaded{Name: e.Name, Type: "file", Path: e.Path}, nil
}

// writeSpooled writes what src holds, of a size unknown until read, to p.
func writeSpooled(r *http.Request, g guest.Handle, p string, src io.Reader) (*uploaded, error) {
	f, n, err := spool(src)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	e, err := g.WriteFile(r.Context(), p, 0, n, f)
	if err != nil {
		return nil, err
	}
	return &uploaded{Name: e.Name, Type: "file", Path: e.Path}, nil
}

func acceptsGzip(v string) bool {
	for _, part := range strings.Split(v, ",") {
		name, q, _ := strings.Cut(strings.TrimSpace(part), ";")
		if strings.EqualFold(strings.TrimSpace(name), "gzip") {
			return strings.ReplaceAll(strings.TrimSpace(q), " ", "") != "q=0"
		}
	}
	return false
}

// statusError is a failure of /files with its HTTP status.
type statusError struct {
	status int
	msg    string
}

func (e *statusError) Error() string { return e.msg }

func httpErr(status int, format string, args ...any) error {
	return &statusError{status: status, msg: fmt.Sprintf(format, args...)}
}

// httpGuestError answers an error of /files with the status envd gives it.
func httpGuestError(w http.ResponseWriter, err error) {
	var se *statusError
	status := http.StatusInternalServerError
	switch {
	case errors.As(err, &se):
		status = se.status
	case errdefs.IsNotFound(err):
		status = http.StatusNotFound
	case errdefs.IsInvalidArgument(err):
		status = http.StatusBadRequest
	case errors.Is(err, errdefs.ErrPermission):
		status = http.StatusForbidden
	case errors.Is(err, errdefs.ErrUnavailable):
		status = http.StatusBadGateway
	case errdefs.IsConflict(err):
		switch errdefs.Code(err) {
		case "is_a_directory", "not_a_directory":
			status = http.StatusBadRequest
		case "no_space":
			status = http.StatusInsufficientStorage
		default:
			status = http.StatusConflict
		}
	}
	httpError(w, status, err.Error())
}

// httpError writes envd's error shape.
func httpError(w http.ResponseWriter, status int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	}{status, msg})
}
