package volumes

import (
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
