package ociimport

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"os"
	"path"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/partial"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// An OCI layout is read through a blobStore so that a directory and the
// same layout packed as tar share one reader. The library's layout package
// wants a directory; a tar is read in place (no copy of its blobs).

const (
	maxJSONBlob    = 4 << 20 // index.json, a manifest, a config
	maxIndexDepth  = 4       // nested indexes followed
	maxTarEntries  = 100_000 // entries of an archive's outer tar
	maxOuterHeader = 1 << 20 // a docker save manifest.json
)

type blobStore interface {
	// open returns a reader of the file at name (slash-separated,
	// relative to the layout's root) and its size.
	open(name string) (io.ReadCloser, int64, error)
}

// dirStore reads a layout directory through os.Root, so no symlink in it
// leads out of it.
type dirStore struct{ root *os.Root }

func (d dirStore) open(name string) (io.ReadCloser, int64, error) {
	f, err := d.root.Open(name)
	if err != nil {
		return nil, 0, err
	}
	st, err := f.Stat()
	if err != nil || !st.Mode().IsRegular() {
		f.Close()
		return nil, 0, fmt.Errorf("%s: not a regular file", name)
	}
	return f, st.Size(), nil
}

// tarStore reads the regular files of an uncompressed tar in place.
type tarStore struct {
	f     *os.File
	files map[string]tarFile
}

type tarFile struct{ off, size int64 }

func (t *tarStore) open(name string) (io.ReadCloser, int64, error) {
	tf, ok := t.files[name]
	if !ok {
		return nil, 0, fmt.Errorf("%s: %w", name, os.ErrNotExist)
	}
	return io.NopCloser(io.NewSectionReader(t.f, tf.off, tf.size)), tf.size, nil
}

// indexTar lists an archive's regular files and where their bytes are.
// The file must be an uncompressed tar; archive/tar seeks over file data,
// so the position after Next is where an entry's bytes start.
func indexTar(f *os.File) (*tarStore, error) {
	var magic [2]byte
	if _, err := f.ReadAt(magic[:], 0); err == nil && magic == [2]byte{0x1f, 0x8b} {
		return nil, unsupported("the archive is gzip-compressed; upload the uncompressed tar (docker save without gzip)")
	}
	tr := tar.NewReader(f)
	ts := &tarStore{f: f, files: map[string]tarFile{}}
	for n := 0; ; n++ {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, invalid("reading the archive: %v", err)
		}
		if n >= maxTarEntries {
			return nil, tooLarge("the archive has over %d entries", maxTarEntries)
		}
		if h.Typeflag != tar.TypeReg && h.Typeflag != tar.TypeRegA {
			continue
		}
		off, err := f.Seek(0, io.SeekCurrent)
		if err != nil {
			return nil, fmt.Errorf("reading the archive: %w", err)
		}
		ts.files[path.Clean("/" + h.Name)[1:]] = tarFile{off: off, size: h.Size}
	}
	return ts, nil
}

// openLayoutDir opens a layout directory; the image reads it until
// closed.
func openLayoutDir(dir string) (v1.Image, v1.Hash, io.Closer, error) {
	root, err := os.OpenRoot(dir)
	if err != nil {
		return nil, v1.Hash{}, nil, invalid("opening the layout directory: %v", err)
	}
	img, d, err := openLayout(dirStore{root: root})
	if err != nil {
		root.Close()
		return nil, v1.Hash{}, nil, err
	}
	return img, d, root, nil
}

