package ociimport_test

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/rand"
	"errors"
	"io"
	"io/fs"
	"log"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/emberbox/emberbox/internal/errdefs"
	"github.com/emberbox/emberbox/internal/ociimport"
)

// entry is one member of a test layer.
type entry struct {
	name string
	typ  byte
	body string
	link string
	mode int64
}

func file(name, body string) entry {
	return entry{name: name, typ: tar.TypeReg, body: body, mode: 0o644}
}
func dir(name string) entry { return entry{name: name, typ: tar.TypeDir, mode: 0o755} }
func symlink(name, to string) entry {
	return entry{name: name, typ: tar.TypeSymlink, link: to, mode: 0o777}
}
func hardlink(name, to string) entry {
	return entry{name: name, typ: tar.TypeLink, link: to, mode: 0o644}
}

// layer packs entries into a gzipped layer.
func layer(t *testing.T, entries ...entry) v1.Layer {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		h := &tar.Header{Name: e.name, Typeflag: e.typ, Mode: e.mode, Linkname: e.link, Size: int64(len(e.body)),
			Uid: 0, Gid: 0, Format: tar.FormatPAX}
		if e.typ == tar.TypeChar {
			h.Devmajor, h.Devminor = 1, 3
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if _, err := io.WriteString(tw, e.body); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	data := buf.Bytes()
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(data)), nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// image stacks layers (the first is the bottom) with a linux/amd64 config.
func image(t testing.TB, layers ...v1.Layer) v1.Image {
	t.Helper()
	img, err := mutate.AppendLayers(empty.Image, layers...)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", "amd64"
	cf.Config = v1.Config{
		Env: []string{"PATH=/usr/bin:/bin", "APP=1"}, WorkingDir: "/srv", User: "app",
		Cmd: []string{"serve"}, Entrypoint: []string{"/bin/app"},
		ExposedPorts: map[string]struct{}{"8080/tcp": {}, "53/udp": {}},
		Labels:       map[string]string{"org.example": "yes"},
	}
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

// testImage has a whiteout, an opaque directory, hostile links and a
// random blob.
func testImage(t *testing.T) (v1.Image, []byte) {
	blob := make([]byte, 64<<10)
	if _, err := rand.Read(blob); err != nil {
		t.Fatal(err)
	}
	base := layer(t,
		dir("etc"), file("etc/keep", "keep"), file("etc/gone", "gone"),
		dir("opt"), file("opt/old", "old"), dir("opt/sub"), file("opt/sub/old2", "old2"),
		dir("usr"), dir("usr/lib"), file("usr/lib/a", "a"), hardlink("usr/lib/b", "usr/lib/a"),
		file("data/blob", string(blob)), dir("var"), file("var/x", "x"),
		entry{name: "dev/null", typ: tar.TypeChar, mode: 0o666},
	)
	top := layer(t,
		file("etc/.wh.gone", ""),
		dir("opt"), file("opt/.wh..wh..opq", ""), file("opt/new", "new"),
		symlink("etc/climb", "../../../etc/shadow"), // leaves the root: dropped
		symlink("etc/abs", "/etc/keep"),             // resolved in the guest: kept
		hardlink("etc/hl", "/usr/lib/a"),            // absolute hard link: made relative
		hardlink("etc/hl-out", "../../x"),           // climbs: dropped
		file("/abs/file", "abs"),                    // absolute: made relative
		file("./etc/keep", "keep-top"),              // upper version wins
		symlink("var", "/tmp"),                      // replaces a directory
		file("var/y", "under a symlink"),            // under it: dropped
	)
	return image(t, base, top), blob
}

// flat reads a flattened image into name → description.
func flat(t *testing.T, im *ociimport.Image) map[string]string {
	t.Helper()
	rc := im.Flatten(context.Background())
	defer rc.Close()
	got := map[string]string{}
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("reading the flattened tar: %v", err)
		}
		if _, dup := got[h.Name]; dup {
			t.Errorf("%s appears twice", h.Name)
		}
		b, _ := io.ReadAll(tr)
		switch h.Typeflag {
		case tar.TypeDir:
			got[h.Name] = "dir"
		case tar.TypeSymlink:
			got[h.Name] = "-> " + h.Linkname
		case tar.TypeLink:
			got[h.Name] = "=> " + h.Linkname
		case tar.TypeChar:
			got[h.Name] = "char"
		default:
			if len(b) > 100 {
				got[h.Name] = "big"
			} else {
				got[h.Name] = string(b)
			}
		}
	}
	return got
}

