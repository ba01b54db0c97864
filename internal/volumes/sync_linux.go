package volumes

import (
	"errors"
	"fmt"
	"io"
	"os"

	"golang.org/x/sys/unix"
)

// datasync is FLUSH: fdatasync, as a flush need not write metadata.
func datasync(f *os.File) error { return unix.Fdatasync(int(f.Fd())) }

// punchHole is TRIM: the blocks become a hole, reading zeros. A failure
// loses nothing.
func punchHole(f *os.File, off, length int64) {
	_ = unix.Fallocate(int(f.Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, off, length)
}

// copyFile makes dst (new) a copy of src: a copy-on-write clone (FICLONE)
// where the filesystem has them, else a copy of src's data extents
// (SEEK_DATA/SEEK_HOLE) that leaves holes as holes. It returns which.
func copyFile(dst, src *os.File, size int64) (string, error) {
	if err := unix.IoctlFileClone(int(dst.Fd()), int(src.Fd())); err == nil {
		return MethodClone, nil
	}
	buf := make([]byte, 1<<20)
	for off := int64(0); off < size; {
		data, err := unix.Seek(int(src.Fd()), off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			break // only a hole is left
		}
		if err != nil {
			return "", fmt.Errorf("finding data: %w", err)
		}
		hole, err := unix.Seek(int(src.Fd()), data, unix.SEEK_HOLE)
		if err != nil {
			return "", fmt.Errorf("finding a hole: %w", err)
		}
		hole = min(hole, size)
		for p := data; p < hole; {
			n, err := src.ReadAt(buf[:min(int64(len(buf)), hole-p)], p)
			if n > 0 {
				if _, werr := dst.WriteAt(buf[:n], p); werr != nil {
					return "", werr
				}
				p += int64(n)
			}
			if err != nil {
				if errors.Is(err, io.EOF) {
					break
				}
				return "", err
			}
		}
		off = hole
	}
	if err := dst.Truncate(size); err != nil {
		return "", err
	}
	return MethodSparseCopy, dst.Sync()
}
