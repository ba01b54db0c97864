package ociimport

import (
	"archive/tar"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"
)

// VM is a build sandbox BuildRootfs works in: a throwaway VM of ours whose
// root disk has room for the image about three times over (its tar, the
// unpacked tree and the ext4 image), with tar and mkfs.ext4 (e2fsprogs ≥
// 1.43) installed, as the default image has.
type VM interface {
	// Run runs a /bin/sh script as root, streaming its output to log; a
	// non-zero exit is an error carrying the end of the output.
	Run(ctx context.Context, script string, log io.Writer) error
	// WriteFile writes exactly size bytes from r to path, as root.
	WriteFile(ctx context.Context, path string, r io.Reader, size int64) error
	// ReadFile copies the file at path to w, as root, and returns its size.
	ReadFile(ctx context.Context, path string, w io.Writer) (int64, error)
}

// vmWorkDir is where a build VM keeps the import: on its root disk, not a
// tmpfs.
const vmWorkDir = "/var/tmp/emberbox-import"

// RootfsName is the file BuildRootfs writes in its directory.
const RootfsName = "rootfs.img"

// vmFlatTar is the flattened image, gzipped, as the VM gets it;
// vmImageTar the sparse tar of the ext4 image it hands back.
const (
	vmFlatTar  = "fs.tar.gz"
	vmImageTar = "rootfs.tar"
)

// BuildRootfs makes a sandbox root file system of img in vm and copies it
// to dir/rootfs.img on the host; it returns that path and its size. It is
// Stage, then BuildStaged.
func BuildRootfs(ctx context.Context, vm VM, img *Image, dir string, log io.Writer) (string, int64, error) {
	st, err := Stage(ctx, img, dir, log)
	if err != nil {
		return "", 0, err
	}
	defer st.Remove()
	return BuildStaged(ctx, vm, st, log)
}

// Staged is an image flattened on the host (every layer checked against
// its config), ready to go into a build VM.
type Staged struct {
	dir  string
	path string // the gzipped flattened tar
	size int64
}

// Remove removes the staged tar.
func (st *Staged) Remove() { os.Remove(st.path) }

// Stage flattens img into dir, gzipped (the VM interface takes a sized
// stream). It needs no VM, so an image whose layers are not its config's
// is refused before one is started.
func Stage(ctx context.Context, img *Image, dir string, log io.Writer) (*Staged, error) {
	start := time.Now()
	tarPath := filepath.Join(dir, vmFlatTar)
	fmt.Fprintf(log, "import: flattening %d layers of %s\n", img.Layers(), img.Digest())
	raw, size, err := stage(ctx, img, tarPath)
	if err != nil {
		os.Remove(tarPath)
		return nil, err
	}
	fmt.Fprintf(log, "import: flattened to a tar of %d MiB, %d MiB gzipped, every layer verified (%.1fs)\n",
		raw>>20, size>>20, time.Since(start).Seconds())
	return &Staged{dir: dir, path: tarPath, size: size}, nil
}