func wantTree() map[string]string {
	return map[string]string{
		"etc": "dir", "etc/keep": "keep-top", "etc/abs": "-> /etc/keep", "etc/hl": "=> usr/lib/a",
		"opt": "dir", "opt/new": "new",
		"usr": "dir", "usr/lib": "dir", "usr/lib/a": "a", "usr/lib/b": "=> usr/lib/a",
		"data/blob": "big", "abs/file": "abs", "var": "-> /tmp", "dev/null": "char",
	}
}

func TestFlatten(t *testing.T) {
	img, _ := testImage(t)
	dir := t.TempDir()
	if _, err := layout.Write(dir, mutate.AppendManifests(empty.Index, mutate.IndexAddendum{Add: img})); err != nil {
		t.Fatal(err)
	}
	im, err := ociimport.Open(context.Background(), ociimport.Source{Layout: dir})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(wantTree(), flat(t, im)); diff != "" {
		t.Errorf("flattened tree (-want +got):\n%s", diff)
	}
	want := ociimport.Config{
		Env: []string{"PATH=/usr/bin:/bin", "APP=1"}, WorkingDir: "/srv", User: "app",
		Cmd: []string{"serve"}, Entrypoint: []string{"/bin/app"}, ExposedPorts: []string{"53/udp", "8080/tcp"},
		Labels: map[string]string{"org.example": "yes"},
	}
	if diff := cmp.Diff(want, im.Config()); diff != "" {
		t.Errorf("config (-want +got):\n%s", diff)
	}
	d, _ := img.Digest()
	if im.Digest() != d.String() || im.Layers() != 2 {
		t.Errorf("digest %s layers %d, want %s and 2", im.Digest(), im.Layers(), d)
	}
}

// The hard link's target comes in a lower layer, so after it in the stream:
// it is held back until its target is out; one to a whited-out file goes.
func TestFlattenHardLinkOrder(t *testing.T) {
	base := layer(t, file("a", "a"), file("b", "b"))
	top := layer(t, hardlink("c", "a"), hardlink("d", "b"), file(".wh.b", ""))
	im := openImage(t, image(t, base, top), ociimport.Limits{})
	rc := im.Flatten(context.Background())
	defer rc.Close()
	var order []string
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		order = append(order, h.Name)
	}
	if diff := cmp.Diff([]string{"a", "c"}, order); diff != "" {
		t.Errorf("entries (-want +got):\n%s", diff)
	}
}

func TestFlattenRefusesClimbing(t *testing.T) {
	im := openImage(t, image(t, layer(t, file("ok", "1"), file("../../etc/evil", "x"))), ociimport.Limits{})
	rc := im.Flatten(context.Background())
	defer rc.Close()
	_, err := io.Copy(io.Discard, rc)
	if errdefs.Code(err) != ociimport.CodeUnsafe {
		t.Fatalf("flattening an entry that climbs out: %v, want %s", err, ociimport.CodeUnsafe)
	}
}

