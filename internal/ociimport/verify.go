package ociimport

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"sync"
	"sync/atomic"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/emberbox/emberbox/internal/errdefs"
)

// CodeLayerMismatch refuses an image whose layer content is not what its
// config's rootfs.diff_ids name: layers packed with another image's config.
const CodeLayerMismatch = "image_layer_mismatch"

// Every layer's uncompressed stream is hashed while mutate.Extract reads
// it, and checked against the config's diff_ids. The config is hashed by
// us (RootfsKey), so once its diff_ids hold, the key stands for the
// layers' content, not for whatever bytes an uploader packed with it.

// layerCheck collects the hashes of one Flatten's layer streams.
type layerCheck struct {
	want []v1.Hash // the config's diff_ids, bottom layer first
	// stopped ends drains once the flatten has returned (a stream abandoned
	// on another error need not be read to its end).
	stopped atomic.Bool

	mu  sync.Mutex
	got []v1.Hash // zero until a layer's stream was read to its end
	bad error     // the first mismatch
}

func newLayerCheck(want []v1.Hash) *layerCheck {
	return &layerCheck{want: want, got: make([]v1.Hash, len(want))}
}

// record notes the hash of layer i's whole stream and returns the
// mismatch error if it is not the one the config names.
func (c *layerCheck) record(i int, got v1.Hash) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.got[i] = got
	if got == c.want[i] {
		return nil
	}
	err := errLayerMismatch(i, len(c.want), c.want[i], got)
	if c.bad == nil {
		c.bad = err
	}
	return err
}

// mismatch returns the first mismatch recorded, if any.
func (c *layerCheck) mismatch() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.bad
}

// verified returns every layer's hash, or an error if a layer's stream
// was not read to its end (then its content was not checked).
func (c *layerCheck) verified() ([]v1.Hash, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, h := range c.got {
		if h != c.want[i] {
			return nil, invalid("layer %d of %d was not read to its end; its content is unchecked", i, len(c.want))
		}
	}
	return append([]v1.Hash(nil), c.got...), nil
}

func errLayerMismatch(i, n int, want, got v1.Hash) error {
	e := errdefs.New(errdefs.ErrInvalidArgument, CodeLayerMismatch,
		"layer %d of %d (from the bottom, counting from 0) is not the layer the image config names: its content hashes to %s, the config's rootfs.diff_ids[%d] is %s",
		i, n, got, i, want).
		WithHint("Export the image again (docker save, or an OCI layout) without changing its layers.")
	e.Details = map[string]any{"layer": i, "expected": want.String(), "actual": got.String()}
	return e
}

// checkedImage hands mutate.Extract layers whose streams are checked.
type checkedImage struct {
	v1.Image
	chk *layerCheck
}

func (c checkedImage) Layers() ([]v1.Layer, error) {
	ls, err := c.Image.Layers()
	if err != nil {
		return nil, err
	}
	if len(ls) != len(c.chk.want) {
		return nil, invalid("the image has %d layers but its config's rootfs.diff_ids lists %d", len(ls), len(c.chk.want))
	}
	out := make([]v1.Layer, len(ls))
	for i, l := range ls {
		out[i] = checkedLayer{Layer: l, i: i, chk: c.chk}
	}
	return out, nil
}

type checkedLayer struct {
	v1.Layer
	i   int
	chk *layerCheck
}

func (l checkedLayer) Uncompressed() (io.ReadCloser, error) {
	rc, err := l.Layer.Uncompressed()
	if err != nil {
		return nil, err
	}
	return &hashingReader{rc: rc, h: sha256.New(), i: l.i, chk: l.chk}, nil
}

// hashingReader hashes a layer's uncompressed stream as it is read. At
// its end it records the hash; a mismatch replaces io.EOF, so the reader
// fails where it stands. A tar reader stops at the archive's end marker,
// before the stream's end (padding, or bytes appended after it): Close
// reads the rest into the hash, still in the one pass.
type hashingReader struct {
	rc   io.ReadCloser
	h    hash.Hash
	i    int
	chk  *layerCheck
	done bool
	err  error
}

func (r *hashingReader) Read(p []byte) (int, error) {
	if r.done {
		return 0, r.endErr()
	}
	n, err := r.rc.Read(p)
	r.h.Write(p[:n])
	if errors.Is(err, io.EOF) {
		r.done = true
		r.err = r.chk.record(r.i, v1.Hash{Algorithm: "sha256", Hex: hex.EncodeToString(r.h.Sum(nil))})
		return n, r.endErr()
	}
	return n, err
}

func (r *hashingReader) endErr() error {
	if r.err != nil {
		return r.err
	}
	return io.EOF
}

// Close reads what the tar reader left and closes the stream; a read
// error leaves the layer unrecorded, so the flatten fails.
func (r *hashingReader) Close() error {
	buf := make([]byte, 32<<10)
	for !r.done && !r.chk.stopped.Load() {
		if _, err := r.Read(buf); err != nil {
			break
		}
	}
	if err := r.rc.Close(); err != nil {
		return fmt.Errorf("closing layer %d: %w", r.i, err)
	}
	return nil
}
