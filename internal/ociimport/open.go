package ociimport

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"

	"github.com/emberbox/emberbox/internal/errdefs"
)

// Default bounds of an import; Limits overrides them.
const (
	DefaultMaxLayers            = 128
	DefaultMaxCompressedBytes   = int64(8 << 30)
	DefaultMaxUncompressedBytes = int64(8 << 30)
	DefaultMaxEntries           = int64(2_000_000)
)

// Error codes of refused or failed imports.
const (
	CodeInvalid     = "image_invalid"      // not an image we can read
	CodeNotFound    = "image_not_found"    // no such reference or manifest
	CodePullFailed  = "image_pull_failed"  // the registry could not be read
	CodeTooLarge    = "image_too_large"    // over a bound in Limits
	CodePlatform    = "image_platform"     // not linux/amd64
	CodeUnsupported = "image_unsupported"  // a layer or archive form we do not read
	CodeUnsafe      = "image_unsafe_entry" // a layer entry leaving the root
)

// platform is the only one a sandbox runs.
var platform = v1.Platform{OS: "linux", Architecture: "amd64"}

// Source says where an image comes from: exactly one of Ref, Layout and
// Archive.
type Source struct {
	// Ref is a registry reference ("debian:bookworm",
	// "127.0.0.1:5000/app@sha256:…"). Loopback, RFC 1918 and localhost
	// registries are spoken to over plain http, others over https; pulls
	// are anonymous.
	Ref string
	// Layout is an OCI image layout directory on the host.
	Layout string
	// Archive is a tar file on the host: an OCI layout packed as tar, or
	// the output of `docker save` (one image).
	Archive string

	// Limits bound the import; zero fields take the defaults.
	Limits Limits
	// Transport, if set, carries registry requests (tests).
	Transport http.RoundTripper
}

// Limits bound an import. A compressed bound is checked at Open from the
// manifest; the uncompressed and entry bounds while flattening.
type Limits struct {
	MaxLayers            int
	MaxCompressedBytes   int64
	MaxUncompressedBytes int64 // file contents of the flattened tree
	MaxEntries           int64 // entries of the flattened tree
}

func (l Limits) withDefaults() Limits {
	if l.MaxLayers <= 0 {
		l.MaxLayers = DefaultMaxLayers
	}
	if l.MaxCompressedBytes <= 0 {
		l.MaxCompressedBytes = DefaultMaxCompressedBytes
	}
	if l.MaxUncompressedBytes <= 0 {
		l.MaxUncompressedBytes = DefaultMaxUncompressedBytes
	}
	if l.MaxEntries <= 0 {
		l.MaxEntries = DefaultMaxEntries
	}
	return l
}

// Image is an opened image, ready to flatten.
type Image struct {
	img    v1.Image
	digest v1.Hash
	cfg    Config
	limits Limits
	layers int
	size   int64 // compressed bytes of the layers, as the manifest says
	closer io.Closer
	// configSum is the sha256 of the config's bytes, hashed here;
	// diffIDs are the config's rootfs.diff_ids, what its layers must be.
	configSum v1.Hash
	diffIDs   []v1.Hash

	mu       sync.Mutex
	verified []v1.Hash // the layers' hashes, once a Flatten checked them all
}

// Config is what of the image's config a sandbox image keeps.
type Config struct {
	Env          []string // KEY=value
	WorkingDir   string
	User         string
	Cmd          []string
	Entrypoint   []string
	ExposedPorts []string // "8080/tcp"
	Labels       map[string]string
}

// Open reads src's manifest and config and checks them against the limits;
// layers are read only by Flatten. For a registry reference, ctx also bounds
// the layer downloads Flatten makes later.
func Open(ctx context.Context, src Source) (*Image, error) {
	n := 0
	for _, s := range []string{src.Ref, src.Layout, src.Archive} {
		if s != "" {
			n++
		}
	}
	if n != 1 {
		return nil, errdefs.New(errdefs.ErrInvalidArgument, CodeInvalid,
			"an image source is exactly one of a reference, a layout directory or an archive")
	}
	lim := src.Limits.withDefaults()
	var (
		img    v1.Image
		digest v1.Hash
		closer io.Closer = io.NopCloser(nil)
		err    error
	)
	switch {
	case src.Ref != "":
		img, digest, err = openRemote(ctx, src)
	case src.Layout != "":
		img, digest, closer, err = openLayoutDir(src.Layout)
	default:
		img, digest, closer, err = openArchive(src.Archive, lim.MaxCompressedBytes)
	}
	if err != nil {
		return nil, err
	}
	im, err := newImage(img, digest, lim)
	if err != nil {
		closer.Close()
		return nil, err
	}
	im.closer = closer
	return im, nil
}

