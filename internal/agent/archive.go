package agent

import (
	"archive/tar"
	"bufio"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"strings"
	"syscall"
	"time"

	"github.com/emberbox/emberbox/internal/agentproto"
)

// Bounds of archives, variables so tests can lower them.
var (
	maxArchiveEntries   = 200_000 // written by file.archive, or unpacked
	maxArchiveDepth     = 64
	maxUnarchiveBytes   = int64(16 << 30) // unpacked bytes of one archive
	maxArchiveLinkBytes = 4096
)

// frameWriter cuts what is written into D frames of at most DataChunk bytes.
type frameWriter struct {
	c   *agentproto.Conn
	buf []byte
}

func (w *frameWriter) Write(p []byte) (int, error) {
	n := len(p)
	for len(p) > 0 {
		k := min(len(p), agentproto.DataChunk-len(w.buf))
		w.buf = append(w.buf, p[:k]...)
		p = p[k:]
		if len(w.buf) == agentproto.DataChunk {
			if err := w.Flush(); err != nil {
				return 0, err
			}
		}
	}
	return n, nil
}

func (w *frameWriter) Flush() error {
	if len(w.buf) == 0 {
		return nil
	}
	err := w.c.WriteFrame(agentproto.KindData, w.buf)
	w.buf = w.buf[:0]
	return err
}

// errSink marks a failure to send, after which nothing more can be said.
type errSink struct{ err error }

func (e *errSink) Error() string { return e.err.Error() }

// sinkWriter tags write errors so they are told apart from file errors.
type sinkWriter struct{ w io.Writer }

func (s sinkWriter) Write(p []byte) (int, error) {
	n, err := s.w.Write(p)
	if err != nil {
		err = &errSink{err}
	}
	return n, err
}

// archive sends the directory root as a tar (gzipped with gz) of its
// contents, names relative to it, symlinks as symlinks, modes and times
// kept; paths in exclude (relative to root) are left out with everything
// below them. It answers Reply{ok} once root is known to be a directory,
// then D frames, then Reply{ok} or an error.
func (a *Agent) archive(c *agentproto.Conn, acct *account, root string, gz bool, exclude []string) error {
	if len(exclude) > agentproto.MaxExcludes {
		return invalid(fmt.Sprintf("at most %d excludes", agentproto.MaxExcludes))
	}
	skip := map[string]bool{}
	for _, e := range exclude {
		if checkPath(e) != nil || path.IsAbs(e) {
			return invalid(fmt.Sprintf("exclude %q must be a path relative to the directory", e))
		}
		skip[path.Clean(e)] = true
	}
	fw := &frameWriter{c: c, buf: make([]byte, 0, agentproto.DataChunk)}
	started := false
	err := a.asUser(acct, func() error {
		fi, err := os.Stat(root)
		if err != nil {
			return fileError(root, err)
		}
		if !fi.IsDir() {
			return &agentproto.Error{Code: agentproto.CodeNotADirectory, Message: root + ": not a directory"}
		}
		if err := c.WriteJSON(agentproto.Reply{OK: true}); err != nil {
			return &errSink{err}
		}
		started = true
		var out io.Writer = sinkWriter{fw}
		var zw *gzip.Writer
		if gz {
			zw = gzip.NewWriter(out)
			out = zw
		}
		tw := tar.NewWriter(out)
		if err := a.archiveTree(tw, root, skip); err != nil {
			return err
		}
		if err := tw.Close(); err != nil {
			return err
		}
		if zw != nil {
			if err := zw.Close(); err != nil {
				return err
			}
		}
		return fw.Flush()
	})
	var sink *errSink
	switch {
	case errors.As(err, &sink):
		return nil // the host is gone or the stream broke: nobody to tell
	case err != nil && !started:
		return err
	case err != nil:
		_ = fw.Flush()
		var pe *agentproto.Error
		if !errors.As(err, &pe) {
			pe = fileError(root, err)
		}
		return pe
	}
	return c.WriteJSON(agentproto.Reply{OK: true})
}

