package ociimport_test

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"path"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/partial"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/emberbox/emberbox/internal/errdefs"
	"github.com/emberbox/emberbox/internal/ociimport"
)

// bytesLayer is a layer whose uncompressed stream is exactly b (no
// sniffing for gzip).
type bytesLayer struct{ b []byte }

func (l bytesLayer) DiffID() (v1.Hash, error) {
	sum := sha256.Sum256(l.b)
	return v1.Hash{Algorithm: "sha256", Hex: hex.EncodeToString(sum[:])}, nil
}
func (l bytesLayer) Uncompressed() (io.ReadCloser, error) {
	return io.NopCloser(bytes.NewReader(l.b)), nil
}
func (l bytesLayer) MediaType() (types.MediaType, error) { return types.DockerLayer, nil }

// FuzzLayerStream flattens a one-layer image whose layer stream is the
// input, its config naming either that stream's sha256 or another one.
// Properties: an image whose config names other bytes never flattens, and
// is refused as a layer mismatch when nothing else stopped it first; one
// that names its own bytes is never called a mismatch, and when it
// flattens its verified key is the key it claimed and its tar holds only
// clean relative names.
func FuzzLayerStream(f *testing.F) {
	var tarBuf bytes.Buffer
	tw := tar.NewWriter(&tarBuf)
	tw.WriteHeader(&tar.Header{Name: "etc/hello", Typeflag: tar.TypeReg, Mode: 0o644, Size: 2})
	tw.Write([]byte("hi"))
	tw.WriteHeader(&tar.Header{Name: "../escape", Typeflag: tar.TypeReg, Mode: 0o644})
	tw.Close()
	withEscape := tarBuf.Bytes()
	valid := withEscape[:1024] // the first entry, then what ends a tar
	valid = append(append([]byte(nil), valid...), make([]byte, 1024)...)
	f.Add(withEscape, true)
	f.Add(withEscape, false)
	f.Add(valid, true)
	f.Add(valid, false)
	f.Add(append(append([]byte(nil), valid...), "appended"...), true)
	f.Add([]byte{}, true)
	f.Add([]byte("not a tar at all"), false)
	f.Add([]byte{0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 0xff}, true)

	f.Fuzz(func(t *testing.T, stream []byte, honest bool) {
		r := flattenStream(t, stream, honest)
		switch {
		case !honest && r.err == nil:
			t.Fatal("an image whose config names other layer bytes flattened")
		case !honest && r.keyErr == nil:
			t.Fatalf("a refused image has the verified key %s", r.key)
		case !honest && errdefs.Code(r.err) != ociimport.CodeLayerMismatch:
			// Only a refusal the honest image meets too may come first.
			if h := flattenStream(t, stream, true); h.err == nil {
				t.Fatalf("a mismatched layer refused as %v, though its bytes flatten", r.err)
			}
		case honest && errdefs.Code(r.err) == ociimport.CodeLayerMismatch:
			t.Fatalf("a layer that is its config's called a mismatch: %v", r.err)
		case r.err == nil && (r.keyErr != nil || r.key != r.claimed):
			t.Fatalf("flattened, but the verified key is %q (%v), not the claimed %s", r.key, r.keyErr, r.claimed)
		}
		for _, n := range r.names {
			if n == "" || path.IsAbs(n) || path.Clean(n) != n || n == ".." || strings.HasPrefix(n, "../") {
				t.Fatalf("the flattened tar names %q", n)
			}
		}
	})
}

type flattened struct {
	names        []string
	err          error
	key, claimed string
	keyErr       error
}

// flattenStream flattens a one-layer image of stream, read back from an
// OCI layout; honest says whether its config names the stream's sha256.
func flattenStream(t *testing.T, stream []byte, honest bool) flattened {
	t.Helper()
	l, err := partial.UncompressedToLayer(bytesLayer{stream})
	if err != nil {
		t.Fatal(err)
	}
	img := image(t, l)
	if !honest {
		cf, _ := img.ConfigFile()
		cf = cf.DeepCopy()
		cf.RootFS.DiffIDs[0].Hex = strings.Repeat("0", 64)
		if img, err = mutate.ConfigFile(img, cf); err != nil {
			t.Fatal(err)
		}
	}
	im, err := ociimport.Open(context.Background(), ociimport.Source{Layout: writeLayout(t, img)})
	if err != nil {
		t.Fatalf("opening the layout: %v", err)
	}
	defer im.Close()
	rc := im.Flatten(context.Background())
	defer rc.Close()
	var r flattened
	r.names, r.err = readNames(rc)
	r.key, r.keyErr = im.VerifiedRootfsKey()
	r.claimed = im.RootfsKey()
	return r
}

// readNames reads a tar to its end and returns its names.
func readNames(r io.Reader) ([]string, error) {
	var names []string
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			_, err = io.Copy(io.Discard, r) // the flatten's error comes after the tar
			return names, err
		}
		if err != nil {
			return names, err
		}
		names = append(names, h.Name)
	}
}

var _ partial.UncompressedLayer = bytesLayer{}