// Close releases the layout directory or archive the image reads.
func (im *Image) Close() error { return im.closer.Close() }

func newImage(img v1.Image, digest v1.Hash, lim Limits) (*Image, error) {
	raw, err := img.RawConfigFile()
	if err != nil {
		return nil, invalid("reading the image config: %v", err)
	}
	cf, err := v1.ParseConfigFile(bytes.NewReader(raw))
	if err != nil {
		return nil, invalid("reading the image config: %v", err)
	}
	configSum := sha256.Sum256(raw)
	if cf.OS != "" && cf.OS != platform.OS || cf.Architecture != "" && cf.Architecture != platform.Architecture {
		return nil, errdefs.New(errdefs.ErrInvalidArgument, CodePlatform,
			"the image is for %s/%s; sandboxes run linux/amd64", cf.OS, cf.Architecture)
	}
	layers, err := img.Layers()
	if err != nil {
		return nil, invalid("reading the image layers: %v", err)
	}
	if len(layers) > lim.MaxLayers {
		return nil, errdefs.New(errdefs.ErrInvalidArgument, CodeTooLarge,
			"the image has %d layers; at most %d are imported", len(layers), lim.MaxLayers)
	}
	if err := checkDiffIDs(cf.RootFS.DiffIDs, len(layers)); err != nil {
		return nil, err
	}
	im := &Image{img: img, digest: digest, limits: lim, layers: len(layers), diffIDs: cf.RootFS.DiffIDs,
		configSum: v1.Hash{Algorithm: "sha256", Hex: hex.EncodeToString(configSum[:])}}
	if im.size, err = compressedSize(img, len(layers), lim); err != nil {
		return nil, err
	}
	c := cf.Config
	im.cfg = Config{
		Env: c.Env, WorkingDir: c.WorkingDir, User: c.User,
		Cmd: c.Cmd, Entrypoint: c.Entrypoint, Labels: c.Labels,
	}
	for p := range c.ExposedPorts {
		im.cfg.ExposedPorts = append(im.cfg.ExposedPorts, p)
	}
	slices.Sort(im.cfg.ExposedPorts)
	return im, nil
}

// checkDiffIDs refuses a config whose layer digests do not match the
// manifest's n layers or are not sha256.
func checkDiffIDs(diffIDs []v1.Hash, n int) error {
	if n != len(diffIDs) {
		return invalid("the manifest lists %d layers but the config's rootfs.diff_ids %d", n, len(diffIDs))
	}
	for i, d := range diffIDs {
		if d.Algorithm != "sha256" || len(d.Hex) != 64 {
			return unsupported("the config's rootfs.diff_ids[%d] is %q; only sha256 digests are read", i, d.String())
		}
	}
	return nil
}

// compressedSize is the layers' bytes as img's manifest of n layers states
// them, within the limit; 0 without such a manifest.
func compressedSize(img v1.Image, n int, lim Limits) (int64, error) {
	var size int64
	if m, err := img.Manifest(); err == nil && m != nil && len(m.Layers) == n {
		// A docker save archive has no manifest of its own; its layers
		// are bounded by the archive's size and while flattening.
		for _, d := range m.Layers {
			if d.Size < 0 || d.Size > lim.MaxCompressedBytes || size+d.Size > lim.MaxCompressedBytes {
				return 0, errdefs.New(errdefs.ErrInvalidArgument, CodeTooLarge,
					"the image's layers are over %d MiB compressed", lim.MaxCompressedBytes>>20)
			}
			size += d.Size
		}
	}
	return size, nil
}

// Digest identifies the image: the digest of its linux/amd64 manifest, or,
// for a docker save archive (which has no manifest), of its config.
func (im *Image) Digest() string { return im.digest.String() }

// Config returns the image's run settings.
func (im *Image) Config() Config { return im.cfg }

// Layers returns the number of layers.
func (im *Image) Layers() int { return im.layers }

// CompressedSize returns the layers' bytes as the manifest states them (0
// for a docker save archive).
func (im *Image) CompressedSize() int64 { return im.size }

func openRemote(ctx context.Context, src Source) (v1.Image, v1.Hash, error) {
	ref, err := name.ParseReference(src.Ref)
	if err != nil {
		return nil, v1.Hash{}, invalid("image reference %q: %v", src.Ref, err)
	}
	opts := []remote.Option{
		remote.WithContext(ctx),
		remote.WithPlatform(platform),
		remote.WithUserAgent("emberbox"),
	}
	if src.Transport != nil {
		opts = append(opts, remote.WithTransport(src.Transport))
	}
	img, err := remote.Image(ref, opts...)
	if err != nil {
		return nil, v1.Hash{}, remoteError(ref, err)
	}
	d, err := img.Digest()
	if err != nil {
		return nil, v1.Hash{}, remoteError(ref, err)
	}
	return img, d, nil
}

