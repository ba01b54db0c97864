package envd

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"

	"golang.org/x/sys/unix"
)

const (
	// maxUpload bounds one uploaded file.
	maxUpload = 4 << 30
	// spoolReserve is the free space a spool file leaves on the host's
	// disk; spoolStep is how much it writes between two looks.
	spoolReserve = 1 << 30
	spoolStep    = 64 << 20
)

// spool copies src, whose size is not known beforehand, to a temporary
// file: at most maxUpload bytes, and never into the host's last
// spoolReserve of free space. The file is unlinked at once, so nothing
// is left behind; the caller closes it. It is returned at its start.
func spool(src io.Reader) (*os.File, int64, error) {
	f, err := os.CreateTemp("", "envd-upload-*")
	if err != nil {
		return nil, 0, fmt.Errorf("spooling an upload: %w", err)
	}
	_ = os.Remove(f.Name())
	n, err := spoolCopy(f, src)
	if err == nil {
		_, err = f.Seek(0, io.SeekStart)
	}
	if err != nil {
		f.Close()
		return nil, 0, err
	}
	return f, n, nil
}

func spoolCopy(f *os.File, src io.Reader) (int64, error) {
	var total int64
	for {
		var st unix.Statfs_t
		if err := unix.Fstatfs(int(f.Fd()), &st); err != nil {
			return 0, fmt.Errorf("spooling an upload: %w", err)
		}
		if free := int64(st.Bavail) * int64(st.Bsize); free < spoolReserve+spoolStep {
			return 0, httpErr(http.StatusInsufficientStorage, "the server has no room to take an upload of unknown size")
		}
		n, err := io.CopyN(f, src, spoolStep)
		total += n
		if total > maxUpload {
			return 0, httpErr(http.StatusRequestEntityTooLarge, "a file is at most %d bytes", int64(maxUpload))
		}
		if errors.Is(err, io.EOF) {
			return total, nil
		}
		if err != nil {
			return 0, httpErr(http.StatusBadRequest, "reading the upload: %v", err)
		}
	}
}
