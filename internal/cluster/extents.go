package cluster

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"golang.org/x/sys/unix"
)

// A move's files as extents: a guest's memory file is as large as its
// RAM but mostly holes, and a tar carries every byte of it (a 1.5 GiB
// guest took 5 s to move here, nearly all of it zeros through TLS). This
// stream carries each file's data extents alone (SEEK_DATA/SEEK_HOLE):
// per file a length-prefixed JSON header (name, size, extents), then the
// extents' bytes in order; a zero length ends it. The receiver writes
// them at their offsets into a file of the full size, holes kept. Tar
// stays the format of the move-in route older nodes serve.

// Bounds of an extents stream, which the receiver refuses past.
const (
	maxExtentHeader = 16 << 20 // one file's header: its extents list
	maxExtents      = 1 << 20  // extents of one file
)

// fileExtents is a file's header in an extents stream.
type fileExtents struct {
	Name    string     `json:"name"`
	Size    int64      `json:"size"`
	Extents [][2]int64 `json:"extents"` // offset, length; sorted, apart
}

// dataExtents lists the data extents of f, of size bytes: where the
// filesystem cannot say, the whole file.
func dataExtents(f *os.File, size int64) [][2]int64 {
	var out [][2]int64
	fd := int(f.Fd())
	for off := int64(0); off < size; {
		data, err := unix.Seek(fd, off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			break // holes to the end
		}
		if err != nil {
			return [][2]int64{{0, size}} // no SEEK_DATA here: all of it
		}
		hole, err := unix.Seek(fd, data, unix.SEEK_HOLE)
		if err != nil {
			hole = size
		}
		hole = min(hole, size)
		if hole > data {
			out = append(out, [2]int64{data, hole - data})
		}
		off = hole
	}
	return out
}

// writeExtents writes files (name → path) to w as an extents stream.
func writeExtents(w io.Writer, files map[string]string) error {
	names := make([]string, 0, len(files))
	for name := range files {
		names = append(names, name)
	}
	sort.Strings(names)
	bw := bufio.NewWriterSize(w, 1<<20)
	for _, name := range names {
		if err := writeFileExtents(bw, name, files[name]); err != nil {
			return err
		}
	}
	if err := binary.Write(bw, binary.BigEndian, uint32(0)); err != nil {
		return err
	}
	return bw.Flush()
}

func writeFileExtents(w io.Writer, name, path string) error {
	f, st, err := openRegular(name, path)
	if err != nil {
		return err
	}
	defer f.Close()
	ext := dataExtents(f, st.Size())
	hdr, err := json.Marshal(fileExtents{Name: name, Size: st.Size(), Extents: ext})
	if err != nil {
		return err
	}
	if err := binary.Write(w, binary.BigEndian, uint32(len(hdr))); err != nil {
		return err
	}
	if _, err := w.Write(hdr); err != nil {
		return err
	}
	for _, e := range ext {
		if _, err := io.Copy(w, io.NewSectionReader(f, e[0], e[1])); err != nil {
			return err
		}
	}
	return nil
}

// readExtents writes the files of an extents stream into dir, checking
// every name, size and extent before it writes.
func readExtents(r io.Reader, dir string) error {
	br := bufio.NewReaderSize(r, 1<<20)
	for n := 0; ; n++ {
		var l uint32
		if err := binary.Read(br, binary.BigEndian, &l); err != nil {
			return fmt.Errorf("reading the moved files: %w", err)
		}
		if l == 0 {
			return nil
		}
		if n >= maxMoveFiles {
			return errors.New("too many files in a move")
		}
		if l > maxExtentHeader {
			return errors.New("a moved file's header is too large")
		}
		raw := make([]byte, l)
		if _, err := io.ReadFull(br, raw); err != nil {
			return fmt.Errorf("reading the moved files: %w", err)
		}
		var fe fileExtents
		if err := json.Unmarshal(raw, &fe); err != nil {
			return fmt.Errorf("reading the moved files: %w", err)
		}
		if err := fe.check(); err != nil {
			return err
		}
		if err := fe.write(br, filepath.Join(dir, fe.Name)); err != nil {
			return fmt.Errorf("writing moved file %s: %w", fe.Name, err)
		}
	}
}

// check refuses a header whose name is not a plain file name, whose size
// is out of bounds, or whose extents are out of order, overlap or leave
// the file.
func (fe *fileExtents) check() error {
	if fe.Name == "" || fe.Name != filepath.Base(fe.Name) || strings.HasPrefix(fe.Name, ".") ||
		fe.Size < 0 || fe.Size > maxMoveFileSize || len(fe.Extents) > maxExtents {
		return fmt.Errorf("moved file %q refused: want a plain file name, a bounded size and extents", fe.Name)
	}
	end := int64(0)
	for _, e := range fe.Extents {
		if e[0] < end || e[1] <= 0 || e[1] > fe.Size-e[0] {
			return fmt.Errorf("moved file %q refused: its extents overlap or leave the file", fe.Name)
		}
		end = e[0] + e[1]
	}
	return nil
}

// write writes the file's extents from r into a new file name of its
// size, runs of zeros left as holes.
func (fe *fileExtents) write(r io.Reader, name string) error {
	f, err := os.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := f.Truncate(fe.Size); err != nil {
		return err
	}
	buf := make([]byte, 1<<20)
	for _, e := range fe.Extents {
		if err := writeRegion(f, r, e[0], e[1], buf); err != nil {
			return err
		}
	}
	return f.Sync()
}
