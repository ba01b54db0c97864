package qemu

import (
	"encoding/binary"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/emberbox/emberbox/internal/errdefs"
)

// qcow2Ext is one header extension of a crafted image.
type qcow2Ext struct {
	typ  uint32
	data string
}

// craftQcow2 is the first cluster (64 KiB) of a qcow2 v3 image with the
// given backing file name (after the extensions), extensions and
// incompatible features; fix edits the bytes last.
func craftQcow2(backing string, incompat uint64, exts []qcow2Ext, fix func(b []byte)) []byte {
	be := binary.BigEndian
	b := make([]byte, 1<<16)
	be.PutUint32(b[0:], qcow2Magic)
	be.PutUint32(b[4:], 3)
	be.PutUint32(b[20:], 16)
	be.PutUint64(b[24:], 64<<20)
	be.PutUint64(b[72:], incompat)
	be.PutUint32(b[96:], 4)
	be.PutUint32(b[100:], qcow2V3HeaderLen)
	off := qcow2V3HeaderLen
	for _, e := range exts {
		be.PutUint32(b[off:], e.typ)
		be.PutUint32(b[off+4:], uint32(len(e.data)))
		copy(b[off+8:], e.data)
		off += 8 + (len(e.data)+7)&^7
	}
	off += 8 // the end marker: zeros
	if backing != "" {
		be.PutUint64(b[8:], uint64(off))
		be.PutUint32(b[16:], uint32(len(backing)))
		copy(b[off:], backing)
	}
	if fix != nil {
		fix(b)
	}
	return b
}

const testRootfs = "/var/cache/emberbox/images/abc/rootfs.img"

func TestQcow2HeaderChecks(t *testing.T) {
	rootfs := qcow2Backing{Path: testRootfs, Format: "raw"}
	fmtRaw := qcow2Ext{qcow2ExtBackFmt, "raw"}
	for _, tc := range []struct {
		name   string
		image  []byte
		want   qcow2Backing
		refuse string // "" accepted; else part of the reason
	}{
		{"the driver's overlay", craftQcow2(testRootfs, 0, []qcow2Ext{fmtRaw, {0x6803f857, "feature table"}}, nil), rootfs, ""},
		{"no backing where none is wanted", craftQcow2("", 1<<0|1<<3, nil, nil), qcow2Backing{}, ""},
		{"backing a host file", craftQcow2("/etc/shadow", 0, []qcow2Ext{fmtRaw}, nil), rootfs, `backing file is "/etc/shadow"`},
		{"backing by json options", craftQcow2(`json:{"file.filename":"`+testRootfs+`"}`, 0, []qcow2Ext{fmtRaw}, nil), rootfs, "backing file is"},
		{"backing our base as qcow2", craftQcow2(testRootfs, 0, []qcow2Ext{{qcow2ExtBackFmt, "qcow2"}}, nil), rootfs, "backing format"},
		{"backing format left to probing", craftQcow2(testRootfs, 0, nil, nil), rootfs, "backing format"},
		{"a backing where none is wanted", craftQcow2(testRootfs, 0, []qcow2Ext{fmtRaw}, nil), qcow2Backing{}, "should have none"},
		{"a data file extension", craftQcow2(testRootfs, qcow2IncompatData, []qcow2Ext{fmtRaw, {qcow2ExtDataFile, "/etc/shadow"}}, nil), rootfs, "external data file"},
		{"a data file extension without the feature bit", craftQcow2(testRootfs, 0, []qcow2Ext{fmtRaw, {qcow2ExtDataFile, "/dev/sda"}}, nil), rootfs, "external data file"},
		{"the data file bit alone", craftQcow2(testRootfs, qcow2IncompatData, []qcow2Ext{fmtRaw}, nil), rootfs, "external data file"},
		{"raw data file autoclear bit", craftQcow2(testRootfs, 0, []qcow2Ext{fmtRaw}, func(b []byte) { b[95] = qcow2AutoclearRaw }), rootfs, "external data file"},
		{"an unknown incompatible feature", craftQcow2(testRootfs, 1<<9, []qcow2Ext{fmtRaw}, nil), rootfs, "incompatible features 0x200"},
		{"marked corrupt", craftQcow2(testRootfs, 1<<1, []qcow2Ext{fmtRaw}, nil), rootfs, "incompatible features 0x2"},
		{"encrypted", craftQcow2(testRootfs, 0, []qcow2Ext{fmtRaw}, func(b []byte) { b[35] = 2 }), rootfs, "encrypted"},
		{"any backing for a move", craftQcow2("/other/host/rootfs", 0, []qcow2Ext{fmtRaw}, nil), qcow2Backing{Any: true}, ""},
		{"a data file even for a move", craftQcow2("", qcow2IncompatData, nil, nil), qcow2Backing{Any: true}, "external data file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h, err := parseQcow2Header(tc.image)
			if err != nil {
				t.Fatalf("parse: %v", err)
			}
			err = checkQcow2Header(h, tc.want)
			switch {
			case tc.refuse == "" && err != nil:
				t.Errorf("refused: %v", err)
			case tc.refuse != "" && (err == nil || !strings.Contains(err.Error(), tc.refuse)):
				t.Errorf("got %v, want a refusal naming %q", err, tc.refuse)
			}
		})
	}
}