// archiveTree writes the entries below root, depth first, in name order.
func (a *Agent) archiveTree(tw *tar.Writer, root string, skip map[string]bool) error {
	count := 0
	var walk func(dir, rel string, depth int) error
	walk = func(dir, rel string, depth int) error {
		des, err := os.ReadDir(dir)
		if err != nil {
			return fileError(dir, err)
		}
		for _, de := range des {
			name := path.Join(rel, de.Name())
			if skip[name] {
				continue
			}
			if count++; count > maxArchiveEntries {
				return &agentproto.Error{Code: agentproto.CodeTooLarge,
					Message: fmt.Sprintf("%s holds more than %d entries", root, maxArchiveEntries)}
			}
			full := path.Join(dir, de.Name())
			fi, err := os.Lstat(full)
			if err != nil {
				if errors.Is(err, fs.ErrNotExist) {
					continue // removed meanwhile
				}
				return fileError(full, err)
			}
			if err := a.archiveEntry(tw, full, name, fi); err != nil {
				return err
			}
			if fi.IsDir() {
				if depth >= maxArchiveDepth {
					return &agentproto.Error{Code: agentproto.CodeTooLarge,
						Message: fmt.Sprintf("%s is nested more than %d levels deep", root, maxArchiveDepth)}
				}
				if err := walk(full, name, depth+1); err != nil {
					return err
				}
			}
		}
		return nil
	}
	return walk(root, "", 1)
}

// archiveEntry writes one header and, for a regular file, its bytes. A
// file that shrank while read is padded with zeros and one that grew is
// cut at the size its header gave: a tar stream cannot take it back.
func (a *Agent) archiveEntry(tw *tar.Writer, full, name string, fi fs.FileInfo) error {
	h := &tar.Header{Name: name, Mode: int64(unixPerm(fi)), ModTime: fi.ModTime(), Format: tar.FormatPAX}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		h.Uid, h.Gid = int(st.Uid), int(st.Gid)
		h.Uname, h.Gname = a.names.users[h.Uid], a.names.groups[h.Gid]
	}
	var f *os.File
	switch {
	case fi.Mode().IsRegular():
		var err error
		if f, err = os.Open(full); err != nil {
			return fileError(full, err)
		}
		defer f.Close()
		h.Typeflag, h.Size = tar.TypeReg, fi.Size()
	case fi.IsDir():
		h.Typeflag, h.Name = tar.TypeDir, name+"/"
	case fi.Mode()&fs.ModeSymlink != 0:
		target, err := os.Readlink(full)
		if err != nil {
			return fileError(full, err)
		}
		h.Typeflag, h.Linkname = tar.TypeSymlink, target
	default:
		return nil // sockets, pipes, devices: not files to copy
	}
	if err := tw.WriteHeader(h); err != nil {
		return err
	}
	if f == nil {
		return nil
	}
	n, err := io.Copy(tw, io.LimitReader(f, h.Size))
	if err != nil {
		var sink *errSink
		if errors.As(err, &sink) {
			return err
		}
		return fileError(full, err)
	}
	if n < h.Size {
		_, err = io.CopyN(tw, zeros{}, h.Size-n)
	}
	return err
}

type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}

