package ociimport_test

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"io"
	"log"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/emberbox/emberbox/internal/errdefs"
	"github.com/emberbox/emberbox/internal/ociimport"
)

// poisoned packs genuine's config with other bytes for its top layer: what
// a tenant would upload to pass a backdoored disk off as a popular image.
func poisoned(t *testing.T, genuine v1.Image, top v1.Layer) v1.Image {
	t.Helper()
	layers, err := genuine.Layers()
	if err != nil {
		t.Fatal(err)
	}
	evil, err := mutate.AppendLayers(image(t, layers[:len(layers)-1]...), top)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := genuine.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	evil, err = mutate.ConfigFile(evil, cf)
	if err != nil {
		t.Fatal(err)
	}
	// The test is only worth something if the configs are one.
	want, _ := genuine.ConfigName()
	if got, _ := evil.ConfigName(); got != want {
		t.Fatalf("the poisoned image's config is %s, not the genuine %s", got, want)
	}
	return evil
}

// rawLayer is a layer of exactly these uncompressed bytes.
func rawLayer(t testing.TB, b []byte) v1.Layer {
	t.Helper()
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil })
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// flattenErr reads im's flattened tar to its end and returns the error.
func flattenErr(im *ociimport.Image) error {
	rc := im.Flatten(context.Background())
	defer rc.Close()
	_, err := io.Copy(io.Discard, rc)
	return err
}

// sources writes img as each form an import reads: a docker save archive,
// an OCI layout directory and the layout packed as tar, and a registry
// image (reg is an in-process registry's host).
func sources(t *testing.T, img v1.Image, reg, repo string) map[string]ociimport.Source {
	t.Helper()
	docker := filepath.Join(t.TempDir(), "docker.tar")
	tag, _ := name.NewTag("example.com/app:v1")
	if err := tarball.WriteToFile(docker, tag, img); err != nil {
		t.Fatal(err)
	}
	dir := writeLayout(t, img)
	layoutTar := filepath.Join(t.TempDir(), "layout.tar")
	tarDir(t, dir, layoutTar)
	ref, err := name.ParseReference(reg + "/" + repo + ":v1")
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(ref, img); err != nil {
		t.Fatal(err)
	}
	return map[string]ociimport.Source{
		"docker save": {Archive: docker},
		"layout dir":  {Layout: dir},
		"layout tar":  {Archive: layoutTar},
		"registry":    {Ref: ref.String()},
	}
}