// BuildStaged makes the root file system of a staged image in vm, into
// the staged directory's rootfs.img: the tar is unpacked as root in the
// VM with owners, modes, device nodes and file capabilities kept; the
// sandbox user is added there, and mkfs.ext4 -d makes the image. Nothing
// of the image is unpacked on the host. Progress lines and the VM's
// output go to log. The staged tar is removed once in the VM.
func BuildStaged(ctx context.Context, vm VM, st *Staged, log io.Writer) (string, int64, error) {
	start := time.Now()
	lap := start
	// step logs a line with the time the previous step took.
	step := func(format string, args ...any) {
		now := time.Now()
		fmt.Fprintf(log, "import: %s (%.1fs)\n", fmt.Sprintf(format, args...), now.Sub(lap).Seconds())
		lap = now
	}
	dir, tarPath, size := st.dir, st.path, st.size
	defer st.Remove()
	if err := vm.Run(ctx, "set -eu\nrm -rf "+vmWorkDir+"\nmkdir -p "+vmWorkDir+"\n", log); err != nil {
		return "", 0, fmt.Errorf("preparing the build VM: %w", err)
	}
	f, err := os.Open(tarPath)
	if err != nil {
		return "", 0, err
	}
	err = vm.WriteFile(ctx, vmWorkDir+"/"+vmFlatTar, f, size)
	f.Close()
	if err != nil {
		return "", 0, fmt.Errorf("copying the image into the build VM: %w", err)
	}
	os.Remove(tarPath)
	step("copied into the build VM")

	if err := vm.Run(ctx, rootfsScript, log); err != nil {
		return "", 0, fmt.Errorf("making the root file system: %w", err)
	}
	step("unpacked, set up and made the ext4 image in the build VM")

	out := filepath.Join(dir, RootfsName)
	n, err := readOut(ctx, vm, vmWorkDir+"/"+vmImageTar, out)
	if err != nil {
		return "", 0, fmt.Errorf("copying the root file system out of the build VM: %w", err)
	}
	step("copied the root file system of %d MiB out", n>>20)
	// Best effort: the build VM is thrown away anyway.
	_ = vm.Run(ctx, "rm -rf "+vmWorkDir+"\n", io.Discard)
	fmt.Fprintf(log, "import: done in %.1fs\n", time.Since(start).Seconds())
	return out, n, nil
}

// stage writes the flattened image to path, gzipped at the fastest level
// (the guest stream, not the CPU, is what an import waits for), and
// returns the tar's size and the file's.
func stage(ctx context.Context, img *Image, path string) (raw, size int64, err error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return 0, 0, fmt.Errorf("staging the image: %w", err)
	}
	defer f.Close()
	zw, _ := gzip.NewWriterLevel(f, gzip.BestSpeed) // a valid level: no error
	rc := img.Flatten(ctx)
	raw, err = io.Copy(zw, rc)
	rc.Close()
	if err == nil {
		err = zw.Close()
	}
	if err == nil {
		err = f.Close()
	}
	if err != nil {
		return 0, 0, fmt.Errorf("flattening the image: %w", err)
	}
	st, err := os.Stat(path)
	if err != nil {
		return 0, 0, err
	}
	return raw, st.Size(), nil
}

func readOut(ctx context.Context, vm VM, from, to string) (int64, error) {
	// VMs run under their own uids and read the image.
	f, err := os.OpenFile(to, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o644)
	if err != nil {
		return 0, err
	}
	n, err := untarImage(ctx, vm, from, &sparseWriter{f: f})
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(to)
		return 0, err
	}
	return n, nil
}

// maxRootfsBytes bounds the image a build VM hands back.
const maxRootfsBytes = int64(256 << 30)

// untarImage reads the VM's sparse tar of the image (its unused blocks
// are holes there, so they never cross the guest stream) and writes the
// image to sw, holes again. The tar comes from the VM: exactly one
// regular entry, the image, of bounded size.
func untarImage(ctx context.Context, vm VM, from string, sw *sparseWriter) (int64, error) {
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		_, err := vm.ReadFile(ctx, from, pw)
		pw.CloseWithError(err)
		done <- err
	}()
	n, err := copyImage(tar.NewReader(pr), sw)
	if err == nil {
		// tar pads its output to whole records (10 KiB) after the end.
		if k, _ := io.Copy(io.Discard, io.LimitReader(pr, 1<<20)); k == 1<<20 {
			err = errors.New("the build VM's tar goes on after its end")
		}
	}
	pr.CloseWithError(errors.New("image read"))
	if rerr := <-done; err == nil && rerr != nil {
		err = rerr
	}
	if err != nil {
		return 0, err
	}
	return n, sw.finish()
}

