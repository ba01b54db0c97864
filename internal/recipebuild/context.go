package recipebuild

import (
	"archive/tar"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"os"
	"path"
	"strconv"
	"strings"
	"time"

	"github.com/emberbox/emberbox/internal/guest"
)

// The build context is a gzipped tar the client uploaded: hostile input.
// Every entry's name is checked (relative, no ".."), its type limited to
// files, directories and symlinks, and the whole bounded; what a COPY
// takes from it is written into a fresh tar of its own (entries relative
// to the directory it is unpacked in, owned by root), whose digest goes
// into the step's key. The guest's unpack checks the names again.

// ctxEntry is an entry of the context, as the index keeps it.
type ctxEntry struct {
	name string // cleaned, relative
	dir  bool
}

// readContext calls fn for each entry of the gzipped tar at file, in
// order, with its cleaned name, stopping at fn's error.
func readContext(file string, fn func(name string, h *tar.Header, r io.Reader) error) error {
	f, err := os.Open(file)
	if err != nil {
		return fmt.Errorf("opening the build context: %w", err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		return invalid("build context: not a gzipped tar: %v", err)
	}
	defer zr.Close()
	tr := tar.NewReader(zr)
	var n int
	var total int64
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return invalid("build context: reading the archive: %v", err)
		}
		if n++; n > maxContextFiles {
			return invalid("build context: more than %d entries", maxContextFiles)
		}
		if total += max(h.Size, 0); total > maxContextBytes {
			return invalid("build context: more than %d bytes unpacked", int64(maxContextBytes))
		}
		name, err := contextName(h.Name)
		if err != nil {
			return err
		}
		if name == "." {
			continue
		}
		if err := fn(name, h, tr); err != nil {
			return err
		}
	}
}

// contextName cleans an entry's name, refusing one that leaves the
// context.
func contextName(name string) (string, error) {
	if name == "" || len(name) > 4096 || strings.IndexByte(name, 0) >= 0 {
		return "", invalid("build context: an entry name is empty, too long or has a NUL")
	}
	if path.IsAbs(name) {
		return "", invalid("build context: entry %.200q is absolute", name)
	}
	c := path.Clean(name)
	if c == ".." || strings.HasPrefix(c, "../") {
		return "", invalid("build context: entry %.200q leaves the context", name)
	}
	return c, nil
}

// sourceName cleans a COPY source: relative to the context's root, where
// it must stay.
func sourceName(src string) (string, error) {
	c := path.Clean("/" + src)[1:]
	if c == "" {
		c = "."
	}
	if strings.IndexByte(src, 0) >= 0 || len(src) > 4096 {
		return "", fmt.Errorf("source %.100q is not a path", src)
	}
	return c, nil
}

// placement says where one copied entry lands: in op dir, under name.
type placement struct {
	dir, name string
}

// contextOps makes the archives of a COPY from the context at file,
// written under workDir.
func contextOps(file, workDir string, spec *copySpec) ([]copyOp, error) {
	var index []ctxEntry
	if err := readContext(file, func(name string, h *tar.Header, _ io.Reader) error {
		index = append(index, ctxEntry{name: name, dir: h.Typeflag == tar.TypeDir})
		return nil
	}); err != nil {
		return nil, err
	}
	place, err := placeSources(index, spec)
	if err != nil {
		return nil, err
	}
	w := newOpWriter(workDir, spec)
	err = readContext(file, func(name string, h *tar.Header, r io.Reader) error {
		p, ok := place[name]
		if !ok {
			return nil
		}
		return w.add(p, h, r)
	})
	if err == nil {
		return w.close()
	}
	w.abort()
	return nil, err
}

