package agent

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/emberbox/emberbox/internal/agentproto"
)

const (
	maxListDepth = 10
)

// asUser runs fn with the file-system identity of acct, so the kernel applies
// the user's permissions to every path fn touches. fsuid is per thread: fn
// runs on a thread of its own that is locked and never unlocked, so Go
// discards the thread, and its identity, when fn returns.
func (a *Agent) asUser(acct *account, fn func() error) error {
	if acct.uid == os.Geteuid() {
		return fn()
	}
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		// Groups first: setgroups needs CAP_SETGID, which a non-zero fsuid
		// does not drop but which we do not want to rely on.
		gids := make([]int, len(acct.groups))
		for i, g := range acct.groups {
			gids[i] = int(g)
		}
		if err := unix.Setgroups(gids); err != nil {
			errc <- internal(fmt.Errorf("setgroups: %w", err))
			return
		}
		unix.Setfsgid(acct.gid)
		unix.Setfsuid(acct.uid)
		errc <- fn()
	}()
	return <-errc
}

// fileError maps an OS error to a wire error that names the path.
func fileError(p string, err error) *agentproto.Error {
	var pe *agentproto.Error
	if errors.As(err, &pe) {
		return pe
	}
	code := agentproto.CodeInternal
	switch {
	case errors.Is(err, fs.ErrNotExist):
		code = agentproto.CodeFileNotFound
	case errors.Is(err, syscall.EISDIR):
		code = agentproto.CodeIsADirectory
	case errors.Is(err, syscall.ENOTDIR):
		code = agentproto.CodeNotADirectory
	case errors.Is(err, fs.ErrPermission), errors.Is(err, syscall.EROFS):
		code = agentproto.CodePermission
	case errors.Is(err, syscall.ENOTEMPTY): // before ErrExist, which it also matches
		code = agentproto.CodeNotEmpty
	case errors.Is(err, fs.ErrExist):
		code = agentproto.CodeExists
	case errors.Is(err, syscall.ENOSPC), errors.Is(err, syscall.EDQUOT):
		code = agentproto.CodeNoSpace
	}
	msg := err.Error()
	var pathErr *fs.PathError
	if errors.As(err, &pathErr) {
		msg = fmt.Sprintf("%s: %v", p, pathErr.Err)
	}
	return &agentproto.Error{Code: code, Message: msg}
}

// entry describes the file at p from its lstat result.
func (a *Agent) entry(p string, fi fs.FileInfo) agentproto.FileEntry {
	e := agentproto.FileEntry{
		Name: fi.Name(), Path: p, Size: fi.Size(),
		Mode:       fmt.Sprintf("%o", unixPerm(fi)),
		ModifiedAt: fi.ModTime().UTC(),
	}
	switch {
	case fi.Mode().IsRegular():
		e.Type = agentproto.TypeFile
	case fi.IsDir():
		e.Type = agentproto.TypeDirectory
	case fi.Mode()&fs.ModeSymlink != 0:
		e.Type = agentproto.TypeSymlink
		if t, err := os.Readlink(p); err == nil {
			e.SymlinkTarget = t
		}
	default:
		e.Type = agentproto.TypeOther
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		e.UID, e.GID = int(st.Uid), int(st.Gid)
		e.Owner, e.Group = a.names.users[e.UID], a.names.groups[e.GID]
	}
	return e
}

// unixPerm returns the permission bits with setuid, setgid and sticky in
// their octal places (fs.FileMode keeps them elsewhere).
func unixPerm(fi fs.FileInfo) uint32 {
	m := uint32(fi.Mode().Perm())
	if fi.Mode()&fs.ModeSetuid != 0 {
		m |= 0o4000
	}
	if fi.Mode()&fs.ModeSetgid != 0 {
		m |= 0o2000
	}
	if fi.Mode()&fs.ModeSticky != 0 {
		m |= 0o1000
	}
	return m
}

func (a *Agent) stat(acct *account, p string) (*agentproto.FileEntry, error) {
	var e agentproto.FileEntry
	err := a.asUser(acct, func() error {
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		e = a.entry(p, fi)
		return nil
	})
	if err != nil {
		return nil, fileError(p, err)
	}
	return &e, nil
}