func TestQcow2HeaderMalformed(t *testing.T) {
	be := binary.BigEndian
	for name, b := range map[string][]byte{
		"empty":                          nil,
		"short":                          craftQcow2("", 0, nil, nil)[:71],
		"bad magic":                      craftQcow2("", 0, nil, func(b []byte) { b[0] = 'X' }),
		"version 4":                      craftQcow2("", 0, nil, func(b []byte) { be.PutUint32(b[4:], 4) }),
		"cluster bits 30":                craftQcow2("", 0, nil, func(b []byte) { be.PutUint32(b[20:], 30) }),
		"header length under v3's":       craftQcow2("", 0, nil, func(b []byte) { be.PutUint32(b[100:], 72) }),
		"header length past the cluster": craftQcow2("", 0, nil, func(b []byte) { be.PutUint32(b[100:], 1<<17) }),
		"backing name past the cluster":  craftQcow2("/x", 0, nil, func(b []byte) { be.PutUint64(b[8:], 1<<16-1) }),
		"backing name inside the header": craftQcow2("/x", 0, nil, func(b []byte) { be.PutUint64(b[8:], 8) }),
		"backing name too long":          craftQcow2(strings.Repeat("a", 1024), 0, nil, nil),
		"extension past the header": craftQcow2("/x", 0, []qcow2Ext{{qcow2ExtBackFmt, "raw"}}, func(b []byte) {
			be.PutUint32(b[qcow2V3HeaderLen+4:], 1<<15)
		}),
		"extensions without an end": craftQcow2("", 0, nil, func(b []byte) {
			for off := qcow2V3HeaderLen; off+8 <= len(b); off += 8 {
				be.PutUint32(b[off:], 0x1234)
			}
		}),
	} {
		if _, err := parseQcow2Header(b); err == nil {
			t.Errorf("%s: parsed", name)
		}
	}
}