// unarchive unpacks size bytes of tar (gzipped or not: the magic says) from
// r into the directory dst, made if missing, as the user. Every entry must
// land inside dst: absolute names, "..", and paths through symlinks that
// leave dst are refused (os.Root enforces the last), as are hard links to
// outside and devices, fifos and entries of other types. Files of the same
// name are replaced; directories merged. Directory modes are applied last,
// so a read-only directory still takes its contents. A refused entry stops
// the unpacking: what came before it stays. It always consumes size bytes.
func (a *Agent) unarchive(acct *account, dst string, size int64, r io.Reader) (*agentproto.Unpacked, error) {
	if size > agentproto.MaxUnarchive {
		return nil, drainThen(r, size, &agentproto.Error{Code: agentproto.CodeTooLarge,
			Message: fmt.Sprintf("archive of %d bytes is over %d", size, int64(agentproto.MaxUnarchive))})
	}
	body := &countReader{r: io.LimitReader(r, size)}
	var res agentproto.Unpacked
	err := a.asUser(acct, func() error {
		if err := os.MkdirAll(dst, 0o755); err != nil {
			return fileError(dst, err)
		}
		root, err := os.OpenRoot(dst)
		if err != nil {
			return fileError(dst, err)
		}
		defer root.Close()
		br := bufio.NewReader(body)
		var in io.Reader = br
		if magic, _ := br.Peek(2); len(magic) == 2 && magic[0] == 0x1f && magic[1] == 0x8b {
			zr, err := gzip.NewReader(br)
			if err != nil {
				return unsafeArchive("gzip: %v", err)
			}
			in = zr
		}
		return unpack(root, tar.NewReader(in), &res)
	})
	if rest := size - body.n; rest > 0 {
		_, _ = io.CopyN(io.Discard, r, rest)
	}
	if err != nil {
		var pe *agentproto.Error
		if !errors.As(err, &pe) {
			pe = fileError(dst, err)
		}
		return nil, pe
	}
	if body.n != size {
		return nil, invalid(fmt.Sprintf("short body: got %d of %d bytes", body.n, size))
	}
	return &res, nil
}

type countReader struct {
	r io.Reader
	n int64
}

func (c *countReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

func unsafeArchive(format string, args ...any) *agentproto.Error {
	return &agentproto.Error{Code: agentproto.CodeUnsafeArchive, Message: fmt.Sprintf(format, args...)}
}

// entryName checks and cleans a name from an archive: relative, no "..",
// at most maxPath bytes. "." (the directory itself) comes back as ".".
func entryName(name string) (string, error) {
	if name == "" || len(name) > maxPath || strings.IndexByte(name, 0) >= 0 {
		return "", unsafeArchive("entry name %.200q is empty, too long or has NUL", name)
	}
	if path.IsAbs(name) {
		return "", unsafeArchive("entry %.200q is absolute", name)
	}
	for _, seg := range strings.Split(name, "/") {
		if seg == ".." {
			return "", unsafeArchive("entry %.200q leaves the directory", name)
		}
	}
	return path.Clean(name), nil
}

type dirMode struct {
	name string
	mode fs.FileMode
	mod  time.Time
}

// An unpacker writes the entries of one archive under root.
type unpacker struct {
	root *os.Root
	tr   *tar.Reader
	res  *agentproto.Unpacked
	dirs []dirMode // directories made, given their modes once everything is written
}

func unpack(root *os.Root, tr *tar.Reader, res *agentproto.Unpacked) error {
	u := &unpacker{root: root, tr: tr, res: res}
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return unsafeArchive("reading the archive: %v", err)
		}
		if err := u.entry(h); err != nil {
			return err
		}
	}
	return u.restoreDirs()
}

// entry checks the header h and writes its entry. The checks every entry
// shares come first, in this order; those of its type follow in the
// writer of that type.
func (u *unpacker) entry(h *tar.Header) error {
	if u.res.Entries++; u.res.Entries > maxArchiveEntries {
		return &agentproto.Error{Code: agentproto.CodeTooLarge, Message: fmt.Sprintf("archive has more than %d entries", maxArchiveEntries)}
	}
	name, err := entryName(h.Name)
	if err != nil {
		return err
	}
	mode := entryMode(h.Mode)
	if name == "." {
		if h.Typeflag != tar.TypeDir {
			return unsafeArchive("entry %.200q names the directory itself but is not one", h.Name)
		}
		return nil // the target keeps its own mode
	}
	if dir := path.Dir(name); dir != "." {
		if err := u.root.MkdirAll(dir, 0o755); err != nil {
			return entryError(name, err)
		}
	}
	switch h.Typeflag {
	case tar.TypeDir:
		return u.dir(h, name, mode)
	case tar.TypeReg:
		return u.file(h, name, mode)
	case tar.TypeSymlink:
		return u.symlink(h, name)
	case tar.TypeLink:
		return u.link(h, name)
	case tar.TypeXGlobalHeader:
		return nil
	default:
		return unsafeArchive("entry %.200q is of type %q: only files, directories and links are unpacked", h.Name, h.Typeflag)
	}
}

