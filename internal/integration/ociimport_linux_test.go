package integration

import (
	"archive/tar"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/emberbox/emberbox/internal/agentproto"
	"github.com/emberbox/emberbox/internal/guest"
	"github.com/emberbox/emberbox/internal/guestimage"
	"github.com/emberbox/emberbox/internal/ociimport"
	"github.com/emberbox/emberbox/internal/tsc"
	"github.com/emberbox/emberbox/internal/vmm"
	"github.com/emberbox/emberbox/internal/vmm/qemu"
)

// TestOCIImport packs a Debian root file system (mmdebstrap minbase, cached
// outside the clone) into an OCI layout with a second layer that deletes a
// file and makes a directory opaque, imports it in a build VM of the
// default image (ociimport.BuildRootfs through ociimport.GuestVM over the
// real agent, as the image builder does), and boots a VM from the rootfs it
// made, where a command runs as the sandbox user.
//
// The VMs are started with the qemu driver directly, below the image
// catalog; TestImageImportAPI imports through the API and creates
// sandboxes of the imported images.
func TestOCIImport(t *testing.T) {
	needVMs(t)
	fixture := debianFixture(t)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Minute)
	defer cancel()

	// The image: the Debian tree, then a layer with a whiteout, an opaque
	// directory and a file.
	start := time.Now()
	top := tarLayer(t, map[string]string{
		"etc/.wh.issue.net":      "",
		"var/log/.wh..wh..opq":   "",
		"var/log/imported.log":   "from the top layer\n",
		"etc/emberbox-import":    "imported\n",
		"usr/local/bin/greet.sh": "#!/bin/sh\necho \"hello $GREETING\"\n",
	})
	img := debianImage(t, fixture, v1.Config{Env: []string{"GREETING=oci"}, WorkingDir: "/workspace", Cmd: []string{"bash"}}, top)
	layoutDir := writeLayout(t, img)
	t.Logf("OCI layout of the fixture written in %.1fs", time.Since(start).Seconds())

	im, err := ociimport.Open(ctx, ociimport.Source{Layout: layoutDir})
	if err != nil {
		t.Fatal(err)
	}
	defer im.Close()
	if got := im.Config(); got.WorkingDir != "/workspace" || len(got.Env) != 1 {
		t.Errorf("config %+v", got)
	}

	boot := newBooter(t)
	// The build VM: the default image, with a disk for the tar, the tree
	// and the ext4 image.
	build := boot.start(t, "build", boot.img.Rootfs, 6144)
	waitRootGrown(t, build, 5<<30)
	var log bytes.Buffer
	start = time.Now()
	rootfs, size, err := ociimport.BuildRootfs(ctx, ociimport.GuestVM{G: build}, im, t.TempDir(), &log)
	importTime := time.Since(start)
	if err != nil {
		t.Fatalf("BuildRootfs: %v\n%s", err, tail(log.String(), 4000))
	}
	t.Logf("imported %s (%d layers) into a %d MiB rootfs in %.1fs\n%s",
		im.Digest(), im.Layers(), size>>20, importTime.Seconds(), tail(log.String(), 1500))
	checkHostileImport(t, ctx, build)
	boot.stop(t, "build")

	// A VM of the imported image.
	start = time.Now()
	c := boot.start(t, "run", rootfs, int((size>>20)+1024))
	t.Logf("the imported image booted and answered in %.1fs", time.Since(start).Seconds())
	out := guestSh(t, c, "", `whoami; id -u; echo "$HOME"; pwd; cat /etc/hostname; cat /etc/emberbox-import; `+
		`ls /var/log; test -e /etc/issue.net && echo issue.net-present || echo issue.net-gone; `+
		`grep -c '^user:' /etc/passwd; GREETING=oci sh /usr/local/bin/greet.sh; touch /workspace/mine && stat -c %U /workspace/mine`)
	want := "user\n1000\n/workspace\n/workspace\nemberbox\nimported\nimported.log\nissue.net-gone\n1\nhello oci\nuser\n"
	if out != want {
		t.Errorf("as the sandbox user:\n got %q\nwant %q", out, want)
	}
	if got := guestSh(t, c, "root", "cat /etc/debian_version; stat -c %U:%a /workspace; test -s /etc/machine-id || echo empty-machine-id"); !strings.HasPrefix(got, "12.") ||
		!strings.Contains(got, "user:755") || !strings.Contains(got, "empty-machine-id") {
		t.Errorf("as root: %q", got)
	}
}