// openRead opens p for reading with the user's rights.
func (a *Agent) openRead(acct *account, p string) (*os.File, *agentproto.FileEntry, error) {
	var f *os.File
	err := a.asUser(acct, func() error {
		var err error
		f, err = os.Open(p)
		return err
	})
	if err != nil {
		return nil, nil, fileError(p, err)
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, nil, fileError(p, err)
	}
	if fi.IsDir() {
		f.Close()
		return nil, nil, &agentproto.Error{Code: agentproto.CodeIsADirectory, Message: p + ": is a directory"}
	}
	e := a.entry(p, fi)
	return f, &e, nil
}

// writeFile atomically replaces p with size bytes from r: it writes a
// temporary file beside p and renames it over p, so a reader never sees a
// half-written file. It always consumes size bytes from r, so the caller's
// stream stays in step even when the write fails.
func (a *Agent) writeFile(acct *account, p string, mode uint32, size int64, r io.Reader) (*agentproto.FileEntry, error) {
	if mode == 0 {
		mode = 0o644
	}
	if mode > 0o7777 {
		return nil, drainThen(r, size, invalid(fmt.Sprintf("invalid mode %o", mode)))
	}
	var tmp *os.File
	err := a.asUser(acct, func() error {
		if fi, err := os.Lstat(p); err == nil && fi.IsDir() {
			return &agentproto.Error{Code: agentproto.CodeIsADirectory, Message: p + ": is a directory"}
		}
		if err := os.MkdirAll(path.Dir(p), 0o755); err != nil {
			return err
		}
		var rnd [6]byte
		_, _ = rand.Read(rnd[:])
		name := path.Join(path.Dir(p), "."+path.Base(p)+".emberbox-"+hex.EncodeToString(rnd[:]))
		var err error
		tmp, err = os.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		return err
	})
	if err != nil {
		return nil, drainThen(r, size, fileError(p, err))
	}
	cleanup := func() { tmp.Close(); os.Remove(tmp.Name()) }
	n, err := io.Copy(tmp, io.LimitReader(r, size))
	if err != nil {
		cleanup()
		var pe *agentproto.Error
		if errors.As(err, &pe) {
			return nil, pe
		}
		if n < size {
			_, _ = io.CopyN(io.Discard, r, size-n)
		}
		return nil, fileError(p, err)
	}
	if n != size {
		cleanup()
		return nil, invalid(fmt.Sprintf("short body: got %d of %d bytes", n, size))
	}
	if err := tmp.Chmod(fs.FileMode(mode & 0o777)); err != nil {
		cleanup()
		return nil, fileError(p, err)
	}
	if err := tmp.Close(); err != nil {
		os.Remove(tmp.Name())
		return nil, fileError(p, err)
	}
	err = a.asUser(acct, func() error { return os.Rename(tmp.Name(), p) })
	if err != nil {
		os.Remove(tmp.Name())
		return nil, fileError(p, err)
	}
	return a.stat(acct, p)
}

func drainThen(r io.Reader, n int64, err error) error {
	_, _ = io.CopyN(io.Discard, r, n)
	return err
}

func (a *Agent) mkdir(acct *account, p string, mode uint32, parents bool) (*agentproto.FileEntry, error) {
	if mode == 0 {
		mode = 0o755
	}
	err := a.asUser(acct, func() error {
		if parents {
			return os.MkdirAll(p, fs.FileMode(mode&0o777))
		}
		return os.Mkdir(p, fs.FileMode(mode&0o777))
	})
	if err != nil {
		return nil, fileError(p, err)
	}
	return a.stat(acct, p)
}

// chmod sets the permission bits of p, following a final symlink as
// chmod(1) does. Under the user's fsuid the kernel allows it only on files
// the user owns (a non-zero fsuid drops CAP_FOWNER), and clears setgid
// where chmod(2) would for that user.
func (a *Agent) chmod(acct *account, p string, mode uint32) (*agentproto.FileEntry, error) {
	if mode > 0o7777 {
		return nil, invalid(fmt.Sprintf("invalid mode %o: only permission bits (at most 7777)", mode))
	}
	err := a.asUser(acct, func() error {
		if err := unix.Chmod(p, mode); err != nil {
			return &fs.PathError{Op: "chmod", Path: p, Err: err}
		}
		return nil
	})
	if err != nil {
		return nil, fileError(p, err)
	}
	return a.stat(acct, p)
}