func copyImage(tr *tar.Reader, sw *sparseWriter) (int64, error) {
	h, err := tr.Next()
	if err != nil {
		return 0, fmt.Errorf("reading the image's tar: %w", err)
	}
	if h.Name != RootfsName || (h.Typeflag != tar.TypeReg && h.Typeflag != tar.TypeGNUSparse) ||
		h.Size <= 0 || h.Size > maxRootfsBytes {
		return 0, fmt.Errorf("the build VM's tar holds %q (type %c, %d bytes), not the image", h.Name, h.Typeflag, h.Size)
	}
	n, err := io.Copy(sw, tr)
	if err != nil {
		return 0, fmt.Errorf("reading the image's tar: %w", err)
	}
	if n != h.Size {
		return 0, fmt.Errorf("the image's tar ended after %d of %d bytes", n, h.Size)
	}
	if _, err := tr.Next(); !errors.Is(err, io.EOF) {
		return 0, fmt.Errorf("the build VM's tar holds more than the image (%v)", err)
	}
	return n, nil
}

// sparseWriter writes to f, leaving holes where whole blocks are zero: an
// ext4 image is mostly unused blocks, which then take no room on the host.
type sparseWriter struct {
	f   *os.File
	off int64
}

const sparseBlock = 4096

func (s *sparseWriter) Write(p []byte) (int, error) {
	n := 0
	for len(p) > 0 {
		k := min(len(p), sparseBlock)
		if s.off%sparseBlock != 0 {
			k = min(k, int(sparseBlock-s.off%sparseBlock))
		}
		if !allZero(p[:k]) {
			if w, err := s.f.WriteAt(p[:k], s.off); err != nil {
				return n + w, err
			}
		}
		s.off += int64(k)
		n += k
		p = p[k:]
	}
	return n, nil
}

// finish sets the file's size, so a trailing hole counts.
func (s *sparseWriter) finish() error { return s.f.Truncate(s.off) }

func allZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

