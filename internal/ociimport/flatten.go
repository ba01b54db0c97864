package ociimport

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"path"
	"strings"

	"github.com/google/go-containerregistry/pkg/v1/mutate"

	"github.com/emberbox/emberbox/internal/errdefs"
)

// maxDeferredLinks bounds hard links held back until their target is out.
const maxDeferredLinks = 100_000

// Flatten returns one tar of the image's final file system. The library's
// mutate.Extract applies the layers (whiteouts and opaque directories
// honoured, ".." names refused, relative links that climb out dropped); it
// emits the top layer first, so a directory's own entry may follow what is
// in it. The stream it makes is then filtered here so that the tar a
// build VM unpacks is plain:
//   - names are relative and clean; an entry named twice keeps its first
//     (topmost) version;
//   - nothing is put under a path that is not a directory in the final
//     tree (a file or symlink), and no file replaces a directory;
//   - hard links must name a file inside the tree; one whose target comes
//     later is held back to the end, one whose target never comes is
//     dropped (so is a symlink whose relative target climbs out);
//   - only files, directories, symlinks, hard links, device nodes and
//     fifos pass (device nodes are made by root in the VM); modes keep
//     their permission bits, owners are numeric, and of the PAX records
//     only extended attributes (file capabilities) stay.
//
// The file contents and entry count are bounded by the image's Limits.
// Reading fails with the error that stopped the stream; Close ends it.
func (im *Image) Flatten(ctx context.Context) io.ReadCloser {
	pr, pw := io.Pipe()
	go func() { pw.CloseWithError(im.flatten(ctx, pw)) }()
	return pr
}

func (im *Image) flatten(ctx context.Context, w io.Writer) error {
	chk := newLayerCheck(im.diffIDs)
	defer chk.stopped.Store(true)
	src := mutate.Extract(checkedImage{Image: im.img, chk: chk})
	defer src.Close()
	// Closing the extract stream stops the library's goroutine too.
	stop := context.AfterFunc(ctx, func() { src.Close() })
	defer stop()
	f := newFilter(tar.NewWriter(w), im.limits)
	err := f.run(tar.NewReader(src))
	if err == nil {
		// mutate.Extract ends its tar before it reports a failure (a bad
		// layer digest, an unsafe name) on the stream: read to the end.
		if _, err = io.Copy(io.Discard, src); err != nil {
			err = readError(err)
		}
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	// A layer that is not the config's explains any other failure (its
	// bytes need not even be a tar). The tar is left without its end, so
	// no reader takes it for a whole image.
	if bad := chk.mismatch(); bad != nil {
		return bad
	}
	if err != nil {
		return err
	}
	got, err := chk.verified()
	if err != nil {
		return err
	}
	// Before the tar's end: a reader that saw the end sees the key.
	im.setVerified(got)
	return f.tw.Close()
}

// readError classifies a failure reading the layers.
func readError(err error) error {
	if strings.Contains(err.Error(), "unsafe tar path") {
		// mutate.Extract refused a name that climbs out.
		return tooUnsafe("a layer entry leaves the root: %v", err)
	}
	return fmt.Errorf("flattening the image: %w", err)
}

type kind uint8

const (
	kindDir      kind = iota + 1 // a directory entry was written
	kindImplied                  // a directory made by an entry below it
	kindNonDir                   // a file, link, device or fifo
	kindReserved                 // a hard link held back
)

type filter struct {
	tw       *tar.Writer
	lim      Limits
	seen     map[string]kind
	deferred []*tar.Header
	bytes    int64
	entries  int64
}

func newFilter(tw *tar.Writer, lim Limits) *filter {
	return &filter{tw: tw, lim: lim, seen: map[string]kind{}}
}

func (f *filter) run(tr *tar.Reader) error {
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return readError(err)
		}
		out, err := f.admit(h)
		if err != nil {
			return err
		}
		if out == nil {
			continue
		}
		if out.Typeflag == tar.TypeLink && f.seen[out.Linkname] != kindNonDir {
			if len(f.deferred) >= maxDeferredLinks {
				return tooLarge("over %d hard links whose target comes later", maxDeferredLinks)
			}
			f.deferred = append(f.deferred, out)
			f.seen[out.Name] = kindReserved
			continue
		}
		if err := f.write(out, tr); err != nil {
			return err
		}
	}
	for _, h := range f.deferred {
		if f.seen[h.Linkname] != kindNonDir {
			delete(f.seen, h.Name)
			continue // its target is not in the tree
		}
		if err := f.write(h, nil); err != nil {
			return err
		}
	}
	return nil
}

// admit returns the header to write for h, nil to drop it, or an error for
// an entry no image may hold.
func (f *filter) admit(h *tar.Header) (*tar.Header, error) {
	name, ok := cleanName(h.Name)
	if !ok {
		return nil, tooUnsafe("layer entry %q leaves the root", h.Name)
	}
	if name == "" {
		return nil, nil // the root itself
	}
	out := &tar.Header{
		Name: name, Mode: h.Mode & 0o7777, Uid: h.Uid, Gid: h.Gid,
		ModTime: h.ModTime, Format: tar.FormatPAX,
	}
	if h.Uid < 0 || h.Gid < 0 {
		return nil, tooUnsafe("layer entry %q has a negative owner", h.Name)
	}
	if !setType(out, h, name) {
		return nil, nil
	}
	copyXattrs(out, h.PAXRecords)
	if f.shadowed(out) {
		return nil, nil
	}
	return out, nil
}

