package qemu

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/emberbox/emberbox/internal/vmm"
)

// moveHost is one node's files for a move test: a base image, a snapshot
// disk over it and a paused copy of that snapshot.
type moveHost struct {
	d      *Driver
	rootfs string
	spec   vmm.Spec
}

func qemuImg(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("qemu-img")
	if err != nil {
		t.Skip("qemu-img not installed")
	}
	return p
}

func run(t *testing.T, name string, args ...string) string {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %v: %v: %s", name, args, err, out)
	}
	return string(out)
}

// pausedCopy lays out, under root, a sandbox paused as Clone and Pause leave
// a copy of a snapshot: its overlay over the snapshot's disk, the chain file
// naming that disk, a sparse RAM file with some memory written and a state.
func pausedCopy(t *testing.T, img, root string) moveHost {
	t.Helper()
	h := moveHost{d: &Driver{cfg: Config{QEMUImg: img}}, rootfs: filepath.Join(root, "rootfs.img")}
	if err := os.WriteFile(h.rootfs, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(h.rootfs, 64<<20); err != nil {
		t.Fatal(err)
	}
	snapDir := filepath.Join(root, "snapshots", "snap_1")
	h.spec = vmm.Spec{ID: "sbx_1", Dir: filepath.Join(root, "sandboxes", "sbx_1"), MemoryMiB: 64, DiskMiB: 64, Rootfs: h.rootfs}
	for _, dir := range []string{snapDir, h.spec.Dir} {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	snapDisk := filepath.Join(snapDir, snapDiskFile)
	run(t, img, "create", "-q", "-f", "qcow2", "-F", "raw", "-b", h.rootfs, snapDisk, "64M")
	if err := h.d.Clone(context.Background(), snapDir, h.spec); err != nil {
		t.Fatal(err) // a disk snapshot: the overlay, the chain file and empty memory
	}
	mem, err := os.OpenFile(filepath.Join(h.spec.Dir, memFile), os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := mem.WriteAt([]byte("guest memory"), 8<<20); err != nil {
		t.Fatal(err)
	}
	mem.Close()
	if err := os.WriteFile(filepath.Join(h.spec.Dir, stateFile), []byte("device state"), 0o600); err != nil {
		t.Fatal(err)
	}
	return h
}

func backingOf(t *testing.T, img, name string) string {
	t.Helper()
	var info struct {
		Backing string `json:"backing-filename"`
		Format  string `json:"backing-filename-format"`
	}
	if err := json.Unmarshal([]byte(run(t, img, "info", "--output=json", "-U", "-f", "qcow2", name)), &info); err != nil {
		t.Fatal(err)
	}
	return info.Format + ":" + info.Backing
}

// moveTo copies files into a new node's directory as the cluster's
// transfer does, holes kept.
func moveTo(t *testing.T, files map[string]string, dir string) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	for name, src := range files {
		if strings.Contains(name, "/") {
			t.Fatalf("move file name %q has a slash", name)
		}
		if err := copySparse(src, filepath.Join(dir, name), 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

func TestMovePausedCopy(t *testing.T) {
	img := qemuImg(t)
	ctx := context.Background()
	old := pausedCopy(t, img, t.TempDir())
	if !old.d.Saved(old.spec) {
		t.Fatal("the paused copy has no saved state")
	}
	files, err := old.d.MoveFiles(old.spec)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		memFile: filepath.Join(old.spec.Dir, memFile), stateFile: filepath.Join(old.spec.Dir, stateFile),
		diskFile: filepath.Join(old.spec.Dir, diskFile), movedSnapFile: filepath.Join(filepath.Dir(filepath.Dir(old.spec.Dir)), "snapshots", "snap_1", snapDiskFile),
	}
	if len(files) != len(want) {
		t.Fatalf("MoveFiles = %v, want %v", files, want)
	}
	for name, p := range want {
		if files[name] != p {
			t.Errorf("MoveFiles[%q] = %q, want %q", name, files[name], p)
		}
	}

	// The new node has the base image at the same path; its data dir is
	// another.
	spec := old.spec
	spec.Dir = filepath.Join(t.TempDir(), "sandboxes", "sbx_1")
	moveTo(t, files, spec.Dir)
	if !old.d.Saved(spec) {
		t.Fatal("the moved state is not there")
	}
	if err := old.d.Moved(ctx, spec); err != nil {
		t.Fatal(err)
	}
	snap := filepath.Join(spec.Dir, movedSnapFile)
	if got := backingOf(t, img, filepath.Join(spec.Dir, diskFile)); got != "qcow2:"+snap {
		t.Errorf("the moved overlay is over %q, want qcow2:%s", got, snap)
	}
	if got := backingOf(t, img, snap); got != "raw:"+old.rootfs {
		t.Errorf("the moved snapshot disk is over %q, want raw:%s", got, old.rootfs)
	}
	if f := hostFiles(spec); f.SnapDisk != snap || f.Disk != filepath.Join(spec.Dir, diskFile) {
		t.Errorf("the moved VM would open %+v, want its snapshot disk at %s", f, snap)
	}
	if st, err := os.Stat(snap); err != nil || st.Mode().Perm() != 0o644 {
		t.Errorf("the moved snapshot disk: %v, %v; want mode 0644 (VMs read it as their uid)", st.Mode(), err)
	}
	// The RAM file stayed sparse and kept what the guest wrote.
	var st unix.Stat_t
	if err := unix.Stat(filepath.Join(spec.Dir, memFile), &st); err != nil {
		t.Fatal(err)
	}
	if st.Size != 64<<20 || st.Blocks*512 >= 16<<20 {
		t.Errorf("moved RAM file: size %d, %d bytes allocated; want 64 MiB, sparse", st.Size, st.Blocks*512)
	}
	mem, _ := os.ReadFile(filepath.Join(spec.Dir, memFile))
	if len(mem) != 64<<20 || string(mem[8<<20:8<<20+12]) != "guest memory" {
		t.Error("the moved RAM file lost the guest's memory")
	}
	if !old.d.Saved(spec) {
		t.Error("the moved sandbox is not resumable")
	}

	// Moved again (a second move of the same sandbox) names its own copy.
	files, err = old.d.MoveFiles(spec)
	if err != nil || files[movedSnapFile] != snap {
		t.Errorf("MoveFiles of a moved copy: %v, %v; want its snapshot disk at %s", files, err, snap)
	}
}

func TestMovePausedBoot(t *testing.T) {
	img := qemuImg(t)
	ctx := context.Background()
	root := t.TempDir()
	h := pausedCopy(t, img, root)
	// A sandbox booted from the base image: its overlay is over it and
	// there is no chain file.
	if err := h.d.createOverlay(ctx, h.spec, "", h.rootfs, "raw"); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(h.spec.Dir, chainFile)); err != nil {
		t.Fatal(err)
	}
	files, err := h.d.MoveFiles(h.spec)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := files[movedSnapFile]; ok || len(files) != 3 {
		t.Errorf("MoveFiles of a booted sandbox = %v, want mem, state and disk", files)
	}
	spec := h.spec
	spec.Dir = filepath.Join(t.TempDir(), "sbx_1")
	moveTo(t, files, spec.Dir)
	// A chain file that came along (from a hostile or confused peer)
	// names a path of that host, not one this host chose.
	if err := os.WriteFile(filepath.Join(spec.Dir, chainFile), []byte("/etc/shadow\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := h.d.Moved(ctx, spec); err != nil {
		t.Fatal(err)
	}
	if got := backingOf(t, img, filepath.Join(spec.Dir, diskFile)); got != "raw:"+h.rootfs {
		t.Errorf("the moved overlay is over %q, want raw:%s", got, h.rootfs)
	}
	if f := hostFiles(spec); f.SnapDisk != "" {
		t.Errorf("the moved VM would open a snapshot disk %q", f.SnapDisk)
	}
}

func TestMovedRefusesForeignFiles(t *testing.T) {
	img := qemuImg(t)
	ctx := context.Background()
	h := pausedCopy(t, img, t.TempDir())
	files, err := h.d.MoveFiles(h.spec)
	if err != nil {
		t.Fatal(err)
	}
	for name, spoil := range map[string]func(dir string) error{
		"a RAM file that is a link": func(dir string) error {
			if err := os.Remove(filepath.Join(dir, memFile)); err != nil {
				return err
			}
			return os.Symlink("/etc/passwd", filepath.Join(dir, memFile))
		},
		"a RAM file of another size": func(dir string) error { return os.Truncate(filepath.Join(dir, memFile), 1<<20) },
		"no state":                   func(dir string) error { return os.Remove(filepath.Join(dir, stateFile)) },
		"a disk with an external data file": func(dir string) error {
			_, err := exec.Command(img, "create", "-q", "-f", "qcow2", "-o", "data_file="+filepath.Join(dir, "data"),
				filepath.Join(dir, diskFile), "64M").CombinedOutput()
			return err
		},
		"a disk that is not qcow2": func(dir string) error {
			return os.WriteFile(filepath.Join(dir, diskFile), make([]byte, 4096), 0o600)
		},
	} {
		t.Run(name, func(t *testing.T) {
			spec := h.spec
			spec.Dir = filepath.Join(t.TempDir(), "sbx_1")
			moveTo(t, files, spec.Dir)
			if err := spoil(spec.Dir); err != nil {
				t.Fatal(err)
			}
			if err := h.d.Moved(ctx, spec); err == nil {
				t.Error("Moved accepted it")
			}
		})
	}
	if _, err := h.d.MoveFiles(vmm.Spec{Dir: t.TempDir()}); err == nil {
		t.Error("MoveFiles of a directory with no saved state succeeded")
	}
}

// snapshotDir lays out under root a memory snapshot as Snapshot leaves
// one: whole, or (with base) as a difference over base's memory.
func snapshotDir(t *testing.T, img, root, id, rootfs, base string) string {
	t.Helper()
	dir := filepath.Join(root, "snapshots", id)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	run(t, img, "create", "-q", "-f", "qcow2", "-F", "raw", "-b", rootfs, filepath.Join(dir, snapDiskFile), "64M")
	mem := memFile
	if base != "" {
		mem = memDeltaFile
		if err := os.WriteFile(filepath.Join(dir, baseFile), []byte(base+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	f, err := os.Create(filepath.Join(dir, mem))
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(64 << 20); err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte(id), 4<<20); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if err := os.WriteFile(filepath.Join(dir, stateFile), []byte("device state"), 0o600); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestMoveCheckpoint: a whole checkpoint and a difference over it move to
// a node whose paths differ; the difference's base and the disks' backing
// are this node's, never what came in the files.
func TestMoveCheckpoint(t *testing.T) {
	img := qemuImg(t)
	ctx := context.Background()
	d := &Driver{cfg: Config{QEMUImg: img}}
	oldRoot, newRoot := t.TempDir(), t.TempDir()
	rootfs := map[string]string{}
	for _, root := range []string{oldRoot, newRoot} {
		rootfs[root] = filepath.Join(root, "rootfs.img")
		if err := os.WriteFile(rootfs[root], nil, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Truncate(rootfs[root], 64<<20); err != nil {
			t.Fatal(err)
		}
	}
	baseOld := snapshotDir(t, img, oldRoot, "ckpt_base", rootfs[oldRoot], "")
	deltaOld := snapshotDir(t, img, oldRoot, "ckpt_delta", rootfs[oldRoot], baseOld)

	files, err := d.SnapshotFiles(deltaOld)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := files[memDeltaFile]; !ok || len(files) != 3 || files[memFile] != "" || files[baseFile] != "" {
		t.Fatalf("SnapshotFiles of a difference = %v, want state, disk and the difference alone", files)
	}
	baseNew := filepath.Join(newRoot, "snapshots", "ckpt_base")
	deltaNew := filepath.Join(newRoot, "snapshots", "ckpt_delta")
	spec := func(dir string) vmm.Spec { return vmm.Spec{Dir: dir, Rootfs: rootfs[newRoot], MemoryMiB: 64} }

	// The difference cannot arrive before its base.
	moveTo(t, files, deltaNew)
	if err := d.SnapshotMoved(ctx, spec(deltaNew), baseNew); err == nil {
		t.Fatal("a difference moved in without its base")
	}
	baseFiles, err := d.SnapshotFiles(baseOld)
	if err != nil {
		t.Fatal(err)
	}
	moveTo(t, baseFiles, baseNew)
	if err := d.SnapshotMoved(ctx, spec(baseNew), ""); err != nil {
		t.Fatal(err)
	}
	if err := d.SnapshotMoved(ctx, spec(deltaNew), baseNew); err != nil {
		t.Fatal(err)
	}
	for _, dir := range []string{baseNew, deltaNew} {
		if got := backingOf(t, img, filepath.Join(dir, snapDiskFile)); got != "raw:"+rootfs[newRoot] {
			t.Errorf("%s's disk is over %s, want this node's base image", filepath.Base(dir), got)
		}
	}
	if b, _ := os.ReadFile(filepath.Join(deltaNew, baseFile)); strings.TrimSpace(string(b)) != baseNew {
		t.Errorf("the difference names base %q, want %q", b, baseNew)
	}
	dst := filepath.Join(t.TempDir(), "mem")
	if err := copyMem(deltaNew, dst); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len("ckpt_delta"))
	f, err := os.Open(dst)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.ReadAt(got, 4<<20); err != nil || string(got) != "ckpt_delta" {
		t.Errorf("the moved checkpoint's memory reads %q, %v", got, err)
	}

	// A memory of another size is refused.
	if err := d.SnapshotMoved(ctx, vmm.Spec{Dir: baseNew, Rootfs: rootfs[newRoot], MemoryMiB: 128}, ""); err == nil {
		t.Error("a checkpoint's memory of the wrong size was accepted")
	}
}

// TestMoveDiskSnapshot: a disk snapshot moves as its disk alone, and a
// memory file sent beside it is not kept.
func TestMoveDiskSnapshot(t *testing.T) {
	img := qemuImg(t)
	ctx := context.Background()
	d := &Driver{cfg: Config{QEMUImg: img}}
	root := t.TempDir()
	rootfs := filepath.Join(root, "rootfs.img")
	if err := os.WriteFile(rootfs, make([]byte, 1<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(root, "snapshots", "snap_disk")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	run(t, img, "create", "-q", "-f", "qcow2", "-F", "raw", "-b", rootfs, filepath.Join(dir, snapDiskFile), "1M")
	files, err := d.SnapshotFiles(dir)
	if err != nil || len(files) != 1 || files[snapDiskFile] == "" {
		t.Fatalf("SnapshotFiles of a disk snapshot = %v, %v; want its disk alone", files, err)
	}
	moved := filepath.Join(t.TempDir(), "snap_disk")
	moveTo(t, files, moved)
	if err := os.WriteFile(filepath.Join(moved, memFile), []byte("not asked for"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := d.SnapshotMoved(ctx, vmm.Spec{Dir: moved, Rootfs: rootfs}, ""); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(moved, memFile)); !os.IsNotExist(err) {
		t.Errorf("a memory file sent with a disk snapshot was kept: %v", err)
	}
	if got := backingOf(t, img, filepath.Join(moved, snapDiskFile)); got != "raw:"+rootfs {
		t.Errorf("the moved disk is over %s", got)
	}
	if err := d.SnapshotMoved(ctx, vmm.Spec{Dir: moved, Rootfs: rootfs}, filepath.Join(root, "snapshots", "x")); err == nil {
		t.Error("a disk snapshot moved in as a difference over a base")
	}
}