// entryMode keeps the permission and special bits of a tar header's mode.
func entryMode(m int64) fs.FileMode {
	mode := fs.FileMode(m & 0o777)
	if m&0o4000 != 0 {
		mode |= fs.ModeSetuid
	}
	if m&0o2000 != 0 {
		mode |= fs.ModeSetgid
	}
	if m&0o1000 != 0 {
		mode |= fs.ModeSticky
	}
	return mode
}

// dir makes a directory private to the owner until restoreDirs gives it
// its mode, so the entries after it can be written into it.
func (u *unpacker) dir(h *tar.Header, name string, mode fs.FileMode) error {
	if err := u.root.Mkdir(name, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return entryError(name, err)
	}
	if fi, err := u.root.Lstat(name); err != nil || !fi.IsDir() {
		return entryError(name, fmt.Errorf("exists and is not a directory: %w", fs.ErrExist))
	}
	if len(u.dirs) < maxArchiveEntries {
		u.dirs = append(u.dirs, dirMode{name, mode, h.ModTime})
	}
	return nil
}

func (u *unpacker) file(h *tar.Header, name string, mode fs.FileMode) error {
	if h.Size < 0 || u.res.Bytes+h.Size > maxUnarchiveBytes {
		return &agentproto.Error{Code: agentproto.CodeTooLarge, Message: fmt.Sprintf("archive unpacks to more than %d bytes", maxUnarchiveBytes)}
	}
	if err := replace(u.root, name); err != nil {
		return err
	}
	f, err := u.root.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return entryError(name, err)
	}
	n, err := io.Copy(f, u.tr)
	u.res.Bytes += n
	if err == nil {
		err = f.Chmod(mode)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return entryError(name, err)
	}
	_ = u.root.Chtimes(name, h.ModTime, h.ModTime)
	return nil
}

func (u *unpacker) symlink(h *tar.Header, name string) error {
	if h.Linkname == "" || len(h.Linkname) > maxArchiveLinkBytes || strings.IndexByte(h.Linkname, 0) >= 0 {
		return unsafeArchive("symlink %.200q has an empty or overlong target", h.Name)
	}
	if err := replace(u.root, name); err != nil {
		return err
	}
	// Its target may point anywhere: os.Root never follows it out.
	if err := u.root.Symlink(h.Linkname, name); err != nil {
		return entryError(name, err)
	}
	return nil
}

func (u *unpacker) link(h *tar.Header, name string) error {
	old, err := entryName(h.Linkname)
	if err != nil || old == "." {
		return unsafeArchive("hard link %.200q points outside the directory", h.Name)
	}
	if err := replace(u.root, name); err != nil {
		return err
	}
	if err := u.root.Link(old, name); err != nil {
		return entryError(name, err)
	}
	return nil
}

// restoreDirs gives the directories made their modes and times, last made
// first: a directory inside another was made after it, so a parent turns
// read-only only once its children are done.
func (u *unpacker) restoreDirs() error {
	for i := len(u.dirs) - 1; i >= 0; i-- {
		d := u.dirs[i]
		if err := u.root.Chmod(d.name, d.mode); err != nil {
			return entryError(d.name, err)
		}
		_ = u.root.Chtimes(d.name, d.mod, d.mod)
	}
	return nil
}

// replace removes what is at name unless it is a directory, which an
// entry that is not one cannot replace.
func replace(root *os.Root, name string) error {
	fi, err := root.Lstat(name)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil
	case err != nil:
		return entryError(name, err)
	case fi.IsDir():
		return entryError(name, fmt.Errorf("is a directory: %w", syscall.EISDIR))
	}
	if err := root.Remove(name); err != nil {
		return entryError(name, err)
	}
	return nil
}

// entryError names the entry; a path escaping the root is the archive's
// fault, not the file system's.
func entryError(name string, err error) error {
	if strings.Contains(err.Error(), "path escapes from parent") {
		return unsafeArchive("entry %.200q leaves the directory through a symlink", name)
	}
	return fileError(name, err)
}