func TestLimits(t *testing.T) {
	img := image(t, layer(t, file("a", strings.Repeat("x", 4096))), layer(t, file("b", strings.Repeat("y", 4096))))
	dir := writeLayout(t, img)
	ctx := context.Background()
	if _, err := ociimport.Open(ctx, ociimport.Source{Layout: dir, Limits: ociimport.Limits{MaxLayers: 1}}); errdefs.Code(err) != ociimport.CodeTooLarge {
		t.Errorf("2 layers over a limit of 1: %v", err)
	}
	if _, err := ociimport.Open(ctx, ociimport.Source{Layout: dir, Limits: ociimport.Limits{MaxCompressedBytes: 10}}); errdefs.Code(err) != ociimport.CodeTooLarge {
		t.Errorf("compressed bytes over the limit: %v", err)
	}
	for _, lim := range []ociimport.Limits{{MaxUncompressedBytes: 6000}, {MaxEntries: 1}} {
		im, err := ociimport.Open(ctx, ociimport.Source{Layout: dir, Limits: lim})
		if err != nil {
			t.Fatal(err)
		}
		rc := im.Flatten(ctx)
		_, err = io.Copy(io.Discard, rc)
		rc.Close()
		if errdefs.Code(err) != ociimport.CodeTooLarge || !errdefs.IsInvalidArgument(err) {
			t.Errorf("flatten over %+v: %v", lim, err)
		}
	}
}

// One image through every source: a layout directory, the layout as tar, a
// docker save archive and a registry.
func TestSources(t *testing.T) {
	img, _ := testImage(t)
	ctx := context.Background()
	want := wantTree()
	manifest, _ := img.Digest()
	config, _ := img.ConfigName()

	dir := writeLayout(t, img)
	layoutTar := filepath.Join(t.TempDir(), "layout.tar")
	tarDir(t, dir, layoutTar)

	docker := filepath.Join(t.TempDir(), "docker.tar")
	tag, _ := name.NewTag("example.com/app:v1")
	if err := tarball.WriteToFile(docker, tag, img); err != nil {
		t.Fatal(err)
	}

	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer srv.Close()
	u, _ := url.Parse(srv.URL)
	ref, err := name.ParseReference(u.Host + "/team/app:v1")
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(ref, img); err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct {
		name   string
		src    ociimport.Source
		digest v1.Hash
	}{
		{"layout dir", ociimport.Source{Layout: dir}, manifest},
		{"layout tar", ociimport.Source{Archive: layoutTar}, manifest},
		{"docker save", ociimport.Source{Archive: docker}, config},
		{"registry", ociimport.Source{Ref: ref.String()}, manifest},
		{"registry by digest", ociimport.Source{Ref: u.Host + "/team/app@" + manifest.String()}, manifest},
	} {
		t.Run(tc.name, func(t *testing.T) {
			im, err := ociimport.Open(ctx, tc.src)
			if err != nil {
				t.Fatal(err)
			}
			defer im.Close()
			if im.Digest() != tc.digest.String() {
				t.Errorf("digest %s, want %s", im.Digest(), tc.digest)
			}
			if im.Config().WorkingDir != "/srv" {
				t.Errorf("config %+v", im.Config())
			}
			if diff := cmp.Diff(want, flat(t, im)); diff != "" {
				t.Errorf("flattened tree (-want +got):\n%s", diff)
			}
		})
	}

	// A missing tag, a missing repository, a registry that is not there.
	for _, r := range []string{u.Host + "/team/app:nope", u.Host + "/team/none:v1"} {
		if _, err := ociimport.Open(ctx, ociimport.Source{Ref: r}); errdefs.Code(err) != ociimport.CodeNotFound {
			t.Errorf("%s: %v, want %s", r, err, ociimport.CodeNotFound)
		}
	}
	srv.Close()
	if _, err := ociimport.Open(ctx, ociimport.Source{Ref: ref.String()}); errdefs.Code(err) != ociimport.CodePullFailed {
		t.Errorf("registry gone: %v, want %s", err, ociimport.CodePullFailed)
	}
}