// openArchive opens a tar file holding an OCI layout or a docker save
// image, of at most max bytes; the image reads it until closed.
func openArchive(file string, max int64) (v1.Image, v1.Hash, io.Closer, error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, v1.Hash{}, nil, invalid("opening the archive: %v", err)
	}
	if st, err := f.Stat(); err != nil || !st.Mode().IsRegular() {
		f.Close()
		return nil, v1.Hash{}, nil, invalid("the archive is not a regular file")
	} else if st.Size() > max {
		f.Close()
		return nil, v1.Hash{}, nil, tooLarge("the archive is %d MiB, over %d MiB", st.Size()>>20, max>>20)
	}
	ts, err := indexTar(f)
	if err != nil {
		f.Close()
		return nil, v1.Hash{}, nil, err
	}
	_, layout := ts.files["oci-layout"]
	_, index := ts.files["index.json"]
	if layout && index {
		img, d, err := openLayout(ts)
		if err != nil {
			f.Close()
			return nil, v1.Hash{}, nil, err
		}
		return img, d, f, nil
	}
	f.Close()
	if _, ok := ts.files["manifest.json"]; !ok {
		return nil, v1.Hash{}, nil, invalid("the archive is neither an OCI layout (oci-layout, index.json) nor docker save output (manifest.json)")
	}
	// The library opens the file again for each read.
	img, err := tarball.ImageFromPath(file, nil)
	if err != nil {
		return nil, v1.Hash{}, nil, invalid("reading the docker save archive: %v", err)
	}
	// A docker save image's manifest digest would mean gzipping every
	// layer; its config digest names the same content (the config lists
	// the layers' diff ids).
	d, err := img.ConfigName()
	if err != nil {
		return nil, v1.Hash{}, nil, invalid("reading the docker save archive: %v", err)
	}
	return img, d, io.NopCloser(nil), nil
}

func openLayout(bs blobStore) (v1.Image, v1.Hash, error) {
	raw, err := readAll(bs, "index.json", maxJSONBlob)
	if err != nil {
		return nil, v1.Hash{}, invalid("reading the layout's index.json: %v", err)
	}
	idx, err := v1.ParseIndexManifest(bytes.NewReader(raw))
	if err != nil {
		return nil, v1.Hash{}, invalid("parsing the layout's index.json: %v", err)
	}
	desc, err := pickManifest(bs, idx, 0)
	if err != nil {
		return nil, v1.Hash{}, err
	}
	manifest, err := readBlob(bs, desc.Digest, maxJSONBlob)
	if err != nil {
		return nil, v1.Hash{}, err
	}
	m, err := v1.ParseManifest(bytes.NewReader(manifest))
	if err != nil {
		return nil, v1.Hash{}, invalid("parsing the image manifest: %v", err)
	}
	config, err := readBlob(bs, m.Config.Digest, maxJSONBlob)
	if err != nil {
		return nil, v1.Hash{}, err
	}
	mt := desc.MediaType
	if mt == "" {
		mt = m.MediaType
	}
	img, err := partial.CompressedToImage(&layoutImage{bs: bs, manifest: manifest, config: config, m: m, mediaType: mt})
	if err != nil {
		return nil, v1.Hash{}, invalid("reading the image: %v", err)
	}
	return img, desc.Digest, nil
}

// pickManifest finds the linux/amd64 image manifest in an index: a
// descriptor with that platform, or the only image without one.
func pickManifest(bs blobStore, idx *v1.IndexManifest, depth int) (v1.Descriptor, error) {
	var plain []v1.Descriptor
	for _, d := range idx.Manifests {
		switch {
		case d.MediaType.IsImage() || d.MediaType == "":
			if d.Platform != nil && d.Platform.OS != "" {
				if d.Platform.Satisfies(platform) {
					return d, nil
				}
				continue
			}
			plain = append(plain, d)
		case d.MediaType.IsIndex():
			if depth >= maxIndexDepth {
				return v1.Descriptor{}, invalid("image indexes nested over %d deep", maxIndexDepth)
			}
			raw, err := readBlob(bs, d.Digest, maxJSONBlob)
			if err != nil {
				return v1.Descriptor{}, err
			}
			child, err := v1.ParseIndexManifest(bytes.NewReader(raw))
			if err != nil {
				return v1.Descriptor{}, invalid("parsing index %s: %v", d.Digest, err)
			}
			if got, err := pickManifest(bs, child, depth+1); err == nil {
				return got, nil
			} else if depth > 0 || len(idx.Manifests) == 1 {
				return v1.Descriptor{}, err
			}
		}
	}
	switch len(plain) {
	case 1:
		return plain[0], nil
	case 0:
		return v1.Descriptor{}, wrongPlatform("the layout holds no linux/amd64 image")
	default:
		return v1.Descriptor{}, invalid("the layout holds %d images; import one at a time", len(plain))
	}
}

