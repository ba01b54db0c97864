package guestimage

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestLoadOrder(t *testing.T) {
	f, err := os.Open("testdata/modules.dep")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	idx, err := parseModulesDep(f)
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.Open("testdata/modules.builtin")
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	builtin, err := parseModulesBuiltin(b)
	if err != nil {
		t.Fatal(err)
	}

	order, missing, err := loadOrder(idx, builtin, []string{"virtio_mmio", "virtio_blk", "ext4", "virtio-rng", "vmw_vsock_virtio_transport", "no_such_module"})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"virtio_ring", "virtio", "virtio_mmio", "virtio_blk", "ext4", "virtio_rng",
		"vsock", "vmw_vsock_virtio_transport_common", "vmw_vsock_virtio_transport",
	}
	if !slices.Equal(order, want) {
		t.Errorf("order = %v, want %v", order, want)
	}
	if !slices.Equal(missing, []string{"no_such_module"}) {
		t.Errorf("missing = %v", missing)
	}
	if got := idx["virtio_rng"].Path; got != "kernel/drivers/char/hw_random/virtio-rng.ko.xz" {
		t.Errorf("virtio_rng path = %q", got)
	}
}

func TestLoadOrderErrors(t *testing.T) {
	cyclic := moduleIndex{"a": {Path: "a.ko", Deps: []string{"b"}}, "b": {Path: "b.ko", Deps: []string{"a"}}}
	if _, _, err := loadOrder(cyclic, nil, []string{"a"}); err == nil || !strings.Contains(err.Error(), "cycle") {
		t.Errorf("cycle: err = %v", err)
	}
	broken := moduleIndex{"a": {Path: "a.ko", Deps: []string{"gone"}}}
	if _, _, err := loadOrder(broken, nil, []string{"a"}); err == nil {
		t.Error("missing dependency: no error")
	}
}

func TestRecipeHashStable(t *testing.T) {
	k := kernelPackage{Name: "linux-image-6.1.0-28-cloud-amd64", Version: "6.1.119-1", Release: "6.1.0-28-cloud-amd64"}
	h1, h2 := recipeHash(k), recipeHash(k)
	if h1 != h2 || len(h1) != 32 {
		t.Fatalf("recipeHash not stable: %q %q", h1, h2)
	}
	k2 := k
	k2.Version = "6.1.119-2"
	if recipeHash(k2) == h1 {
		t.Error("kernel version does not change the recipe hash")
	}
	// A changed package list must change the hash too.
	saved := packages
	packages = append(slices.Clone(packages), "vim")
	defer func() { packages = saved }()
	if recipeHash(k) == h1 {
		t.Error("package list does not change the recipe hash")
	}
}

func TestCpioRoundTrip(t *testing.T) {
	cpioTool, err := exec.LookPath("cpio")
	if err != nil {
		t.Skip("cpio not installed")
	}
	var buf bytes.Buffer
	cw := &cpioWriter{w: &buf}
	cw.write(cpioEntry{Name: "lib", Mode: cpioMode(cpioDir, 0o755)})
	cw.write(cpioEntry{Name: "lib/odd", Mode: cpioMode(cpioReg, 0o600), Data: []byte("abc")}) // length not a multiple of 4
	cw.write(cpioEntry{Name: "init", Mode: cpioMode(cpioReg, 0o755), Data: []byte("#!/bin/sh\necho hi\n")})
	cw.write(cpioEntry{Name: "dev", Mode: cpioMode(cpioDir, 0o755)})
	cw.write(cpioEntry{Name: "dev/console", Mode: cpioMode(cpioChar, 0o600), RdevMajor: 5, RdevMinor: 1})
	if err := cw.close(); err != nil {
		t.Fatal(err)
	}
	if buf.Len()%4 != 0 {
		t.Errorf("archive length %d not 4-aligned", buf.Len())
	}

	cmd := exec.Command(cpioTool, "-t", "-v", "--quiet")
	cmd.Stdin = bytes.NewReader(buf.Bytes())
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("cpio -t: %v\n%s", err, out)
	}
	want := map[string]string{
		"lib": "drwxr-xr-x", "lib/odd": "-rw-------", "init": "-rwxr-xr-x",
		"dev": "drwxr-xr-x", "dev/console": "crw-------",
	}
	var names []string
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		fields := strings.Fields(line)
		name := fields[len(fields)-1]
		names = append(names, name)
		if fields[0] != want[name] {
			t.Errorf("%s: mode %s, want %s", name, fields[0], want[name])
		}
	}
	if !slices.Equal(names, []string{"lib", "lib/odd", "init", "dev", "dev/console"}) {
		t.Errorf("names = %v", names)
	}

	// Extract too, to check file contents survive the padding.
	dir := t.TempDir()
	cmd = exec.Command(cpioTool, "-i", "-d", "--quiet", "--no-absolute-filenames", "lib/odd", "init")
	cmd.Dir = dir
	cmd.Stdin = bytes.NewReader(buf.Bytes())
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("cpio -i: %v\n%s", err, out)
	}
	for name, content := range map[string]string{"lib/odd": "abc", "init": "#!/bin/sh\necho hi\n"} {
		got, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil || string(got) != content {
			t.Errorf("%s = %q, %v; want %q", name, got, err, content)
		}
	}
}

func TestBuildInitrd(t *testing.T) {
	dir := t.TempDir()
	mods := filepath.Join(dir, "modules")
	if err := os.MkdirAll(mods, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, data := range map[string]string{"virtio_ring.ko": "ring", "virtio.ko": "virtio", loadOrderName: "virtio_ring.ko\nvirtio.ko\n"} {
		if err := os.WriteFile(filepath.Join(mods, name), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	agent := filepath.Join(dir, "agent")
	if err := os.WriteFile(agent, []byte("agent v1"), 0o755); err != nil {
		t.Fatal(err)
	}
	img := &Image{ModulesDir: mods}
	out := filepath.Join(dir, "out")
	p1, err := BuildInitrd(img, agent, out)
	if err != nil {
		t.Fatal(err)
	}
	p2, err := BuildInitrd(img, agent, out)
	if err != nil || p2 != p1 {
		t.Fatalf("second build: %q, %v; want cached %q", p2, err, p1)
	}
	if err := os.WriteFile(agent, []byte("agent v2"), 0o755); err != nil {
		t.Fatal(err)
	}
	p3, err := BuildInitrd(img, agent, out)
	if err != nil || p3 == p1 {
		t.Fatalf("changed agent: %q, %v; want a new archive", p3, err)
	}
	if _, err := exec.LookPath("cpio"); err != nil {
		return
	}
	data, err := os.ReadFile(p3)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("cpio", "-t", "--quiet")
	cmd.Stdin = bytes.NewReader(data)
	listing, err := cmd.Output()
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"init", "dev/console", "lib/emberbox/modules/virtio_ring.ko", "lib/emberbox/modules/load-order"} {
		if !slices.Contains(strings.Fields(string(listing)), want) {
			t.Errorf("initrd lacks %s:\n%s", want, listing)
		}
	}
}