// placeSources says where each context entry the copy's sources take
// lands, by entry name.
func placeSources(index []ctxEntry, spec *copySpec) (map[string]placement, error) {
	rename := len(spec.srcs) == 1 && !strings.HasSuffix(spec.dest, "/") && !strings.ContainsAny(spec.srcs[0], "*?[")
	dest := strings.TrimSuffix(spec.dest, "/")
	if dest == "" {
		dest = "/"
	}
	place := map[string]placement{} // context entry → where it lands
	for _, src := range spec.srcs {
		s, err := sourceName(src)
		if err != nil {
			return nil, invalid("%v", err)
		}
		glob := strings.ContainsAny(s, "*?[")
		if glob {
			if _, err := path.Match(s, ""); err != nil {
				return nil, invalid("source %.100q: %v", src, err)
			}
		}
		tops, isDir := matchSource(index, s, glob)
		if len(tops) == 0 {
			return nil, invalid("%s: not in the build context", src)
		}
		for _, t := range tops {
			if isDir[t] {
				for _, e := range index {
					switch {
					case t == ".":
						place[e.name] = placement{dest, e.name}
					case strings.HasPrefix(e.name, t+"/"):
						place[e.name] = placement{dest, e.name[len(t)+1:]}
					}
				}
				continue
			}
			if rename {
				place[t] = placement{path.Dir(dest), path.Base(dest)}
			} else {
				place[t] = placement{dest, path.Base(t)}
			}
		}
	}
	return place, nil
}

// matchSource finds the entries the source s (a pattern if glob) names at
// its top, and which of them are directories; "." is the whole context.
func matchSource(index []ctxEntry, s string, glob bool) (tops []string, isDir map[string]bool) {
	isDir = map[string]bool{}
	for _, e := range index {
		switch {
		case s == ".":
			isDir["."] = true
		case glob:
			if ok, _ := path.Match(s, e.name); ok {
				tops = append(tops, e.name)
				isDir[e.name] = isDir[e.name] || e.dir
			}
			// A directory listed only through its entries.
			if i := strings.Index(e.name, "/"); i > 0 {
				for p := path.Dir(e.name); p != "."; p = path.Dir(p) {
					if ok, _ := path.Match(s, p); ok && !isDir[p] {
						isDir[p] = true
						tops = append(tops, p)
					}
				}
			}
		case e.name == s:
			tops = append(tops, s)
			isDir[s] = isDir[s] || e.dir
		case strings.HasPrefix(e.name, s+"/"):
			if !isDir[s] {
				tops = append(tops, s)
			}
			isDir[s] = true
		}
	}
	if s == "." {
		tops = []string{"."}
	}
	return tops, isDir
}

// opWriter writes the archives of one copy, one per target directory.
type opWriter struct {
	workDir string
	spec    *copySpec
	ops     map[string]*openOp
	order   []string
}

type openOp struct {
	f     *os.File
	n     countWriter
	tw    *tar.Writer
	sum   hash.Hash // of what is copied: names, types, modes, links, bytes
	names []string
	seen  map[string]bool
}

// countWriter counts the bytes written through it.
type countWriter struct{ n int64 }

func (c *countWriter) Write(p []byte) (int, error) {
	c.n += int64(len(p))
	return len(p), nil
}

func newOpWriter(workDir string, spec *copySpec) *opWriter {
	return &opWriter{workDir: workDir, spec: spec, ops: map[string]*openOp{}}
}

// add writes one entry at p, owned by root, with the copy's mode if it
// has one. Hard links and special files are skipped.
func (w *opWriter) add(p placement, h *tar.Header, r io.Reader) error {
	op, ok := w.ops[p.dir]
	if !ok {
		f, err := os.CreateTemp(w.workDir, "copy-*.tar")
		if err != nil {
			return fmt.Errorf("staging a copy: %w", err)
		}
		op = &openOp{f: f, seen: map[string]bool{}, sum: sha256.New()}
		op.tw = tar.NewWriter(io.MultiWriter(f, &op.n))
		w.ops[p.dir] = op
		w.order = append(w.order, p.dir)
	}
	mode := h.Mode & 0o7777
	if w.spec.chmod != 0 {
		mode = int64(w.spec.chmod)
	}
	nh := &tar.Header{Name: p.name, Mode: mode, ModTime: h.ModTime.Truncate(time.Second), Format: tar.FormatPAX}
	switch h.Typeflag {
	case tar.TypeReg:
		nh.Typeflag, nh.Size = tar.TypeReg, h.Size
	case tar.TypeDir:
		nh.Typeflag, nh.Name = tar.TypeDir, p.name+"/"
	case tar.TypeSymlink:
		if h.Linkname == "" || len(h.Linkname) > 4096 {
			return invalid("build context: symlink %.200q has an empty or overlong target", h.Name)
		}
		nh.Typeflag, nh.Linkname = tar.TypeSymlink, h.Linkname
	default:
		return nil
	}
	if err := op.tw.WriteHeader(nh); err != nil {
		return fmt.Errorf("staging a copy: %w", err)
	}
	// The key follows what lands in the image, not the times the client's
	// files happen to have.
	fmt.Fprintf(op.sum, "%d:%s;%c;%o;%d:%s;%d;", len(nh.Name), nh.Name, nh.Typeflag, nh.Mode, len(nh.Linkname), nh.Linkname, nh.Size)
	if nh.Typeflag == tar.TypeReg {
		if _, err := io.CopyN(io.MultiWriter(op.tw, op.sum), r, h.Size); err != nil {
			return invalid("build context: reading %.200q: %v", h.Name, err)
		}
	}
	top, _, _ := strings.Cut(p.name, "/")
	if !op.seen[top] {
		op.seen[top] = true
		op.names = append(op.names, top)
	}
	return nil
}

