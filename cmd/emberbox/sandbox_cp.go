package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	emberbox "github.com/emberbox/emberbox/sdk/go"
)

func newSandboxCopyCommand(sf *serverFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "cp SRC DST",
		Short: "Copy a file or directory into or out of a sandbox (one side is ID:/path)",
		Long: "Copy between this machine and a sandbox; the sandbox's side is written\n" +
			"ID:PATH (a relative PATH is under /workspace). As with cp, a file copied to a\n" +
			"directory that exists lands in it under its own name, and so does a directory;\n" +
			"a directory copied to a path that does not exist is created there. Directories\n" +
			"go as tar.gz archives, keeping modes and symlinks.",
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			srcID, src := splitRemote(args[0])
			dstID, dst := splitRemote(args[1])
			if (srcID == "") == (dstID == "") {
				return errors.New("one side, and one only, must be a sandbox's path, ID:/path")
			}
			c, err := sf.client()
			if err != nil {
				return err
			}
			if srcID != "" {
				return copyOut(cmd.Context(), c, srcID, src, dst)
			}
			return copyIn(cmd.Context(), c, src, dstID, dst)
		},
	}
}

// splitRemote reads ID:PATH; a local path is one with a '/' before any
// ':' (write ./a:b for a local file named a:b).
func splitRemote(arg string) (id, p string) {
	i := strings.IndexByte(arg, ':')
	if i <= 0 || strings.Contains(arg[:i], "/") {
		return "", arg
	}
	p = arg[i+1:]
	if p == "" {
		p = "."
	}
	return arg[:i], p
}

// remoteIsDir reports whether p exists in the sandbox as a directory.
func remoteIsDir(ctx context.Context, c *emberbox.Client, id, p string) (bool, error) {
	st, err := c.StatFile(ctx, id, p)
	if err != nil {
		return false, err
	}
	return st.Exists && st.Type == "directory", nil
}

// copyIn copies a local file or directory into a sandbox.
func copyIn(ctx context.Context, c *emberbox.Client, src, id, dst string) error {
	fi, err := os.Stat(src)
	if err != nil {
		return err
	}
	isDir, err := remoteIsDir(ctx, c, id, dst)
	if err != nil {
		return err
	}
	if isDir || strings.HasSuffix(dst, "/") {
		dst = path.Join(dst, filepath.Base(filepath.Clean(src)))
	}
	if !fi.IsDir() {
		data, err := os.ReadFile(src)
		if err != nil {
			return err
		}
		return c.WriteFile(ctx, id, dst, data, fi.Mode().Perm())
	}
	root, err := os.OpenRoot(src)
	if err != nil {
		return err
	}
	defer root.Close()
	return uploadTree(ctx, c, id, dst, root.FS())
}

// Archive batching: one request carries at most emberbox.MaxPut bytes.
const (
	archiveBatch = emberbox.MaxPut * 3 / 4 // start a new archive past this
	bigFile      = emberbox.MaxPut / 2     // larger files go alone, as files
)

// uploadTree sends a directory tree as tar.gz archives of at most MaxPut
// bytes each, unpacked into dst one after another; files too large for an
// archive go by themselves.
func uploadTree(ctx context.Context, c *emberbox.Client, id, dst string, tree fs.FS) error {
	u := &treeUpload{ctx: ctx, c: c, id: id, dst: dst, tree: tree}
	u.start()
	// The root itself first, so that an empty directory is made too.
	if err := fs.WalkDir(tree, ".", u.visit); err != nil {
		return err
	}
	return u.send()
}

// treeUpload is one uploadTree: the tree, where it goes, and the archive
// being filled.
type treeUpload struct {
	ctx     context.Context
	c       *emberbox.Client
	id, dst string
	tree    fs.FS

	buf     bytes.Buffer
	gz      *gzip.Writer
	tw      *tar.Writer
	entries int
}

// start begins a new, empty archive.
func (u *treeUpload) start() {
	u.buf.Reset()
	u.gz = gzip.NewWriter(&u.buf)
	u.tw = tar.NewWriter(u.gz)
	u.entries = 0
}

// send has the archive unpacked into dst, unless it is empty, and starts
// the next.
func (u *treeUpload) send() error {
	if err := u.tw.Close(); err != nil {
		return err
	}
	if err := u.gz.Close(); err != nil {
		return err
	}
	if u.entries > 0 {
		if _, err := u.c.UploadArchive(u.ctx, u.id, u.dst, u.buf.Bytes()); err != nil {
			return fmt.Errorf("unpacking into %s: %w", u.dst, err)
		}
	}
	u.start()
	return nil
}

