package qemu

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/emberbox/emberbox/internal/errdefs"
)

// A sandbox's disk overlay is owned by its VM's uid: a QEMU the guest took
// over may rewrite its qcow2 header. qemu-img, run as root at a snapshot,
// follows what that header says: a backing file or an external data file
// naming any host file would be read into the snapshot, or written. So
// before a root tool opens such an image, its header is read here, by a
// small strict parser, and the image is refused unless it is a plain qcow2
// keeping its data in itself, over exactly the backing file the driver
// gave it.

// qcow2 header fields and extensions (docs/interop/qcow2.txt in QEMU).
const (
	qcow2Magic        = 0x514649fb // "QFI\xfb"
	qcow2V2HeaderLen  = 72
	qcow2V3HeaderLen  = 104
	qcow2MinCluster   = 9
	qcow2MaxCluster   = 21
	qcow2MaxBacking   = 1023 // QEMU's own bound on the backing file name
	qcow2ExtEnd       = 0x00000000
	qcow2ExtBackFmt   = 0xe2792aca
	qcow2ExtDataFile  = 0x44415441
	qcow2ExtEncrypt   = 0x0537be77
	qcow2IncompatData = 1 << 2 // external data file
	// Incompatible features a self-contained image may have: dirty,
	// compression type, extended L2 entries. Any other (corrupt, external
	// data file, unknown) is refused.
	qcow2IncompatOK   = 1<<0 | 1<<3 | 1<<4
	qcow2AutoclearRaw = 1 << 1 // data file is raw: only with a data file
)

// qcow2Header is what matters of a qcow2 header for trusting the image.
type qcow2Header struct {
	Version       uint32
	ClusterBits   uint32
	BackingFile   string // "" none
	BackingFormat string // "" not stated
	DataFile      string // external data file named by the extension
	Incompatible  uint64
	Autoclear     uint64
	Encrypted     bool
}

// parseQcow2Header reads the header of a qcow2 image from b, its first
// cluster (or all of it, if shorter). It fails on anything out of bounds;
// what the fields mean for trust is checkQcow2Header's.
func parseQcow2Header(b []byte) (*qcow2Header, error) {
	be := binary.BigEndian
	if len(b) < qcow2V2HeaderLen {
		return nil, errors.New("shorter than a qcow2 header")
	}
	if be.Uint32(b[0:]) != qcow2Magic {
		return nil, errors.New("not a qcow2 image (bad magic)")
	}
	h := &qcow2Header{Version: be.Uint32(b[4:]), ClusterBits: be.Uint32(b[20:]), Encrypted: be.Uint32(b[32:]) != 0}
	if h.Version != 2 && h.Version != 3 {
		return nil, fmt.Errorf("qcow2 version %d", h.Version)
	}
	if h.ClusterBits < qcow2MinCluster || h.ClusterBits > qcow2MaxCluster {
		return nil, fmt.Errorf("qcow2 cluster bits %d", h.ClusterBits)
	}
	cluster := uint64(1) << h.ClusterBits
	if uint64(len(b)) > cluster {
		b = b[:cluster] // the header, its extensions and the backing name all live in the first cluster
	}
	headerLen := uint64(qcow2V2HeaderLen)
	if h.Version == 3 {
		if len(b) < qcow2V3HeaderLen {
			return nil, errors.New("shorter than a qcow2 v3 header")
		}
		h.Incompatible, h.Autoclear = be.Uint64(b[72:]), be.Uint64(b[88:])
		headerLen = uint64(be.Uint32(b[100:]))
		if headerLen < qcow2V3HeaderLen || headerLen > uint64(len(b)) {
			return nil, fmt.Errorf("qcow2 header length %d", headerLen)
		}
	}
	backOff, backLen := be.Uint64(b[8:]), uint64(be.Uint32(b[16:]))
	extEnd := uint64(len(b))
	if backOff != 0 {
		if backOff < headerLen || backLen > qcow2MaxBacking || backOff+backLen > uint64(len(b)) {
			return nil, fmt.Errorf("qcow2 backing file name out of bounds (offset %d, length %d)", backOff, backLen)
		}
		h.BackingFile = string(b[backOff : backOff+backLen])
		extEnd = backOff
	}
	if err := h.readExtensions(b[:extEnd], headerLen); err != nil {
		return nil, err
	}
	return h, nil
}

