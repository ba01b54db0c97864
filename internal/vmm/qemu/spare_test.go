package qemu

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/emberbox/emberbox/internal/vmm"
)

// memorySnapshot lays out, under root, a memory snapshot as Snapshot
// leaves one: its disk over a base image, a sparse RAM file with some
// memory written, and a state.
func memorySnapshot(t *testing.T, img, root string) (snapDir string, rootfs string) {
	t.Helper()
	rootfs = filepath.Join(root, "rootfs.img")
	if err := os.WriteFile(rootfs, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(rootfs, 64<<20); err != nil {
		t.Fatal(err)
	}
	snapDir = filepath.Join(root, "templates", "t1")
	if err := os.MkdirAll(snapDir, 0o700); err != nil {
		t.Fatal(err)
	}
	run(t, img, "create", "-q", "-f", "qcow2", "-F", "raw", "-b", rootfs, filepath.Join(snapDir, snapDiskFile), "64M")
	mem, err := os.OpenFile(filepath.Join(snapDir, memFile), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	if err := mem.Truncate(64 << 20); err != nil {
		t.Fatal(err)
	}
	if _, err := mem.WriteAt([]byte("template memory"), 8<<20); err != nil {
		t.Fatal(err)
	}
	mem.Close()
	if err := os.WriteFile(filepath.Join(snapDir, stateFile), []byte("device state"), 0o600); err != nil {
		t.Fatal(err)
	}
	return snapDir, rootfs
}

// TestCloneTakesTheSpare: a snapshot kept warm has a copy of its memory
// ready; a clone takes it (the file moves, its content is the snapshot's),
// the next is made, and clones of a snapshot not kept copy as before. A
// copy's memory is its own: a write to it reaches neither the snapshot's
// nor the next spare.
func TestCloneTakesTheSpare(t *testing.T) {
	img := qemuImg(t)
	root := t.TempDir()
	snapDir, rootfs := memorySnapshot(t, img, root)
	d := &Driver{cfg: Config{QEMUImg: img}, log: slog.New(slog.DiscardHandler)}
	spare := filepath.Join(snapDir, spareFile)

	spec := func(id string) vmm.Spec {
		return vmm.Spec{ID: id, Dir: filepath.Join(root, "sandboxes", id), MemoryMiB: 64, DiskMiB: 64, Rootfs: rootfs}
	}
	inode := func(p string) uint64 {
		st, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		return st.Sys().(*syscall.Stat_t).Ino
	}

	// Not kept: no spare is made, and a clone copies.
	if err := d.Clone(context.Background(), snapDir, spec("sbx_a")); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(spare); !os.IsNotExist(err) {
		t.Fatalf("a spare of a snapshot not kept: %v", err)
	}

	// A spare left by an earlier process is not trusted: it is made anew.
	if err := os.WriteFile(spare, []byte("left by a crash"), 0o600); err != nil {
		t.Fatal(err)
	}
	d.KeepSpare(snapDir)
	d.waitSpares()
	checkMem(t, spare, "template memory")
	spareIno := inode(spare)
	b := spec("sbx_b")
	if err := d.Clone(context.Background(), snapDir, b); err != nil {
		t.Fatal(err)
	}
	mem := filepath.Join(b.Dir, memFile)
	if got := inode(mem); got != spareIno {
		t.Errorf("the clone's memory is inode %d, want the spare's %d (taken, not copied)", got, spareIno)
	}
	checkMem(t, mem, "template memory")
	if !d.Saved(b) {
		t.Error("the clone holds no saved state")
	}
	d.waitSpares()
	if inode(spare) == spareIno {
		t.Error("no new spare after the clone took one")
	}

	// The copy's memory is its own.
	f, err := os.OpenFile(mem, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte("copy's own mem!"), 8<<20); err != nil {
		t.Fatal(err)
	}
	f.Close()
	checkMem(t, filepath.Join(snapDir, memFile), "template memory")
	checkMem(t, spare, "template memory")

	// Removing the snapshot ends the keeping: a clone fails as before, and
	// no spare is made again.
	if err := os.RemoveAll(snapDir); err != nil {
		t.Fatal(err)
	}
	if err := d.Clone(context.Background(), snapDir, spec("sbx_c")); err == nil {
		t.Error("a clone of a removed snapshot succeeded")
	}
	d.waitSpares()
	if _, err := os.Stat(snapDir); !os.IsNotExist(err) {
		t.Errorf("the removed snapshot's directory came back: %v", err)
	}
}

func checkMem(t *testing.T, p, want string) {
	t.Helper()
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	got := make([]byte, len(want))
	if _, err := f.ReadAt(got, 8<<20); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, []byte(want)) {
		t.Errorf("%s holds %q at 8 MiB, want %q", p, got, want)
	}
	if st, err := f.Stat(); err != nil || st.Size() != 64<<20 {
		t.Errorf("%s: size %v (%v), want 64 MiB", p, st.Size(), err)
	}
}
