package qemu

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/sys/unix"
)

// A checkpoint's memory can be a delta: the pages of the guest's RAM that
// differ from those of an earlier snapshot of the same sandbox, its base,
// which holds a whole RAM file. The delta is a sparse file of the RAM's
// size in which exactly the differing pages are allocated (a page that
// became zero is written as zeros, so that it is allocated too); baseFile
// names the base's directory. The base is never changed: a delta depends
// on it only for reading, and a snapshot is whole or absent as before. A
// delta is written only while it stays small against the guest's memory
// (deltaMaxShare), else the snapshot is made whole and becomes the base
// of the next ones: so a delta costs the pages an agent's steps changed
// since the last whole one, and a copy costs a whole copy plus the delta.
const (
	memDeltaFile = "mem.delta" // a snapshot's memory as the pages that differ from its base's
	baseFile     = "base"      // a delta snapshot's base: the host path of its directory
	pageSize     = 4096
	// deltaMaxShare: a delta past this share of the guest's allocated
	// memory is not worth it; the snapshot is written whole instead.
	deltaMaxShare = 0.5
	diffChunk     = 1 << 20
)

// extents lists the data ranges of f ([offset, end) pairs): a RAM file is
// mostly holes, and only its data can differ from zeros.
func extents(f *os.File, size int64) ([][2]int64, error) {
	var out [][2]int64
	fd := int(f.Fd())
	for off := int64(0); off < size; {
		data, err := unix.Seek(fd, off, unix.SEEK_DATA)
		if err != nil {
			if errors.Is(err, unix.ENXIO) {
				break
			}
			return nil, err
		}
		hole, err := unix.Seek(fd, data, unix.SEEK_HOLE)
		if err != nil {
			return nil, err
		}
		out = append(out, [2]int64{data, hole})
		off = hole
	}
	return out, nil
}

// union merges two sorted lists of ranges, widened to whole pages.
func union(a, b [][2]int64) [][2]int64 {
	all := append(append([][2]int64(nil), a...), b...)
	for i := range all {
		all[i][0] -= all[i][0] % pageSize
		if r := all[i][1] % pageSize; r != 0 {
			all[i][1] += pageSize - r
		}
	}
	slices.SortFunc(all, func(x, y [2]int64) int { return cmp.Compare(x[0], y[0]) })
	var out [][2]int64
	for _, r := range all {
		if n := len(out); n > 0 && r[0] <= out[n-1][1] {
			out[n-1][1] = max(out[n-1][1], r[1])
			continue
		}
		out = append(out, r)
	}
	return out
}

func allocatedBytes(ranges [][2]int64) int64 {
	var n int64
	for _, r := range ranges {
		n += r[1] - r[0]
	}
	return n
}

// writeMemDelta writes into dir the pages of the RAM file live that differ
// from those of the base snapshot in baseDir (whose RAM file is whole),
// and names the base. It reports false, having written nothing that
// stays, when the base has no usable RAM file or the delta would pass
// deltaMaxShare of live's data: the caller then copies live whole.
func writeMemDelta(live, baseDir, dir string) (bool, error) {
	base, err := os.Open(filepath.Join(baseDir, memFile))
	if err != nil {
		return false, nil // pruned meanwhile, or itself a delta: write whole
	}
	defer base.Close()
	in, err := os.Open(live)
	if err != nil {
		return false, err
	}
	defer in.Close()
	st, err := in.Stat()
	if err != nil {
		return false, err
	}
	if bst, err := base.Stat(); err != nil || bst.Size() != st.Size() {
		return false, nil
	}
	name := filepath.Join(dir, memDeltaFile)
	out, err := os.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return false, err
	}
	defer out.Close()
	ok, err := writeDiff(in, base, out, st.Size())
	if err == nil && ok {
		if err = out.Sync(); err == nil {
			err = os.WriteFile(filepath.Join(dir, baseFile), []byte(baseDir+"\n"), 0o600)
		}
	}
	if err != nil || !ok {
		_ = os.Remove(name)
		return false, err
	}
	return true, nil
}