// readExtensions reads the header extensions from off up to the end of b
// (8-byte type and length, then the data padded to 8 bytes), until the end
// marker, which must be there.
func (h *qcow2Header) readExtensions(b []byte, off uint64) error {
	be := binary.BigEndian
	for off < uint64(len(b)) {
		if off+8 > uint64(len(b)) {
			return errors.New("qcow2 header extension cut short")
		}
		typ, n := be.Uint32(b[off:]), uint64(be.Uint32(b[off+4:]))
		if typ == qcow2ExtEnd {
			return nil
		}
		data := off + 8
		if n > uint64(len(b))-data {
			return fmt.Errorf("qcow2 header extension %#x of %d bytes runs past the header", typ, n)
		}
		switch typ {
		case qcow2ExtBackFmt:
			h.BackingFormat = string(b[data : data+n])
		case qcow2ExtDataFile:
			h.DataFile = string(b[data : data+n])
			if h.DataFile == "" {
				h.DataFile = "(unnamed)" // still an external data file
			}
		case qcow2ExtEncrypt:
			h.Encrypted = true
		}
		off = data + (n+7)&^7
	}
	return errors.New("qcow2 header extensions have no end") // QEMU always writes one
}

// qcow2Backing is the backing file an image must have.
type qcow2Backing struct {
	Any    bool   // any (or none): the header is about to be rewritten (a move)
	Path   string // exactly this file ("" none)
	Format string // stated as this format
}

// checkQcow2Header refuses an image root tools must not open: one whose
// data or encryption is outside it, marked corrupt or with features this
// parser does not know, or whose backing file is not the one wanted.
func checkQcow2Header(h *qcow2Header, want qcow2Backing) error {
	switch {
	case h.DataFile != "" || h.Incompatible&qcow2IncompatData != 0 || h.Autoclear&qcow2AutoclearRaw != 0:
		return errors.New("it names an external data file")
	case h.Encrypted:
		return errors.New("it is encrypted")
	case h.Incompatible&^qcow2IncompatOK != 0:
		return fmt.Errorf("it has incompatible features %#x", h.Incompatible&^qcow2IncompatOK)
	case want.Any:
		return nil
	case want.Path == "" && h.BackingFile != "":
		return fmt.Errorf("it has a backing file (%q) where it should have none", h.BackingFile)
	case h.BackingFile != want.Path:
		return fmt.Errorf("its backing file is %q, not %s", h.BackingFile, want.Path)
	case want.Path != "" && h.BackingFormat != want.Format:
		return fmt.Errorf("its backing format is %q, not %s", h.BackingFormat, want.Format)
	}
	return nil
}

// checkVMQcow2 reads the header of the qcow2 image name, which a VM or a
// peer could have written, and refuses it (an invalid-argument error
// naming the image and the reason) unless root tools may read it: see
// checkQcow2Header.
func checkVMQcow2(name string, want qcow2Backing) error {
	h, err := readQcow2Header(name)
	if err == nil {
		err = checkQcow2Header(h, want)
	}
	if err != nil {
		return errdefs.New(errdefs.ErrInvalidArgument, "disk_refused",
			"the disk image %s is not one this server reads as root: %v", filepath.Base(name), err).
			WithHint("its header was changed from outside this server (inside the sandbox's VM, or on the node it came from); delete the sandbox")
	}
	return nil
}

// readQcow2Header reads the first cluster of name and parses its header.
func readQcow2Header(name string) (*qcow2Header, error) {
	if err := regular(name); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(name, os.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b := make([]byte, 1<<qcow2MaxCluster)
	n, err := io.ReadFull(f, b)
	if err != nil && !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("reading the header: %w", err)
	}
	return parseQcow2Header(b[:n])
}
