package qemu

import (
	"errors"
	"os"
	"path/filepath"
	"sync"
)

// Spare memory copies.
//
// A copy of a snapshot (Clone) gets its own copy of the snapshot's RAM
// file: some 230 MB for a default guest, about 90 ms on a create's path
// here (ext4: copy_file_range from the page cache), and as much again as
// writeback. A snapshot directory that Clone is asked to keep warm
// (KeepSpare: the manager asks for its templates) holds one copy of its
// RAM file made ahead, which the next Clone takes with a rename, and
// which is then made again in the background. Where the filesystem shares
// extents (FICLONE) a copy is instant anyway and a spare takes no space.
const (
	spareFile = "mem.spare"     // the ready copy, in the snapshot's directory
	spareTmp  = "mem.spare.tmp" // one being made
)

// spares tracks the snapshot directories kept warm and the copies under
// way. The zero value is ready to use.
type spares struct {
	mu     sync.Mutex
	kept   map[string]bool // snapshot directories whose spare is remade
	making map[string]bool // a copy of that directory is under way
	wg     sync.WaitGroup
}

// KeepSpare has Clone keep a copy of the RAM file of the memory snapshot
// in snapDir ready from now on, making the first now (in the background).
// The snapshot must stay as it is while kept (a template does); removing
// its directory ends the keeping.
func (d *Driver) KeepSpare(snapDir string) {
	snapDir = filepath.Clean(snapDir)
	s := &d.spares
	s.mu.Lock()
	if s.kept == nil {
		s.kept, s.making = map[string]bool{}, map[string]bool{}
	}
	if !s.kept[snapDir] && !s.making[snapDir] {
		// A spare this process did not make may not be on disk whole: it
		// is not synced, and the host may have gone down before its
		// writeback. It is made anew.
		_ = os.Remove(filepath.Join(snapDir, spareFile))
	}
	s.kept[snapDir] = true
	s.mu.Unlock()
	d.remakeSpare(snapDir)
}

// takeSpare moves the ready copy of snapDir's RAM file to dst, if there
// is one, and has the next one made. It reports whether it moved one.
func (d *Driver) takeSpare(snapDir, dst string) bool {
	snapDir = filepath.Clean(snapDir)
	s := &d.spares
	s.mu.Lock()
	kept := s.kept[snapDir]
	s.mu.Unlock()
	if !kept {
		return false
	}
	// Rename is atomic: of two clones at once, one takes the spare and
	// the other copies.
	err := os.Rename(filepath.Join(snapDir, spareFile), dst)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		// Another file system (EXDEV) or worse: copies are made on the
		// path from now on, and the spare's space is given back.
		d.log.Warn("a spare memory copy cannot be moved; copying on each clone", "snapshot", snapDir, "err", err)
		s.mu.Lock()
		delete(s.kept, snapDir)
		s.mu.Unlock()
		_ = os.Remove(filepath.Join(snapDir, spareFile))
		return false
	}
	d.remakeSpare(snapDir)
	return err == nil
}

// remakeSpare makes snapDir's spare in the background unless it is there,
// being made, or snapDir is not kept.
func (d *Driver) remakeSpare(snapDir string) {
	s := &d.spares
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.kept[snapDir] || s.making[snapDir] {
		return
	}
	if _, err := os.Stat(filepath.Join(snapDir, spareFile)); err == nil {
		return
	}
	s.making[snapDir] = true
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		err := makeSpare(snapDir)
		s.mu.Lock()
		delete(s.making, snapDir)
		if err != nil {
			delete(s.kept, snapDir) // gone, or no room: tried again on the next KeepSpare
		}
		s.mu.Unlock()
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			d.log.Warn("making a spare memory copy", "snapshot", snapDir, "err", err)
		}
	}()
}

// makeSpare copies snapDir's RAM file to its spare, through a temporary
// name so that a spare present is always whole.
func makeSpare(snapDir string) error {
	tmp := filepath.Join(snapDir, spareTmp)
	if err := copySparse(filepath.Join(snapDir, memFile), tmp, 0o600); err != nil {
		_ = os.Remove(tmp)
		return err
	}
	if err := os.Rename(tmp, filepath.Join(snapDir, spareFile)); err != nil {
		_ = os.Remove(tmp)
		return err
	}
	return nil
}

// waitSpares waits for the spare copies under way (tests).
func (d *Driver) waitSpares() { d.spares.wg.Wait() }
