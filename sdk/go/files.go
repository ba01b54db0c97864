package emberbox

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/url"
	"strconv"
)

// MaxPut is the largest body one request may carry: a file written
// whole, an archive unpacked, a chunk of an upload.
const MaxPut = 1 << 20

// ReadFile copies a file of the sandbox to w and returns its size.
// Relative paths resolve under /workspace.
func (c *Client) ReadFile(ctx context.Context, id, path string, w io.Writer) (int64, error) {
	if id == "" {
		return 0, errors.New("emberbox: no sandbox id")
	}
	resp, err := c.send(ctx, &request{method: http.MethodGet, path: sandboxPath(id, "/files/content"),
		query: url.Values{"path": {path}}, accept: "application/octet-stream"})
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	n, err := io.Copy(w, resp.Body)
	if err != nil {
		return n, fmt.Errorf("emberbox: reading %s: %w", path, err)
	}
	if want, err := strconv.ParseInt(resp.Header.Get("x-content-length"), 10, 64); err == nil && want != n {
		return n, fmt.Errorf("emberbox: reading %s: got %d bytes of %d (it changed while read?)", path, n, want)
	}
	return n, nil
}

// WriteFile creates or replaces a file of the sandbox, making its
// parents; mode 0 means 0644. Up to MaxPut bytes go in one request; a
// larger file goes as a chunked upload, which the server accepts only
// under /workspace.
func (c *Client) WriteFile(ctx context.Context, id, path string, data []byte, mode fs.FileMode) error {
	if id == "" {
		return errors.New("emberbox: no sandbox id")
	}
	if mode == 0 {
		mode = 0o644
	}
	octal := strconv.FormatUint(uint64(mode.Perm()), 8)
	if len(data) > MaxPut {
		return c.upload(ctx, id, path, data, octal)
	}
	return c.do(ctx, &request{method: http.MethodPut, path: sandboxPath(id, "/files/content"),
		query: url.Values{"path": {path}, "mode": {octal}}, body: data}, nil)
}

// upload sends a file in chunks and commits it; the server checks the
// sha256 before it writes the file.
func (c *Client) upload(ctx context.Context, id, path string, data []byte, octal string) error {
	sum := sha256.Sum256(data)
	size := int64(len(data))
	r, err := jsonRequest(http.MethodPost, sandboxPath(id, "/uploads"), map[string]any{
		"path": path, "size": size, "sha256": hex.EncodeToString(sum[:]), "mode": octal})
	if err != nil {
		return err
	}
	var up struct {
		UploadID   string `json:"uploadId"`
		ChunkBytes int64  `json:"chunkBytes"`
	}
	if err := c.do(ctx, r, &up); err != nil {
		return err
	}
	if up.UploadID == "" || up.ChunkBytes <= 0 {
		return fmt.Errorf("emberbox: the server began upload %q with chunks of %d bytes", up.UploadID, up.ChunkBytes)
	}
	base := sandboxPath(id, "/uploads/"+url.PathEscape(up.UploadID))
	for off := int64(0); off < size; off += up.ChunkBytes {
		chunk := data[off:min(size, off+up.ChunkBytes)]
		err := c.do(ctx, &request{method: http.MethodPut, path: base,
			query: url.Values{"offset": {strconv.FormatInt(off, 10)}}, body: chunk}, nil)
		if err != nil {
			c.abortUpload(base)
			return err
		}
	}
	r, err = jsonRequest(http.MethodPost, base+":commit", struct{}{})
	if err != nil {
		return err
	}
	if err := c.do(ctx, r, nil); err != nil {
		c.abortUpload(base)
		return err
	}
	return nil
}

// abortUpload drops a failed upload's chunks, on a fresh context: the
// caller's may be what ended it.
func (c *Client) abortUpload(base string) {
	ctx, cancel := context.WithTimeout(context.Background(), 15e9)
	defer cancel()
	if r, err := jsonRequest(http.MethodPost, base+":abort", struct{}{}); err == nil {
		_ = c.do(ctx, r, nil)
	}
}

// ArchiveOptions shape a downloaded archive.
type ArchiveOptions struct {
	NoGzip   bool     // a plain tar instead of tar.gz
	Excludes []string // paths relative to the directory, left out with what is below them
	User     string   // "sandbox" (default) or "root": whose rights read the files
}

// DownloadArchive streams a directory of the sandbox as a tar.gz (or a
// tar) with its symlinks and modes. The caller closes the reader.
func (c *Client) DownloadArchive(ctx context.Context, id, path string, o ArchiveOptions) (io.ReadCloser, error) {
	if id == "" {
		return nil, errors.New("emberbox: no sandbox id")
	}
	q := url.Values{"path": {path}}
	if o.NoGzip {
		q.Set("gzip", "false")
	}
	for _, e := range o.Excludes {
		q.Add("exclude", e)
	}
	if o.User != "" {
		q.Set("user", o.User)
	}
	resp, err := c.send(ctx, &request{method: http.MethodGet, path: sandboxPath(id, "/files/archive"),
		query: q, accept: "application/gzip, application/x-tar"})
	if err != nil {
		return nil, err
	}
	return resp.Body, nil
}

// Unpacked is what an uploaded archive put in place.
type Unpacked struct {
	Path    string `json:"path"`
	Entries int    `json:"entries"`
	Bytes   int64  `json:"bytes"`
}

// UploadArchive unpacks a tar or tar.gz of at most MaxPut bytes into a
// directory of the sandbox, merging with what is there. The server
// refuses entries that would leave the directory.
func (c *Client) UploadArchive(ctx context.Context, id, path string, archive []byte) (*Unpacked, error) {
	if id == "" {
		return nil, errors.New("emberbox: no sandbox id")
	}
	if len(archive) > MaxPut {
		return nil, fmt.Errorf("emberbox: an archive of %d bytes is over the %d a request may carry", len(archive), MaxPut)
	}
	var u Unpacked
	err := c.do(ctx, &request{method: http.MethodPut, path: sandboxPath(id, "/files/archive"),
		query: url.Values{"path": {path}}, body: archive}, &u)
	if err != nil {
		return nil, err
	}
	return &u, nil
}

// Stat is a file's entry.
type Stat struct {
	Exists bool   `json:"exists"`
	Path   string `json:"path"`
	Type   string `json:"type"` // "file", "directory", "symlink", ...
	Size   int64  `json:"size"`
}

// StatFile reads a path's entry; a missing path answers Exists false.
func (c *Client) StatFile(ctx context.Context, id, path string) (*Stat, error) {
	if id == "" {
		return nil, errors.New("emberbox: no sandbox id")
	}
	var st Stat
	err := c.do(ctx, &request{method: http.MethodGet, path: sandboxPath(id, "/files/stat"),
		query: url.Values{"path": {path}}}, &st)
	if err != nil {
		return nil, err
	}
	return &st, nil
}