func (w *opWriter) close() ([]copyOp, error) {
	var ops []copyOp
	for _, dir := range w.order {
		op := w.ops[dir]
		err := op.tw.Close()
		if cerr := op.f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			w.abort()
			return nil, fmt.Errorf("staging a copy: %w", err)
		}
		ops = append(ops, copyOp{dir: dir, tar: op.f.Name(), size: op.n.n,
			digest: "sha256:" + hex.EncodeToString(op.sum.Sum(nil)), names: op.names})
	}
	return ops, nil
}

func (w *opWriter) abort() {
	for _, op := range w.ops {
		op.f.Close()
		os.Remove(op.f.Name())
	}
}

// fileOps makes the archives of a recipe's files: one per directory.
func fileOps(workDir string, spec *copySpec) ([]copyOp, error) {
	w := newOpWriter(workDir, spec)
	for _, f := range spec.files {
		b, err := fileContent(f)
		if err != nil {
			w.abort()
			return nil, invalid("%s: %v", f.Path, err)
		}
		mode, _ := fileMode(f.Mode)
		h := &tar.Header{Typeflag: tar.TypeReg, Mode: int64(mode), Size: int64(len(b))}
		if err := w.add(placement{path.Dir(f.Path), path.Base(f.Path)}, h, strings.NewReader(string(b))); err != nil {
			w.abort()
			return nil, err
		}
	}
	return w.close()
}

// stagedTar copies a tar from the guest (hostile) into a file under
// workDir through the same checks, entries placed under prefix ("" keeps
// their names), at most limit bytes.
func stagedTar(workDir string, spec *copySpec, dir, prefix string, r io.Reader, limit int64) ([]copyOp, error) {
	w := newOpWriter(workDir, spec)
	tr := tar.NewReader(r)
	var total int64
	for n := 0; ; n++ {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err == nil && n > maxContextFiles {
			err = fmt.Errorf("more than %d entries", maxContextFiles)
		}
		if err == nil {
			if total += max(h.Size, 0); total > limit {
				err = fmt.Errorf("more than %d bytes", limit)
			}
		}
		var name string
		if err == nil {
			name, err = contextName(h.Name)
		}
		if err != nil {
			w.abort()
			return nil, fmt.Errorf("copying from a stage: %w", err)
		}
		if name == "." {
			continue
		}
		if prefix != "" {
			name = prefix
		}
		if err := w.add(placement{dir, name}, h, tr); err != nil {
			w.abort()
			return nil, err
		}
	}
	return w.close()
}

// removeOps deletes the staged archives.
func removeOps(ops []copyOp) {
	for _, op := range ops {
		_ = os.Remove(op.tar)
	}
}

// typeDirectory is a FileEntry's Type of a directory.
const typeDirectory = "directory"

// singleFileOp stages one file read from a stage's guest as dir/name.
func singleFileOp(workDir string, spec *copySpec, dir, name string, fe *guest.FileEntry, r io.Reader) ([]copyOp, error) {
	if fe.Size < 0 || fe.Size > maxCopyBytes {
		return nil, fmt.Errorf("copying %s from a stage: %d bytes is over %d", fe.Path, fe.Size, int64(maxCopyBytes))
	}
	mode, err := strconv.ParseUint(fe.Mode, 8, 32)
	if err != nil {
		mode = 0o644
	}
	w := newOpWriter(workDir, spec)
	h := &tar.Header{Typeflag: tar.TypeReg, Mode: int64(mode & 0o7777), Size: fe.Size, ModTime: fe.ModifiedAt}
	if err := w.add(placement{dir, name}, h, io.LimitReader(r, fe.Size)); err != nil {
		w.abort()
		return nil, err
	}
	return w.close()
}