// layoutImage is the library's minimal image over a blob store.
type layoutImage struct {
	bs        blobStore
	manifest  []byte
	config    []byte
	m         *v1.Manifest
	mediaType types.MediaType
}

func (li *layoutImage) RawManifest() ([]byte, error)        { return li.manifest, nil }
func (li *layoutImage) RawConfigFile() ([]byte, error)      { return li.config, nil }
func (li *layoutImage) MediaType() (types.MediaType, error) { return li.mediaType, nil }

func (li *layoutImage) LayerByDigest(h v1.Hash) (partial.CompressedLayer, error) {
	for _, d := range li.m.Layers {
		if d.Digest == h {
			if !d.MediaType.IsLayer() && d.MediaType != "" {
				return nil, unsupported("layer %s has media type %s", h, d.MediaType)
			}
			return &layoutLayer{bs: li.bs, desc: d}, nil
		}
	}
	return nil, invalid("layer %s is not in the manifest", h)
}

type layoutLayer struct {
	bs   blobStore
	desc v1.Descriptor
}

func (l *layoutLayer) Digest() (v1.Hash, error)            { return l.desc.Digest, nil }
func (l *layoutLayer) Size() (int64, error)                { return l.desc.Size, nil }
func (l *layoutLayer) MediaType() (types.MediaType, error) { return l.desc.MediaType, nil }

func (l *layoutLayer) Compressed() (io.ReadCloser, error) {
	rc, size, err := l.bs.open(blobPath(l.desc.Digest))
	if err != nil {
		return nil, invalid("layer %s: %v", l.desc.Digest, err)
	}
	if size != l.desc.Size {
		rc.Close()
		return nil, invalid("layer %s is %d bytes; its manifest says %d", l.desc.Digest, size, l.desc.Size)
	}
	return newVerifier(rc, l.desc.Digest, size)
}

func blobPath(h v1.Hash) string { return "blobs/" + h.Algorithm + "/" + h.Hex }

func readAll(bs blobStore, name string, limit int64) ([]byte, error) {
	rc, size, err := bs.open(name)
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	if size > limit {
		return nil, fmt.Errorf("%s is %d bytes, over %d", name, size, limit)
	}
	return io.ReadAll(io.LimitReader(rc, limit))
}

// readBlob reads a small blob and checks its digest.
func readBlob(bs blobStore, h v1.Hash, limit int64) ([]byte, error) {
	if h.Algorithm != "sha256" {
		return nil, unsupported("blob %s: only sha256 digests are read", h)
	}
	b, err := readAll(bs, blobPath(h), limit)
	if err != nil {
		return nil, invalid("blob %s: %v", h, err)
	}
	sum := sha256.Sum256(b)
	if hex.EncodeToString(sum[:]) != h.Hex {
		return nil, invalid("blob %s does not match its digest", h)
	}
	return b, nil
}

// verifier checks a layer's bytes against its digest at EOF, so a layer
// altered on disk fails the import instead of landing in a rootfs.
type verifier struct {
	rc   io.ReadCloser
	h    hash.Hash
	want v1.Hash
	left int64
}

func newVerifier(rc io.ReadCloser, want v1.Hash, size int64) (io.ReadCloser, error) {
	if want.Algorithm != "sha256" {
		rc.Close()
		return nil, unsupported("layer %s: only sha256 digests are read", want)
	}
	return &verifier{rc: rc, h: sha256.New(), want: want, left: size}, nil
}

func (v *verifier) Read(p []byte) (int, error) {
	n, err := v.rc.Read(p)
	v.h.Write(p[:n])
	v.left -= int64(n)
	if errors.Is(err, io.EOF) {
		if v.left != 0 || hex.EncodeToString(v.h.Sum(nil)) != v.want.Hex {
			return n, invalid("layer %s does not match its digest", v.want)
		}
	}
	return n, err
}

func (v *verifier) Close() error { return v.rc.Close() }
