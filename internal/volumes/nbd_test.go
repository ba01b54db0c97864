package volumes

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/emberbox/emberbox/internal/nbd"
)

func nbdReq(typ uint16, handle, off uint64, length uint32, data []byte) []byte {
	var h [28]byte
	binary.BigEndian.PutUint32(h[0:4], nbd.RequestMagic)
	binary.BigEndian.PutUint16(h[6:8], typ)
	binary.BigEndian.PutUint64(h[8:16], handle)
	binary.BigEndian.PutUint64(h[16:24], off)
	binary.BigEndian.PutUint32(h[24:28], length)
	return append(h[:], data...)
}

type nbdReply struct {
	code   uint32
	handle uint64
	data   []byte
}

// readReplies parses replies; reads carry length bytes when code is 0.
func readReplies(t *testing.T, b []byte, readLens map[uint64]int) []nbdReply {
	t.Helper()
	var out []nbdReply
	for len(b) > 0 {
		if len(b) < 16 || binary.BigEndian.Uint32(b[0:4]) != nbd.ReplyMagic {
			t.Fatalf("bad reply %x", b)
		}
		r := nbdReply{code: binary.BigEndian.Uint32(b[4:8]), handle: binary.BigEndian.Uint64(b[8:16])}
		b = b[16:]
		if n := readLens[r.handle]; n > 0 && r.code == 0 {
			r.data, b = b[:n], b[n:]
		}
		out = append(out, r)
	}
	return out
}

func volumeFile(t *testing.T, size int64) *os.File {
	f, err := os.Create(filepath.Join(t.TempDir(), "disk.raw"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	return f
}

func TestServeNBDReadsWritesAndBounds(t *testing.T) {
	const size = 1 << 20
	f := volumeFile(t, size)
	data := bytes.Repeat([]byte("ab"), 2048)
	var in bytes.Buffer
	in.Write(nbdReq(nbd.CmdWrite, 1, 4096, uint32(len(data)), data))
	in.Write(nbdReq(nbd.CmdRead, 2, 4096, uint32(len(data)), nil))
	in.Write(nbdReq(nbd.CmdRead, 3, size-512, 1024, nil))           // past the end
	in.Write(nbdReq(nbd.CmdWrite, 4, size, 512, make([]byte, 512))) // at the end
	in.Write(nbdReq(nbd.CmdRead, 5, ^uint64(0)-10, 4096, nil))      // offset+length overflows
	in.Write(nbdReq(nbd.CmdTrim, 6, 0, 8192, nil))                  // punches a hole
	in.Write(nbdReq(nbd.CmdFlush, 7, 0, 0, nil))                    //
	in.Write(nbdReq(nbd.CmdRead, 8, 4096, 4096, nil))               // zero after the trim
	in.Write(nbdReq(99, 9, 0, 0, nil))                              // unknown command
	in.Write(nbdReq(nbd.CmdDisc, 10, 0, 0, nil))                    // ends the loop
	in.Write(nbdReq(nbd.CmdRead, 11, 0, 4096, nil))                 // never read
	var out bytes.Buffer
	if err := serveNBD(bufio.NewReader(&in), &out, f, size); err != nil {
		t.Fatalf("serveNBD: %v", err)
	}
	reps := readReplies(t, out.Bytes(), map[uint64]int{2: len(data), 3: 1024, 5: 4096, 8: 4096})
	want := map[uint64]uint32{1: 0, 2: 0, 3: nbd.EINVAL, 4: nbd.EINVAL, 5: nbd.EINVAL, 6: 0, 7: 0, 8: 0, 9: nbd.EINVAL}
	if len(reps) != len(want) {
		t.Fatalf("%d replies, want %d: %+v", len(reps), len(want), reps)
	}
	for _, r := range reps {
		if r.code != want[r.handle] {
			t.Errorf("handle %d: code %d, want %d", r.handle, r.code, want[r.handle])
		}
	}
	if !bytes.Equal(reps[1].data, data) {
		t.Errorf("read back %q…", reps[1].data[:8])
	}
	if !bytes.Equal(reps[7].data, make([]byte, 4096)) {
		t.Errorf("a trimmed block reads non-zero")
	}
	if st, _ := f.Stat(); st.Size() != size {
		t.Errorf("the file grew to %d", st.Size())
	}
}

func TestServeNBDRefusesBrokenStreams(t *testing.T) {
	f := volumeFile(t, 1<<20)
	for name, in := range map[string][]byte{
		"bad magic":     append([]byte{1, 2, 3, 4}, make([]byte, 24)...),
		"huge write":    nbdReq(nbd.CmdWrite, 1, 0, nbd.MaxLength+1, nil),
		"huge read":     nbdReq(nbd.CmdRead, 1, 0, nbd.MaxLength+1, nil),
		"short payload": nbdReq(nbd.CmdWrite, 1, 0, 4096, make([]byte, 100)),
	} {
		err := serveNBD(bufio.NewReader(bytes.NewReader(in)), io.Discard, f, 1<<20)
		if err == nil {
			t.Errorf("%s: served", name)
		}
		if name != "short payload" && !errors.Is(err, nbd.ErrProtocol) {
			t.Errorf("%s: %v, want a protocol violation", name, err)
		}
	}
}

func TestCheckPath(t *testing.T) {
	for _, p := range []string{"/data", "/workspace/vol", "/mnt/a-b"} {
		if why := checkPath(p); why != "" {
			t.Errorf("%q refused: %s", p, why)
		}
	}
	for _, p := range []string{"", "data", "/", "/data/", "/a/../etc", "//x", "/proc", "/proc/x", "/etc", "/dev/shm", "/sys", "/usr/local"} {
		if checkPath(p) == "" {
			t.Errorf("%q accepted", p)
		}
	}
}