// debianFixture returns a cached mmdebstrap minbase tarball of bookworm,
// building it on first use (needs mmdebstrap, root and the network).
func debianFixture(t testing.TB) string {
	t.Helper()
	cache, err := os.UserCacheDir()
	if err != nil {
		t.Skip(err)
	}
	dir := filepath.Join(cache, "emberbox", "fixtures")
	path := filepath.Join(dir, "debian-bookworm-minbase.tar")
	if st, err := os.Stat(path); err == nil && st.Mode().IsRegular() {
		return path
	}
	if _, err := exec.LookPath("mmdebstrap"); err != nil {
		t.Skip("mmdebstrap is not installed; it builds the Debian fixture")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	tmp := fmt.Sprintf("%s.tmp-%d.tar", path, os.Getpid())
	defer os.Remove(tmp)
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Minute)
	defer cancel()
	start := time.Now()
	cmd := exec.CommandContext(ctx, "mmdebstrap", "--variant=minbase", "--format=tar", "--quiet",
		"bookworm", tmp, "http://deb.debian.org/debian")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("mmdebstrap: %v\n%s", err, out)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
	t.Logf("built the Debian fixture in %.1fs", time.Since(start).Seconds())
	return path
}

// debianImage is an OCI image of the Debian fixture tarball with the layers
// top on it and config as its runtime configuration (linux/amd64).
func debianImage(t testing.TB, fixture string, config v1.Config, top ...v1.Layer) v1.Image {
	t.Helper()
	base, err := tarball.LayerFromFile(fixture)
	if err != nil {
		t.Fatal(err)
	}
	img, err := mutate.AppendLayers(empty.Image, append([]v1.Layer{base}, top...)...)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture, cf.Config = "linux", "amd64", config
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		t.Fatal(err)
	}
	return img
}

// writeLayout writes img as an OCI layout in a new directory.
func writeLayout(t testing.TB, img v1.Image) string {
	t.Helper()
	dir := t.TempDir()
	if _, err := layout.Write(dir, mutate.AppendManifests(empty.Index, mutate.IndexAddendum{Add: img})); err != nil {
		t.Fatal(err)
	}
	return dir
}

// tarLayer makes an uncompressed layer of regular files (mode 0755 for
// scripts, else 0644); directories are implied.
func tarLayer(t testing.TB, files map[string]string) v1.Layer {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	names := make([]string, 0, len(files))
	for name := range files {
		names = append(names, name)
	}
	sort.Strings(names) // the same layer, the same digest
	for _, name := range names {
		body := files[name]
		mode := int64(0o644)
		if strings.HasSuffix(name, ".sh") {
			mode = 0o755
		}
		if err := tw.WriteHeader(&tar.Header{Name: name, Mode: mode, Size: int64(len(body)), Typeflag: tar.TypeReg}); err != nil {
			t.Fatal(err)
		}
		io.WriteString(tw, body)
	}
	tw.Close()
	data := buf.Bytes()
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil })
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// booter starts VMs of a given rootfs with the server's kernel and an
// initramfs around this tree's agent.
type booter struct {
	drv      *qemu.Driver
	img      *guestimage.Image
	initrd   string
	machines map[string]vmm.Machine
	clients  map[string]*guest.Client
}