// A multi-platform index yields its linux/amd64 image.
func TestPlatformIndex(t *testing.T) {
	amd := image(t, layer(t, file("arch", "amd64")))
	arm := image(t, layer(t, file("arch", "arm64")))
	cf, _ := arm.ConfigFile()
	cf = cf.DeepCopy()
	cf.Architecture = "arm64"
	arm, _ = mutate.ConfigFile(arm, cf)
	idx := mutate.AppendManifests(empty.Index,
		mutate.IndexAddendum{Add: arm, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: "arm64"}}},
		mutate.IndexAddendum{Add: amd, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: "amd64"}}},
	)
	dir := t.TempDir()
	if _, err := layout.Write(dir, mutate.AppendManifests(empty.Index, mutate.IndexAddendum{Add: idx})); err != nil {
		t.Fatal(err)
	}
	im, err := ociimport.Open(context.Background(), ociimport.Source{Layout: dir})
	if err != nil {
		t.Fatal(err)
	}
	if got := flat(t, im)["arch"]; got != "amd64" {
		t.Errorf("picked the %s image", got)
	}
	// The arm64 image alone is refused.
	if _, err := ociimport.Open(context.Background(), ociimport.Source{Layout: writeLayout(t, arm)}); errdefs.Code(err) != ociimport.CodePlatform {
		t.Errorf("arm64 image: %v, want %s", err, ociimport.CodePlatform)
	}
}

func TestBadArchives(t *testing.T) {
	ctx := context.Background()
	tmp := t.TempDir()
	gz := filepath.Join(tmp, "img.tar.gz")
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	zw.Write([]byte("not really"))
	zw.Close()
	os.WriteFile(gz, buf.Bytes(), 0o644)
	if _, err := ociimport.Open(ctx, ociimport.Source{Archive: gz}); errdefs.Code(err) != ociimport.CodeUnsupported {
		t.Errorf("gzip archive: %v", err)
	}
	junk := filepath.Join(tmp, "junk.tar")
	os.WriteFile(junk, bytes.Repeat([]byte("junk"), 1000), 0o644)
	if _, err := ociimport.Open(ctx, ociimport.Source{Archive: junk}); errdefs.Code(err) != ociimport.CodeInvalid {
		t.Errorf("junk archive: %v", err)
	}
	if _, err := ociimport.Open(ctx, ociimport.Source{Archive: junk, Limits: ociimport.Limits{MaxCompressedBytes: 1000}}); errdefs.Code(err) != ociimport.CodeTooLarge {
		t.Errorf("archive over the limit: %v", err)
	}
	if _, err := ociimport.Open(ctx, ociimport.Source{}); !errdefs.IsInvalidArgument(err) {
		t.Errorf("no source: %v", err)
	}

	// A layer altered after it was written fails the flatten.
	img := image(t, layer(t, file("a", strings.Repeat("a", 1000))))
	dir := writeLayout(t, img)
	layers, _ := img.Layers()
	d, _ := layers[0].Digest()
	blob := filepath.Join(dir, "blobs", d.Algorithm, d.Hex)
	b, _ := os.ReadFile(blob)
	b[len(b)-10] ^= 0xff
	os.WriteFile(blob, b, 0o644)
	im, err := ociimport.Open(ctx, ociimport.Source{Layout: dir})
	if err != nil {
		t.Fatal(err)
	}
	rc := im.Flatten(ctx)
	defer rc.Close()
	if _, err := io.Copy(io.Discard, rc); err == nil {
		t.Error("a tampered layer flattened without error")
	}

	// A symlink inside the layout directory cannot lead out of it.
	dir = writeLayout(t, img)
	outside := filepath.Join(t.TempDir(), "index.json")
	os.Rename(filepath.Join(dir, "index.json"), outside)
	os.Symlink(outside, filepath.Join(dir, "index.json"))
	if _, err := ociimport.Open(ctx, ociimport.Source{Layout: dir}); errdefs.Code(err) != ociimport.CodeInvalid {
		t.Errorf("index.json symlinked out of the layout: %v", err)
	}
}

// fakeVM records what BuildRootfs does and answers ReadFile with an image.
type fakeVM struct {
	scripts []string
	written map[string][]byte
	answer  []byte // the tar ReadFile answers
}