// An image whose layer bytes are not its config's is refused, naming the
// layer and both digests, in every form; the genuine one then imports, and
// its verified key is the one the poisoned import claimed but never got.
func TestPoisonedLayersRefused(t *testing.T) {
	genuine, _ := testImage(t)
	layers, _ := genuine.Layers()
	genuineTop, _ := layers[1].DiffID()
	genuineTopBytes := readUncompressed(t, layers[1])

	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer srv.Close()
	u, _ := url.Parse(srv.URL)

	for variant, top := range map[string]v1.Layer{
		// Other files where the genuine top layer has its own.
		"backdoored": layer(t, file("etc/keep", "keep-top"), file("usr/bin/sudo", "#!/bin/sh\nexec /bin/sh\n")),
		// The genuine layer's tar, then bytes after its end marker: the
		// flattened tree is the same, the layer is not.
		"trailing bytes": rawLayer(t, append(append([]byte(nil), genuineTopBytes...), bytes.Repeat([]byte("evil"), 3000)...)),
	} {
		evilTop, _ := top.DiffID()
		bad := poisoned(t, genuine, top)
		good := sources(t, genuine, u.Host, "genuine/"+strings.ReplaceAll(variant, " ", "-"))
		for form, src := range sources(t, bad, u.Host, "poisoned/"+strings.ReplaceAll(variant, " ", "-")) {
			t.Run(variant+"/"+form, func(t *testing.T) {
				ctx := context.Background()
				im, err := ociimport.Open(ctx, src)
				if err != nil {
					t.Fatal(err)
				}
				defer im.Close()
				err = flattenErr(im)
				var ce *errdefs.CodedError
				if !errors.As(err, &ce) || ce.Code != ociimport.CodeLayerMismatch || !errdefs.IsInvalidArgument(err) {
					t.Fatalf("flattening the poisoned image: %v, want %s", err, ociimport.CodeLayerMismatch)
				}
				for _, want := range []string{"layer 1 of 2", genuineTop.String(), evilTop.String()} {
					if !strings.Contains(ce.Message, want) {
						t.Errorf("the refusal %q does not name %s", ce.Message, want)
					}
				}
				if ce.Details["layer"] != 1 || ce.Details["expected"] != genuineTop.String() || ce.Details["actual"] != evilTop.String() {
					t.Errorf("details %v", ce.Details)
				}
				if key, err := im.VerifiedRootfsKey(); err == nil {
					t.Errorf("a refused image has the verified key %s", key)
				}

				gim, err := ociimport.Open(ctx, good[form])
				if err != nil {
					t.Fatal(err)
				}
				defer gim.Close()
				if diff := cmp.Diff(wantTree(), flat(t, gim)); diff != "" {
					t.Errorf("the genuine image after the poisoned one (-want +got):\n%s", diff)
				}
				key, err := gim.VerifiedRootfsKey()
				if err != nil || key != gim.RootfsKey() || key != im.RootfsKey() {
					t.Errorf("verified key %s (%v); claimed %s, the poisoned one's claim %s", key, err, gim.RootfsKey(), im.RootfsKey())
				}
			})
		}
	}
}

// A config listing fewer layers than the manifest is refused at Open.
func TestLayerCountMismatch(t *testing.T) {
	img := image(t, layer(t, file("a", "1")), layer(t, file("b", "2")))
	cf, _ := img.ConfigFile()
	cf = cf.DeepCopy()
	cf.RootFS.DiffIDs = cf.RootFS.DiffIDs[:1]
	short, err := mutate.ConfigFile(img, cf)
	if err != nil {
		t.Fatal(err)
	}
	docker := filepath.Join(t.TempDir(), "docker.tar")
	tag, _ := name.NewTag("example.com/app:v1")
	if err := tarball.WriteToFile(docker, tag, short); err != nil {
		t.Fatal(err)
	}
	for form, src := range map[string]ociimport.Source{"layout": {Layout: writeLayout(t, short)}, "docker save": {Archive: docker}} {
		im, err := ociimport.Open(context.Background(), src)
		if err == nil {
			err = flattenErr(im)
			im.Close()
		}
		if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "2") || !strings.Contains(err.Error(), "1") {
			t.Errorf("%s: 2 layers, 1 diff id: %v", form, err)
		}
	}
}

func readUncompressed(t *testing.T, l v1.Layer) []byte {
	t.Helper()
	rc, err := l.Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	b, err := io.ReadAll(rc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tar.NewReader(bytes.NewReader(b)).Next(); err != nil {
		t.Fatalf("the layer is not a tar: %v", err)
	}
	return b
}

// BenchmarkFlatten measures the flatten, layer hashing included, over a
// 32 MiB layer read from an OCI layout.
func BenchmarkFlatten(b *testing.B) {
	blob := bytes.Repeat([]byte("emberbox layer bytes, hashed once as they pass. "), (32<<20)/48)
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	tw.WriteHeader(&tar.Header{Name: "data/blob", Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(blob))})
	tw.Write(blob)
	tw.Close()
	img := image(b, rawLayer(b, buf.Bytes()))
	im, err := ociimport.Open(context.Background(), ociimport.Source{Layout: writeLayout(b, img)})
	if err != nil {
		b.Fatal(err)
	}
	defer im.Close()
	b.SetBytes(int64(buf.Len()))
	for b.Loop() {
		if err := flattenErr(im); err != nil {
			b.Fatal(err)
		}
	}
}