func newBooter(t *testing.T) *booter {
	t.Helper()
	img, err := guestimage.Lookup(guestimage.Config{})
	if err != nil {
		t.Skipf("no guest image is built: %v", err)
	}
	initrd, err := guestimage.BuildInitrd(img, filepath.Join(binDir, "emberbox-agent"), t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	khz, err := tsc.KHz()
	if err != nil {
		t.Fatal(err)
	}
	d, err := qemu.New(qemu.Config{TSCkHz: khz, ProbeKernel: img.Kernel,
		ProbeCache: filepath.Join(filepath.Dir(img.Dir), "kvm-probe")})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("accel %s", d.Accel())
	b := &booter{drv: d, img: img, initrd: initrd, machines: map[string]vmm.Machine{}, clients: map[string]*guest.Client{}}
	t.Cleanup(func() {
		for name := range b.machines {
			b.stop(t, name)
		}
	})
	return b
}

func (b *booter) start(t *testing.T, name, rootfs string, diskMiB int) *guest.Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	m, err := b.drv.Start(ctx, vmm.Spec{
		ID: fmt.Sprintf("sbx_oci%s%d", name, os.Getpid()), Dir: t.TempDir(),
		VCPU: 2, MemoryMiB: 1024, DiskMiB: diskMiB,
		Kernel: b.img.Kernel, Initrd: b.initrd, Rootfs: rootfs,
	})
	if err != nil {
		t.Fatalf("starting the %s VM: %v", name, err)
	}
	b.machines[name] = m
	for try := 1; ; try++ {
		conn, err := m.DialGuest(ctx)
		if err != nil {
			t.Fatalf("%s VM: DialGuest: %v", name, err)
		}
		tctx, tcancel := context.WithTimeout(ctx, 30*time.Second)
		c, err := guest.Handshake(tctx, conn)
		tcancel()
		if err == nil {
			b.clients[name] = c
			return c
		}
		conn.Close()
		if ctx.Err() != nil {
			t.Fatalf("%s VM: guest handshake (attempt %d): %v", name, try, err)
		}
	}
}

func (b *booter) stop(t *testing.T, name string) {
	if c := b.clients[name]; c != nil {
		c.Close()
	}
	if m := b.machines[name]; m != nil {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := m.Stop(ctx); err != nil {
			t.Errorf("stopping the %s VM: %v", name, err)
		}
	}
	delete(b.clients, name)
	delete(b.machines, name)
}

// guestSh runs command as user ("" is the sandbox user) and returns its
// stdout; it fails t unless it exits 0.
func guestSh(t *testing.T, c *guest.Client, user, command string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	res, err := c.Exec(ctx, agentproto.ExecRequest{Command: command, User: user, TimeoutMs: 60000}, nil)
	if err != nil {
		t.Fatalf("exec %q: %v", command, err)
	}
	if res.ExitCode == nil || *res.ExitCode != 0 {
		t.Fatalf("exec %q: exit %v: %s %s", command, res.ExitCode, res.Stdout, res.Stderr)
	}
	return string(res.Stdout)
}

// waitRootGrown waits until the agent has grown the root file system to
// at least min bytes (it does so at boot, in the background).
func waitRootGrown(t *testing.T, c *guest.Client, min int64) {
	t.Helper()
	var size int64
	ok := waitUntil(3*time.Minute, time.Second, func() bool {
		out := guestSh(t, c, "root", "df -B1 --output=size / | tail -1")
		size, _ = strconv.ParseInt(strings.TrimSpace(out), 10, 64)
		return size >= min
	})
	if !ok {
		t.Fatalf("the root file system stayed at %d MiB", size>>20)
	}
}