// rootfsScript runs as root in the build VM. The tree is the image's, so
// it is hostile: every path the setup writes is made a real directory or
// file first (an image could plant /etc as a symlink to the build VM's
// own /etc), and accounts are edited as text rather than with the image's
// own tools, which it may not have or may have replaced.
const rootfsScript = `set -eu
W=` + vmWorkDir + `
R=$W/root
command -v tar >/dev/null && command -v mkfs.ext4 >/dev/null || {
	echo "the build VM lacks tar or mkfs.ext4" >&2; exit 1; }
# The agent grows the root file system to the disk at boot; the room is
# what this needs, so let it finish.
i=0
while [ $i -lt 300 ] && pgrep -x resize2fs >/dev/null 2>&1; do sleep 1; i=$((i + 1)); done
rm -rf "$R" "$W/` + RootfsName + `" "$W/` + vmImageTar + `"
mkdir -p "$R"
t0=$(date +%s)
lap() { echo "rootfs: $1 ($(($(date +%s) - t0))s)"; t0=$(date +%s); }
tar -xzpf "$W/` + vmFlatTar + `" -C "$R" --numeric-owner --same-owner --xattrs --xattrs-include='*'
rm -f "$W/` + vmFlatTar + `"
lap unpacked

# realdir makes $R/$1 a directory, replacing whatever else the image put
# there; callers go from the top down so no parent is a symlink.
realdir() {
	if [ -L "$R/$1" ] || { [ -e "$R/$1" ] && [ ! -d "$R/$1" ]; }; then rm -rf "$R/$1"; fi
	mkdir -p "$R/$1"
}
# put replaces the file $R/$1 with stdin, mode $2.
put() {
	rm -rf "$R/$1"
	cat >"$R/$1"
	chmod "$2" "$R/$1"
}
has() { [ -e "$R/$1" ] || [ -L "$R/$1" ]; }

realdir etc
for f in passwd group shadow gshadow; do
	if [ -L "$R/etc/$f" ] || { [ -e "$R/etc/$f" ] && [ ! -f "$R/etc/$f" ]; }; then rm -rf "$R/etc/$f"; fi
done
touch "$R/etc/passwd" "$R/etc/group"
grep -q '^root:' "$R/etc/passwd" || echo 'root:x:0:0:root:/root:/bin/sh' >>"$R/etc/passwd"
grep -q '^root:' "$R/etc/group" || echo 'root:x:0:' >>"$R/etc/group"

shell=/bin/sh
if has bin/bash || has usr/bin/bash; then shell=/bin/bash; fi
# uid and gid 1000 are the sandbox user's: an account the image has there
# (node, ubuntu, …) gives way, and its files become the user's.
awk -F: '$1 != "user" && $3 != "1000"' "$R/etc/passwd" >"$W/passwd"
echo "user:x:1000:1000:user:/workspace:$shell" >>"$W/passwd"
awk -F: '$1 != "user" && $3 != "1000"' "$R/etc/group" >"$W/group"
echo "user:x:1000:" >>"$W/group"
put etc/passwd 0644 <"$W/passwd"
put etc/group 0644 <"$W/group"
if [ -f "$R/etc/shadow" ]; then
	awk -F: '$1 != "user"' "$R/etc/shadow" >"$W/shadow"
	echo 'user:*:19000:0:99999:7:::' >>"$W/shadow"
	put etc/shadow 0640 <"$W/shadow"
fi
if [ -f "$R/etc/gshadow" ]; then
	awk -F: '$1 != "user"' "$R/etc/gshadow" >"$W/gshadow"
	echo 'user:!::' >>"$W/gshadow"
	put etc/gshadow 0640 <"$W/gshadow"
fi
rm -f "$W/passwd" "$W/group" "$W/shadow" "$W/gshadow"

if has usr/bin/sudo || has bin/sudo; then
	realdir etc/sudoers.d
	printf 'user ALL=(ALL) NOPASSWD:ALL\n' | put etc/sudoers.d/user 0440
fi

realdir workspace
if [ -d "$R/etc/skel" ] && [ ! -L "$R/etc/skel" ]; then cp -a "$R/etc/skel/." "$R/workspace/"; fi
chown -R 1000:1000 "$R/workspace"
chmod 0755 "$R/workspace"

printf 'emberbox\n' | put etc/hostname 0644
printf '127.0.0.1\tlocalhost\n127.0.1.1\temberbox\n::1\t\tlocalhost ip6-localhost ip6-loopback\n' | put etc/hosts 0644
: | put etc/machine-id 0444
# The guest writes its own resolver config; an image's (often a symlink
# into /run) would be stale or dangling.
rm -rf "$R/etc/resolv.conf"
for d in proc sys dev run tmp var var/tmp root; do realdir "$d"; done
chmod 1777 "$R/tmp" "$R/var/tmp"
chmod 0700 "$R/root"

lap "set up"

# Size like internal/guestimage makeExt4: the content plus a quarter, inode
# tables for twice the entries, and the journal; grow and retry if short.
used=$(du -sxB1 "$R" | cut -f1)
inodes=$(find "$R" -xdev | wc -l)
mib=1048576
size=$((used + used / 4 + 2 * inodes * 256 + 64 * mib))
img="$W/` + RootfsName + `"
ok=
for attempt in 1 2 3; do
	size=$(((size + 64 * mib - 1) / (64 * mib) * (64 * mib)))
	rm -f "$img"
	truncate -s "$size" "$img"
	if mkfs.ext4 -F -q -L emberbox-root -m 0 -N $((2 * inodes + 16384)) -d "$R" "$img"; then ok=1; break; fi
	size=$((size + size / 2))
done
[ -n "$ok" ] || { echo "mkfs.ext4 failed" >&2; exit 1; }
rm -rf "$R"
lap "made the ext4 image"
# A sparse tar carries only the blocks mkfs wrote.
tar -C "$W" --sparse --format=posix -cf "$W/` + vmImageTar + `" ` + RootfsName + `
rm -f "$img"
chmod 0644 "$W/` + vmImageTar + `"
echo "rootfs: $((size / mib)) MiB, $inodes entries"
`