func (f *fakeVM) Run(ctx context.Context, script string, log io.Writer) error {
	f.scripts = append(f.scripts, script)
	return nil
}

func (f *fakeVM) WriteFile(ctx context.Context, path string, r io.Reader, size int64) error {
	b, err := io.ReadAll(r)
	if int64(len(b)) != size {
		return errors.New("short write")
	}
	f.written[path] = b
	return err
}

func (f *fakeVM) ReadFile(ctx context.Context, path string, w io.Writer) (int64, error) {
	if path != "/var/tmp/emberbox-import/rootfs.tar" {
		return 0, fs.ErrNotExist
	}
	return io.Copy(w, bytes.NewReader(f.answer))
}

// fakeRootfs is mostly zeros, with data across block boundaries.
var fakeRootfs = append(append(append([]byte("ext4 image"), make([]byte, 2<<20)...), "middle"...), make([]byte, 8191)...)

func TestBuildRootfsSteps(t *testing.T) {
	img, _ := testImage(t)
	im := openImage(t, img, ociimport.Limits{})
	// As GNU tar does, the answer is padded to whole records.
	answer := tarOf(t, map[string][]byte{"rootfs.img": fakeRootfs})
	answer = append(answer, make([]byte, 10240-len(answer)%10240)...)
	vm := &fakeVM{written: map[string][]byte{}, answer: answer}
	dir := t.TempDir()
	var log bytes.Buffer
	path, size, err := ociimport.BuildRootfs(context.Background(), vm, im, dir, &log)
	if err != nil {
		t.Fatal(err)
	}
	if path != filepath.Join(dir, "rootfs.img") || size != int64(len(fakeRootfs)) {
		t.Errorf("rootfs %s (%d bytes)", path, size)
	}
	if b, _ := os.ReadFile(path); !bytes.Equal(b, fakeRootfs) {
		t.Errorf("rootfs holds %d bytes, not the VM's", len(b))
	}
	// Its zero blocks are holes.
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil || st.Blocks*512 >= 1<<20 {
		t.Errorf("the rootfs takes %d bytes on disk for %d: %v", st.Blocks*512, size, err)
	}
	zr, err := gzip.NewReader(bytes.NewReader(vm.written["/var/tmp/emberbox-import/fs.tar.gz"]))
	if err != nil {
		t.Fatal(err)
	}
	flat, err := io.ReadAll(zr)
	if err != nil {
		t.Fatal(err)
	}
	names := tarNames(t, flat)
	if len(names) != len(wantTree()) {
		t.Errorf("the VM got %d entries: %v", len(names), names)
	}
	all := strings.Join(vm.scripts, "\n")
	for _, want := range []string{"--numeric-owner", "mkfs.ext4", "user:x:1000:1000:user:/workspace:$shell", "sudoers.d"} {
		if !strings.Contains(all, want) {
			t.Errorf("the scripts lack %q", want)
		}
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Errorf("the work dir holds %d files, want only the rootfs", len(entries))
	}
	if !strings.Contains(log.String(), "import: done in") {
		t.Errorf("log: %s", log.String())
	}
}

func openImage(t *testing.T, img v1.Image, lim ociimport.Limits) *ociimport.Image {
	t.Helper()
	im, err := ociimport.Open(context.Background(), ociimport.Source{Layout: writeLayout(t, img), Limits: lim})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { im.Close() })
	return im
}

func writeLayout(t testing.TB, img v1.Image) string {
	t.Helper()
	dir := t.TempDir()
	if _, err := layout.Write(dir, mutate.AppendManifests(empty.Index, mutate.IndexAddendum{Add: img})); err != nil {
		t.Fatal(err)
	}
	return dir
}