// setType sets out's type and what goes with it from h, the entry name
// cleaned. It reports false for an entry dropped: a symlink or hard link
// that goes nowhere or climbs out, or a type images we make do not hold.
func setType(out, h *tar.Header, name string) bool {
	switch h.Typeflag {
	case tar.TypeReg, tar.TypeRegA:
		out.Typeflag, out.Size = tar.TypeReg, h.Size
	case tar.TypeDir:
		out.Typeflag = tar.TypeDir
	case tar.TypeSymlink:
		if h.Linkname == "" || strings.ContainsRune(h.Linkname, 0) || climbs(path.Dir(name), h.Linkname) {
			return false
		}
		out.Typeflag, out.Linkname = tar.TypeSymlink, h.Linkname
	case tar.TypeLink:
		target, ok := cleanName(h.Linkname)
		if !ok || target == "" || target == name {
			return false
		}
		out.Typeflag, out.Linkname = tar.TypeLink, target
	case tar.TypeChar, tar.TypeBlock, tar.TypeFifo:
		out.Typeflag, out.Devmajor, out.Devminor = h.Typeflag, h.Devmajor, h.Devminor
	default:
		return false // sparse files, GNU extensions, …: not in images we make
	}
	return true
}

// copyXattrs keeps the extended attributes among records.
func copyXattrs(out *tar.Header, records map[string]string) {
	for k, v := range records {
		if strings.HasPrefix(k, "SCHILY.xattr.") {
			if out.PAXRecords == nil {
				out.PAXRecords = map[string]string{}
			}
			out.PAXRecords[k] = v
		}
	}
}

// shadowed reports whether an upper layer already decided what is at
// out's name, or put a file or symlink on its path.
func (f *filter) shadowed(out *tar.Header) bool {
	name := out.Name
	if k, dup := f.seen[name]; dup && (k != kindImplied || out.Typeflag != tar.TypeDir) {
		// A lower layer's version, or a file where an upper layer has a
		// directory; an implied directory still takes its own entry.
		return true
	}
	for d := path.Dir(name); d != "."; d = path.Dir(d) {
		if k := f.seen[d]; k == kindNonDir || k == kindReserved {
			return true // under a file or symlink of an upper layer
		}
	}
	return false
}

// write writes h (and its content from tr) and records it.
func (f *filter) write(h *tar.Header, tr io.Reader) error {
	f.entries++
	if f.entries > f.lim.MaxEntries {
		return tooLarge("the image has over %d files", f.lim.MaxEntries)
	}
	if h.Typeflag == tar.TypeReg {
		f.bytes += h.Size
		if h.Size < 0 || f.bytes > f.lim.MaxUncompressedBytes {
			return tooLarge("the image's files are over %d MiB", f.lim.MaxUncompressedBytes>>20)
		}
	}
	if err := f.tw.WriteHeader(h); err != nil {
		return fmt.Errorf("writing %s: %w", h.Name, err)
	}
	if h.Typeflag == tar.TypeReg && h.Size > 0 {
		if _, err := io.CopyN(f.tw, tr, h.Size); err != nil {
			return fmt.Errorf("writing %s: %w", h.Name, err)
		}
	}
	if h.Typeflag == tar.TypeDir {
		f.seen[h.Name] = kindDir
	} else {
		f.seen[h.Name] = kindNonDir
	}
	for d := path.Dir(h.Name); d != "."; d = path.Dir(d) {
		if _, ok := f.seen[d]; ok {
			break // its parents are recorded already
		}
		f.seen[d] = kindImplied
	}
	return nil
}

// cleanName makes a layer entry's name relative and clean: "" is the root;
// ok is false for a name that climbs out or holds a NUL.
func cleanName(name string) (string, bool) {
	if strings.ContainsRune(name, 0) || len(name) > 4096 {
		return "", false
	}
	rel := path.Clean("/" + name)
	if strings.Contains(name, "..") {
		// "/" + "../x" cleans to "/x": refuse what climbed instead.
		if c := path.Clean(strings.TrimLeft(name, "/")); c == ".." || strings.HasPrefix(c, "../") {
			return "", false
		}
	}
	return strings.TrimPrefix(rel, "/"), true
}

// climbs reports whether a relative symlink target leaves the root from
// the directory dir.
func climbs(dir, target string) bool {
	if path.IsAbs(target) {
		return false // resolved against the guest's own root
	}
	c := path.Clean(path.Join(dir, target))
	return c == ".." || strings.HasPrefix(c, "../")
}

func tooUnsafe(format string, args ...any) error {
	return errdefs.New(errdefs.ErrInvalidArgument, CodeUnsafe, format, args...)
}