func (a *Agent) remove(acct *account, p string, recursive bool) (bool, error) {
	if p == "/" || p == acct.home {
		return false, &agentproto.Error{Code: agentproto.CodePermission, Message: fmt.Sprintf("refusing to remove %s", p)}
	}
	removed := false
	err := a.asUser(acct, func() error {
		if _, err := os.Lstat(p); err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		removed = true
		if recursive {
			return os.RemoveAll(p)
		}
		return os.Remove(p)
	})
	if err != nil {
		return false, fileError(p, err)
	}
	return removed, nil
}

// list walks p to depth levels (1: direct children), sorted by path.
func (a *Agent) list(acct *account, p string, depth int, hidden bool, limit int) ([]agentproto.FileEntry, error) {
	if depth <= 0 {
		depth = 1
	}
	depth = min(depth, maxListDepth)
	limit = agentproto.ListLimit(limit)
	var out []agentproto.FileEntry
	err := a.asUser(acct, func() error {
		fi, err := os.Stat(p)
		if err != nil {
			return err
		}
		if !fi.IsDir() {
			return &agentproto.Error{Code: agentproto.CodeNotADirectory, Message: p + ": not a directory"}
		}
		var walk func(dir string, level int) error
		walk = func(dir string, level int) error {
			des, err := os.ReadDir(dir)
			if err != nil {
				if dir != p {
					return nil // an unreadable subdirectory is skipped, not fatal
				}
				return err
			}
			for _, de := range des {
				if len(out) >= limit {
					return nil
				}
				if !hidden && strings.HasPrefix(de.Name(), ".") {
					continue
				}
				child := filepath.Join(dir, de.Name())
				info, err := de.Info()
				if err != nil {
					continue
				}
				out = append(out, a.entry(child, info))
				if de.IsDir() && level < depth {
					if err := walk(child, level+1); err != nil {
						return err
					}
				}
			}
			return nil
		}
		return walk(p, 1)
	})
	if err != nil {
		return nil, fileError(p, err)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Path < out[j].Path })
	return out, nil
}

// rename moves src to dst with rename(2) as the user. Without overwrite an
// existing dst is refused atomically (RENAME_NOREPLACE). Across file
// systems it is refused: a copy would not be the atomic move callers get
// everywhere else.
func (a *Agent) rename(acct *account, src, dst string, overwrite bool) (*agentproto.FileEntry, error) {
	if src == "/" || dst == "/" {
		return nil, &agentproto.Error{Code: agentproto.CodePermission, Message: "refusing to rename /"}
	}
	err := a.asUser(acct, func() error {
		var err error
		if overwrite {
			err = unix.Rename(src, dst)
		} else {
			err = unix.Renameat2(unix.AT_FDCWD, src, unix.AT_FDCWD, dst, unix.RENAME_NOREPLACE)
		}
		switch {
		case err == nil:
			return nil
		case errors.Is(err, unix.EXDEV):
			return &agentproto.Error{Code: agentproto.CodeCrossDevice,
				Message: fmt.Sprintf("%s and %s are on different file systems; copy, then remove", src, dst)}
		case errors.Is(err, unix.EEXIST) && !overwrite:
			return &agentproto.Error{Code: agentproto.CodeExists, Message: dst + ": exists; pass overwrite to replace it"}
		case errors.Is(err, unix.ENOENT):
			if _, lerr := os.Lstat(src); lerr != nil {
				return &fs.PathError{Op: "rename", Path: src, Err: err}
			}
		}
		return &fs.PathError{Op: "rename", Path: dst, Err: err}
	})
	if err != nil {
		p := dst
		var pe *fs.PathError
		if errors.As(err, &pe) {
			p = pe.Path
		}
		return nil, fileError(p, err)
	}
	return a.stat(acct, dst)
}