// remoteError classifies a registry failure: a missing (or, as Docker Hub
// answers for unknown repositories, unauthorized) image is the caller's
// mistake; anything else is the registry's.
func remoteError(ref name.Reference, err error) error {
	var te *transport.Error
	if errors.As(err, &te) {
		switch te.StatusCode {
		case http.StatusNotFound:
			return errdefs.New(errdefs.ErrInvalidArgument, CodeNotFound, "image %s not found in its registry", ref)
		case http.StatusUnauthorized, http.StatusForbidden:
			return errdefs.New(errdefs.ErrInvalidArgument, CodeNotFound,
				"image %s not found, or not public (pulls are anonymous)", ref)
		}
		for _, d := range te.Errors {
			if d.Code == transport.ManifestUnknownErrorCode || d.Code == transport.NameUnknownErrorCode {
				return errdefs.New(errdefs.ErrInvalidArgument, CodeNotFound, "image %s not found in its registry", ref)
			}
		}
	}
	if strings.Contains(err.Error(), "no child with platform") {
		return errdefs.New(errdefs.ErrInvalidArgument, CodePlatform, "image %s has no linux/amd64 variant", ref)
	}
	return errdefs.New(errdefs.ErrUnavailable, CodePullFailed, "pulling %s: %v", ref, err)
}

func invalid(format string, args ...any) error {
	return errdefs.New(errdefs.ErrInvalidArgument, CodeInvalid, format, args...)
}

func unsupported(format string, args ...any) error {
	return errdefs.New(errdefs.ErrInvalidArgument, CodeUnsupported, format, args...)
}

func tooLarge(format string, args ...any) error {
	return errdefs.New(errdefs.ErrInvalidArgument, CodeTooLarge, format, args...)
}

func wrongPlatform(format string, args ...any) error {
	return errdefs.New(errdefs.ErrInvalidArgument, CodePlatform, format, args...)
}

// EnvMap returns Env as a map; a later KEY wins, as in a shell.
func (c Config) EnvMap() map[string]string {
	m := make(map[string]string, len(c.Env))
	for _, kv := range c.Env {
		k, v, _ := strings.Cut(kv, "=")
		if k != "" {
			m[k] = v
		}
	}
	return m
}

// Command returns Entrypoint then Cmd as one shell command line, each word
// quoted, or "" if the image names none: a start command for the image.
func (c Config) Command() string {
	words := append(append([]string(nil), c.Entrypoint...), c.Cmd...)
	quoted := make([]string, len(words))
	for i, w := range words {
		quoted[i] = shellQuote(w)
	}
	return strings.Join(quoted, " ")
}

func shellQuote(s string) string {
	if s != "" && strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_./=:,@%+") == "" {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// RootfsKey addresses the root file system BuildRootfs makes of the image:
// "sha256:" over the config's bytes as hashed here, its layers' diff_ids
// and the setup BuildRootfs applies, so a change to that setup makes a new
// key. Before a Flatten it is what the config claims: good to look up a
// disk stored under VerifiedRootfsKey, never to store one.
func (im *Image) RootfsKey() string { return rootfsKey(im.configSum, im.diffIDs) }

// VerifiedRootfsKey is RootfsKey from the layers' hashes as the last
// complete Flatten computed them; an error if none checked every layer.
func (im *Image) VerifiedRootfsKey() (string, error) {
	im.mu.Lock()
	defer im.mu.Unlock()
	if im.verified == nil {
		return "", errors.New("the image's layers were not verified (no complete flatten)")
	}
	return rootfsKey(im.configSum, im.verified), nil
}

func (im *Image) setVerified(layers []v1.Hash) {
	im.mu.Lock()
	defer im.mu.Unlock()
	im.verified = layers
}

// rootfsKey is versioned: keys of imports made before layers were
// verified (format 1, over the uploader's digest) never match.
func rootfsKey(config v1.Hash, layers []v1.Hash) string {
	h := sha256.New()
	fmt.Fprintf(h, "ociimage rootfs/2\nconfig %s\n", config)
	for _, l := range layers {
		fmt.Fprintf(h, "layer %s\n", l)
	}
	fmt.Fprintf(h, "%d:%s", len(rootfsScript), rootfsScript)
	return "sha256:" + hex.EncodeToString(h.Sum(nil))
}