// writeDiff writes into out (sized as the RAM) the pages of in that differ
// from base's, unless they pass deltaMaxShare of in's data (false).
func writeDiff(in, base, out *os.File, size int64) (bool, error) {
	if err := out.Truncate(size); err != nil {
		return false, err
	}
	liveExt, err := extents(in, size)
	if err != nil {
		return false, err
	}
	baseExt, err := extents(base, size)
	if err != nil {
		return false, err
	}
	limit := int64(deltaMaxShare * float64(allocatedBytes(liveExt)))
	a, b := make([]byte, diffChunk), make([]byte, diffChunk)
	var written int64
	for _, r := range union(liveExt, baseExt) {
		for off := r[0]; off < r[1] && off < size; off += diffChunk {
			n := int(min(diffChunk, r[1]-off, size-off))
			if _, err := in.ReadAt(a[:n], off); err != nil && !errors.Is(err, io.EOF) {
				return false, err
			}
			if _, err := base.ReadAt(b[:n], off); err != nil && !errors.Is(err, io.EOF) {
				return false, err
			}
			for _, run := range differingRuns(a[:n], b[:n]) {
				if written += int64(run[1] - run[0]); written > limit {
					return false, nil
				}
				if _, err := out.WriteAt(a[run[0]:run[1]], off+int64(run[0])); err != nil {
					return false, err
				}
			}
		}
	}
	return true, nil
}

// differingRuns lists the runs of whole pages in which a and b differ, as
// [start, end) byte offsets: runs are written at once.
func differingRuns(a, b []byte) [][2]int {
	var runs [][2]int
	for p := 0; p+pageSize <= len(a); p += pageSize {
		if bytes.Equal(a[p:p+pageSize], b[p:p+pageSize]) {
			continue
		}
		if n := len(runs); n > 0 && runs[n-1][1] == p {
			runs[n-1][1] = p + pageSize
		} else {
			runs = append(runs, [2]int{p, p + pageSize})
		}
	}
	return runs
}

// snapshotMem is where the memory of the snapshot in snapDir is: its whole
// RAM file, or its base's and the delta over it.
func snapshotMem(snapDir string) (whole, delta string, err error) {
	b, err := os.ReadFile(filepath.Join(snapDir, baseFile))
	if errors.Is(err, os.ErrNotExist) {
		return filepath.Join(snapDir, memFile), "", nil
	}
	if err != nil {
		return "", "", err
	}
	base := strings.TrimSpace(string(b))
	// The base is a sibling snapshot directory the driver wrote itself;
	// anything else in the file is refused, not followed.
	if filepath.Dir(base) != filepath.Dir(snapDir) || filepath.Base(base) == "." || strings.ContainsAny(filepath.Base(base), "/\x00") {
		return "", "", fmt.Errorf("snapshot %s names a base outside its siblings", filepath.Base(snapDir))
	}
	return filepath.Join(base, memFile), filepath.Join(snapDir, memDeltaFile), nil
}

// copyMem makes dst (replaced) the memory of the snapshot in snapDir: a
// copy of its whole RAM file, or of its base's with its delta applied.
func copyMem(snapDir, dst string) error {
	whole, delta, err := snapshotMem(snapDir)
	if err != nil {
		return err
	}
	if err := copySparse(whole, dst, 0o600); err != nil {
		return err
	}
	if delta == "" {
		return nil
	}
	return applyDelta(delta, dst)
}

// applyDelta writes the allocated pages of delta over dst.
func applyDelta(delta, dst string) error {
	in, err := os.Open(delta)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	defer out.Close()
	st, err := in.Stat()
	if err != nil {
		return err
	}
	ost, err := out.Stat()
	if err != nil {
		return err
	}
	if st.Size() != ost.Size() {
		return fmt.Errorf("a memory delta of %d bytes over memory of %d", st.Size(), ost.Size())
	}
	ext, err := extents(in, st.Size())
	if err != nil {
		return err
	}
	for _, r := range ext {
		if err := copyRange(in, out, r[0], r[1]-r[0]); err != nil {
			return err
		}
	}
	return nil
}

// memSize is the size of the RAM of the snapshot in snapDir.
func memSize(snapDir string) (int64, error) {
	whole, _, err := snapshotMem(snapDir)
	if err != nil {
		return 0, err
	}
	st, err := os.Stat(whole)
	if err != nil {
		return 0, err
	}
	return st.Size(), nil
}