// Images qemu-img itself writes parse as it reads them: an overlay's
// backing and format, and an external data file, which is refused.
func TestQcow2HeaderOfQemuImg(t *testing.T) {
	img := qemuImg(t)
	dir := t.TempDir()
	base := filepath.Join(dir, "rootfs.img")
	if err := os.WriteFile(base, make([]byte, 1<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	overlay := filepath.Join(dir, diskFile)
	qemuImgRun(t, img, "create", "-q", "-f", "qcow2", "-F", "raw", "-b", base, overlay, "64M")
	if err := checkVMQcow2(overlay, qcow2Backing{Path: base, Format: "raw"}); err != nil {
		t.Fatalf("the driver's own overlay: %v", err)
	}
	withData := filepath.Join(dir, "data.qcow2")
	qemuImgRun(t, img, "create", "-q", "-f", "qcow2", "-o", "data_file="+filepath.Join(dir, "data"), withData, "64M")
	err := checkVMQcow2(withData, qcow2Backing{Any: true})
	if errdefs.Code(err) != "disk_refused" || !strings.Contains(err.Error(), "external data file") {
		t.Fatalf("an image with a data file: %v, want disk_refused naming the data file", err)
	}
	v2 := filepath.Join(dir, "v2.qcow2")
	qemuImgRun(t, img, "create", "-q", "-f", "qcow2", "-o", "compat=0.10", "-F", "raw", "-b", base, v2, "64M")
	if err := checkVMQcow2(v2, qcow2Backing{Path: base, Format: "raw"}); err != nil {
		t.Fatalf("a v2 overlay: %v", err)
	}
}

// The check a snapshot makes before its root qemu-img convert: the disk
// chain as the driver made it passes; a header the VM's uid rewrote to
// reach a host file, or to add a data file, is refused.
func TestSnapshotChecksDiskChain(t *testing.T) {
	img := qemuImg(t)
	dir := t.TempDir()
	base := filepath.Join(dir, "rootfs.img")
	if err := os.WriteFile(base, make([]byte, 1<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	sbDir := filepath.Join(dir, "sbx")
	if err := os.Mkdir(sbDir, 0o700); err != nil {
		t.Fatal(err)
	}
	disk := filepath.Join(sbDir, diskFile)
	m := &machine{dir: sbDir, rootfs: base}
	qemuImgRun(t, img, "create", "-q", "-f", "qcow2", "-F", "raw", "-b", base, disk, "64M")
	if err := m.checkChain(); err != nil {
		t.Fatalf("the driver's chain: %v", err)
	}
	qemuImgRun(t, img, "rebase", "-u", "-f", "qcow2", "-F", "raw", "-b", "/etc/passwd", disk)
	if err := m.checkChain(); errdefs.Code(err) != "disk_refused" || !strings.Contains(err.Error(), "/etc/passwd") {
		t.Fatalf("overlay over /etc/passwd: %v, want disk_refused", err)
	}

	// A copy of a snapshot: overlay → snapshot disk → base image.
	snap := filepath.Join(dir, "snap", snapDiskFile)
	if err := os.Mkdir(filepath.Dir(snap), 0o755); err != nil {
		t.Fatal(err)
	}
	qemuImgRun(t, img, "create", "-q", "-f", "qcow2", "-F", "raw", "-b", base, snap, "64M")
	qemuImgRun(t, img, "create", "-q", "-f", "qcow2", "-F", "qcow2", "-b", snap, disk, "64M")
	if err := os.WriteFile(filepath.Join(sbDir, chainFile), []byte(snap+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := m.checkChain(); err != nil {
		t.Fatalf("a copy's chain: %v", err)
	}
	qemuImgRun(t, img, "rebase", "-u", "-f", "qcow2", "-F", "raw", "-b", base, disk)
	if err := m.checkChain(); errdefs.Code(err) != "disk_refused" {
		t.Fatalf("a copy's overlay skipping its snapshot disk: %v, want disk_refused", err)
	}
	qemuImgRun(t, img, "create", "-q", "-f", "qcow2", "-o", "data_file="+filepath.Join(dir, "stolen"), "-F", "qcow2", "-b", snap, disk, "64M")
	if err := m.checkChain(); errdefs.Code(err) != "disk_refused" || !strings.Contains(err.Error(), "external data file") {
		t.Fatalf("a copy's overlay with a data file: %v, want disk_refused", err)
	}
}

func qemuImgRun(t *testing.T, img string, args ...string) {
	t.Helper()
	if out, err := exec.Command(img, args...).CombinedOutput(); err != nil {
		t.Fatalf("qemu-img %s: %v: %s", strings.Join(args, " "), err, out)
	}
}

// FuzzQcow2Header: any bytes parse or fail without panicking, and what
// parses keeps its names within QEMU's bounds.
func FuzzQcow2Header(f *testing.F) {
	f.Add(craftQcow2(testRootfs, 0, []qcow2Ext{{qcow2ExtBackFmt, "raw"}}, nil)[:512])
	f.Add(craftQcow2("", qcow2IncompatData, []qcow2Ext{{qcow2ExtDataFile, "/etc/shadow"}}, nil)[:512])
	f.Add(craftQcow2("/x", 0, nil, func(b []byte) { binary.BigEndian.PutUint32(b[4:], 2) })[:256])
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := parseQcow2Header(b)
		if err != nil {
			return
		}
		if len(h.BackingFile) > qcow2MaxBacking {
			t.Fatalf("backing name of %d bytes", len(h.BackingFile))
		}
		if h.ClusterBits < qcow2MinCluster || h.ClusterBits > qcow2MaxCluster {
			t.Fatalf("cluster bits %d accepted", h.ClusterBits)
		}
		_ = checkQcow2Header(h, qcow2Backing{Path: testRootfs, Format: "raw"})
	})
}