// visit is the walk's function: a large file goes by itself, devices,
// sockets and fifos not at all, anything else into the archive (sent
// first if the entry would take it past archiveBatch).
func (u *treeUpload) visit(name string, d fs.DirEntry, err error) error {
	if err != nil {
		return err
	}
	fi, err := d.Info()
	if err != nil {
		return err
	}
	var link string
	switch {
	case fi.Mode()&fs.ModeSymlink != 0:
		if link, err = fs.ReadLink(u.tree, name); err != nil {
			return err
		}
	case fi.Mode().IsRegular() && fi.Size() > bigFile:
		data, err := fs.ReadFile(u.tree, name)
		if err != nil {
			return err
		}
		return u.c.WriteFile(u.ctx, u.id, path.Join(u.dst, name), data, fi.Mode().Perm())
	case !fi.IsDir() && !fi.Mode().IsRegular():
		return nil // devices, sockets, fifos: nothing to copy
	}
	if u.buf.Len()+int(fi.Size()) > archiveBatch {
		if err := u.send(); err != nil {
			return err
		}
	}
	return u.add(name, fi, link)
}

// add writes one entry, and a regular file's content, to the archive.
func (u *treeUpload) add(name string, fi fs.FileInfo, link string) error {
	hdr, err := tar.FileInfoHeader(fi, link)
	if err != nil {
		return err
	}
	hdr.Name = name
	if fi.IsDir() {
		hdr.Name += "/"
	}
	hdr.Uname, hdr.Gname, hdr.Uid, hdr.Gid = "", "", 0, 0
	if err := u.tw.WriteHeader(hdr); err != nil {
		return err
	}
	if fi.Mode().IsRegular() {
		f, err := u.tree.Open(name)
		if err != nil {
			return err
		}
		_, err = io.CopyN(u.tw, f, fi.Size())
		f.Close()
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
	}
	u.entries++
	return u.gz.Flush() // so that buf.Len() counts what this entry costs
}

// copyOut copies a file or directory of a sandbox to this machine.
func copyOut(ctx context.Context, c *emberbox.Client, id, src, dst string) error {
	st, err := c.StatFile(ctx, id, src)
	if err != nil {
		return err
	}
	if !st.Exists {
		return fmt.Errorf("%s:%s does not exist", id, src)
	}
	if fi, err := os.Stat(dst); err == nil && fi.IsDir() {
		dst = filepath.Join(dst, path.Base(st.Path))
	}
	if st.Type != "directory" {
		f, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
		if err != nil {
			return err
		}
		if _, err := c.ReadFile(ctx, id, src, f); err != nil {
			f.Close()
			return err
		}
		return f.Close()
	}
	if err := os.MkdirAll(dst, 0o755); err != nil {
		return err
	}
	rc, err := c.DownloadArchive(ctx, id, src, emberbox.ArchiveOptions{})
	if err != nil {
		return err
	}
	defer rc.Close()
	return extractTree(rc, dst)
}

// extractTree unpacks a tar.gz into dir. The archive comes from the
// sandbox: every name must stay inside dir, and os.Root refuses any path
// that would leave it, through symlinks too.
func extractTree(r io.Reader, dir string) error {
	gz, err := gzip.NewReader(r)
	if err != nil {
		return fmt.Errorf("reading the archive: %w", err)
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		return err
	}
	defer root.Close()
	tr := tar.NewReader(gz)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("reading the archive: %w", err)
		}
		name := path.Clean(strings.TrimPrefix(hdr.Name, "./"))
		if name == "." {
			continue
		}
		if !filepath.IsLocal(name) {
			return fmt.Errorf("the archive names %q, outside the directory", hdr.Name)
		}
		mode := fs.FileMode(hdr.Mode).Perm()
		switch hdr.Typeflag {
		case tar.TypeDir:
			if err := root.MkdirAll(name, 0o755); err != nil {
				return err
			}
			if err := root.Chmod(name, mode|0o700); err != nil {
				return err
			}
		case tar.TypeReg:
			if err := root.MkdirAll(path.Dir(name), 0o755); err != nil {
				return err
			}
			f, err := root.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, mode)
			if err != nil {
				return err
			}
			_, err = io.Copy(f, tr)
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return fmt.Errorf("%s: %w", name, err)
			}
			if err := root.Chmod(name, mode); err != nil {
				return err
			}
		case tar.TypeSymlink:
			if err := root.MkdirAll(path.Dir(name), 0o755); err != nil {
				return err
			}
			_ = root.Remove(name)
			if err := root.Symlink(hdr.Linkname, name); err != nil {
				return err
			}
		}
	}
}