// checkHostileImport imports a small image whose tree tries to lead the
// setup's writes into the build VM's own files, with owners, a setuid
// file and a device node, in the build VM; the VM's files stay as they
// were, and the rootfs (read back into the VM with debugfs) holds what
// the image and the setup meant.
func checkHostileImport(t *testing.T, ctx context.Context, vm *guest.Client) {
	t.Helper()
	before := guestSh(t, vm, "root", "cat /etc/hostname; stat -c %F /etc /root; grep -c . /etc/passwd")
	accounts := tarLayerEntries(t,
		&tar.Header{Name: "etc/", Typeflag: tar.TypeDir, Mode: 0o755},
		&tar.Header{Name: "etc/passwd", Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(hostilePasswd))},
		&tar.Header{Name: "suid", Typeflag: tar.TypeReg, Mode: 0o4755, Uid: 4242, Gid: 4343, Size: 2},
		&tar.Header{Name: "dev/", Typeflag: tar.TypeDir, Mode: 0o755},
		&tar.Header{Name: "dev/kmsg", Typeflag: tar.TypeChar, Mode: 0o644, Devmajor: 1, Devminor: 11},
	)
	traps := tarLayerEntries(t,
		&tar.Header{Name: "workspace", Typeflag: tar.TypeSymlink, Linkname: "/etc"},
		&tar.Header{Name: "root", Typeflag: tar.TypeSymlink, Linkname: "/root"},
		&tar.Header{Name: "etc/hostname", Typeflag: tar.TypeSymlink, Linkname: "/etc/passwd"},
		&tar.Header{Name: "etc/sudoers.d", Typeflag: tar.TypeSymlink, Linkname: "/etc"},
		&tar.Header{Name: "usr/bin/sudo", Typeflag: tar.TypeReg, Mode: 0o4755},
	)
	img, err := mutate.AppendLayers(empty.Image, accounts, traps)
	if err != nil {
		t.Fatal(err)
	}
	cf, _ := img.ConfigFile()
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", "amd64"
	img, _ = mutate.ConfigFile(img, cf)
	dir := t.TempDir()
	if _, err := layout.Write(dir, mutate.AppendManifests(empty.Index, mutate.IndexAddendum{Add: img})); err != nil {
		t.Fatal(err)
	}
	im, err := ociimport.Open(ctx, ociimport.Source{Layout: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer im.Close()
	var log bytes.Buffer
	rootfs, size, err := ociimport.BuildRootfs(ctx, ociimport.GuestVM{G: vm}, im, t.TempDir(), &log)
	if err != nil {
		t.Fatalf("hostile import: %v\n%s", err, log.String())
	}
	if after := guestSh(t, vm, "root", "cat /etc/hostname; stat -c %F /etc /root; grep -c . /etc/passwd"); after != before {
		t.Errorf("the build VM changed: before %q, after %q", before, after)
	}
	f, err := os.Open(rootfs)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	vmvm := ociimport.GuestVM{G: vm}
	if err := vmvm.WriteFile(ctx, "/var/tmp/hostile.img", f, size); err != nil {
		t.Fatal(err)
	}
	got := guestSh(t, vm, "root", `set -e
img=/var/tmp/hostile.img
d() { debugfs -R "$1" "$img" 2>/dev/null; }
d 'cat /etc/passwd' | grep -E '^(user|node):'
d 'stat /workspace' | grep -oE 'Type: [a-z]+|User: +[0-9]+' | tr -s ' ' | tr '\n' ' '; echo
d 'stat /root' | grep -oE 'Type: [a-z]+' ; d 'stat /etc/hostname' | grep -oE 'Type: [a-z]+'
d 'cat /etc/hostname'; d 'cat /etc/sudoers.d/user'
d 'stat /suid' | grep -oE 'Mode: +[0-7]+|User: +[0-9]+|Group: +[0-9]+' | tr -s ' ' | tr '\n' ' '; echo
d 'stat /dev/kmsg' | grep -oE 'Type: [a-z]+|number: [0-9:]+' | tr '\n' ' '; echo
rm -f "$img"`)
	for _, want := range []string{
		"user:x:1000:1000:user:/workspace:/bin/sh\n", "Type: directory User: 1000 \n", "Type: directory\nType: regular\nemberbox\n",
		"user ALL=(ALL) NOPASSWD:ALL\n", "Mode: 04755 User: 4242 Group: 4343 \n", "Type: character number: 01:11",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("the hostile image's rootfs lacks %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, "node:") {
		t.Errorf("the image's uid 1000 account stayed:\n%s", got)
	}
}

const hostilePasswd = "root:x:0:0:root:/root:/bin/sh\nnode:x:1000:1000::/home/node:/bin/sh\n"

// tarLayerEntries makes a layer of headers; a regular file's content is
// hostilePasswd for etc/passwd, else its Size bytes of 'x'.
func tarLayerEntries(t *testing.T, hs ...*tar.Header) v1.Layer {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, h := range hs {
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if h.Name == "etc/passwd" {
			io.WriteString(tw, hostilePasswd)
		} else if h.Size > 0 {
			io.WriteString(tw, strings.Repeat("x", int(h.Size)))
		}
	}
	tw.Close()
	data := buf.Bytes()
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil })
	if err != nil {
		t.Fatal(err)
	}
	return l
}