// tarDir packs dir's files into a tar at out, as `tar -C dir -cf out .`.
func tarDir(t *testing.T, dir, out string) {
	t.Helper()
	f, err := os.Create(out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tw := tar.NewWriter(f)
	err = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == dir {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		info, _ := d.Info()
		h, _ := tar.FileInfoHeader(info, "")
		h.Name = "./" + filepath.ToSlash(rel)
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if d.Type().IsRegular() {
			b, _ := os.ReadFile(p)
			_, err = tw.Write(b)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
}

func tarNames(t *testing.T, b []byte) []string {
	t.Helper()
	var names []string
	tr := tar.NewReader(bytes.NewReader(b))
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, h.Name)
	}
	sort.Strings(names)
	return names
}

// A build VM's answer that is not exactly the image is refused.
func TestBuildRootfsRefusesOtherTars(t *testing.T) {
	img, _ := testImage(t)
	im := openImage(t, img, ociimport.Limits{})
	for name, answer := range map[string][]byte{
		"two entries": tarOf(t, map[string][]byte{"rootfs.img": fakeRootfs, "zz": []byte("x")}),
		"other name":  tarOf(t, map[string][]byte{"../rootfs.img": fakeRootfs}),
		"not a tar":   []byte("garbage"),
	} {
		vm := &fakeVM{written: map[string][]byte{}, answer: answer}
		dir := t.TempDir()
		if _, _, err := ociimport.BuildRootfs(context.Background(), vm, im, dir, io.Discard); err == nil {
			t.Errorf("%s: no error", name)
		}
		if entries, _ := os.ReadDir(dir); len(entries) != 0 {
			t.Errorf("%s: left %d files", name, len(entries))
		}
	}
}

func tarOf(t *testing.T, files map[string][]byte) []byte {
	t.Helper()
	names := make([]string, 0, len(files))
	for n := range files {
		names = append(names, n)
	}
	sort.Strings(names)
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, n := range names {
		if err := tw.WriteHeader(&tar.Header{Name: n, Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(files[n]))}); err != nil {
			t.Fatal(err)
		}
		tw.Write(files[n])
	}
	tw.Close()
	return buf.Bytes()
}

func TestConfigHelpers(t *testing.T) {
	c := ociimport.Config{
		Env:        []string{"A=1", "B=x=y", "A=2", "EMPTY="},
		Entrypoint: []string{"/bin/app", "--flag"}, Cmd: []string{"it's", "a b", ""},
	}
	if diff := cmp.Diff(map[string]string{"A": "2", "B": "x=y", "EMPTY": ""}, c.EnvMap()); diff != "" {
		t.Errorf("EnvMap (-want +got):\n%s", diff)
	}
	if got, want := c.Command(), `/bin/app --flag 'it'\''s' 'a b' ''`; got != want {
		t.Errorf("Command() = %s, want %s", got, want)
	}
	if got := (ociimport.Config{}).Command(); got != "" {
		t.Errorf("no command: %q", got)
	}
	img, _ := testImage(t)
	a, b := openImage(t, img, ociimport.Limits{}), openImage(t, img, ociimport.Limits{})
	other := openImage(t, image(t, layer(t, file("x", "y"))), ociimport.Limits{})
	if a.RootfsKey() != b.RootfsKey() || a.RootfsKey() == other.RootfsKey() || !strings.HasPrefix(a.RootfsKey(), "sha256:") {
		t.Errorf("rootfs keys: %s %s %s", a.RootfsKey(), b.RootfsKey(), other.RootfsKey())
	}
}

// A cancelled flatten ends with the context's error.
func TestFlattenCancel(t *testing.T) {
	img, _ := testImage(t)
	im := openImage(t, img, ociimport.Limits{})
	ctx, cancel := context.WithCancel(context.Background())
	rc := im.Flatten(ctx)
	defer rc.Close()
	if _, err := io.ReadFull(rc, make([]byte, 1024)); err != nil {
		t.Fatal(err)
	}
	cancel()
	if _, err := io.Copy(io.Discard, rc); !errors.Is(err, context.Canceled) {
		t.Errorf("after cancel: %v", err)
	}
}
