package agent

import (
	"bytes"
	"encoding/binary"
	"testing"

	"github.com/emberbox/emberbox/internal/nbd"
)

func TestValidMountPath(t *testing.T) {
	for _, p := range []string{"/data", "/workspace/vol", "/home/user/x", "/mnt/a"} {
		if why := validMountPath(p); why != "" {
			t.Errorf("%q refused: %s", p, why)
		}
	}
	for _, p := range []string{"", "rel", "/", "/data/", "/a/../b", "/a//b", "/./a", "/proc", "/proc/1", "/sys/x",
		"/dev", "/dev/shm", "/run/x", "/etc", "/etc/ssl", "/usr/bin", "/lib", "/boot"} {
		if validMountPath(p) == "" {
			t.Errorf("%q accepted", p)
		}
	}
}

func request(typ uint16, handle uint64, length uint32, data []byte) []byte {
	var h [nbd.RequestLen]byte
	binary.BigEndian.PutUint32(h[0:4], nbd.RequestMagic)
	binary.BigEndian.PutUint16(h[6:8], typ)
	binary.BigEndian.PutUint64(h[8:16], handle)
	binary.BigEndian.PutUint32(h[24:28], length)
	return append(h[:], data...)
}

func TestReadNBDRequest(t *testing.T) {
	in := bytes.NewReader(append(request(nbd.CmdWrite, 7, 4, []byte("abcd")), request(nbd.CmdRead, 8, 4096, nil)...))
	q, err := readNBDRequest(in)
	if err != nil || q.typ != nbd.CmdWrite || q.handle != 7 || string(q.data) != "abcd" {
		t.Fatalf("write: %+v %v", q, err)
	}
	q, err = readNBDRequest(in)
	if err != nil || q.typ != nbd.CmdRead || q.length != 4096 || q.data != nil {
		t.Fatalf("read: %+v %v", q, err)
	}
	if _, err := readNBDRequest(bytes.NewReader(request(nbd.CmdWrite, 1, nbd.MaxLength+1, nil))); err == nil {
		t.Error("an oversized write was read")
	}
	bad := request(nbd.CmdRead, 1, 0, nil)
	bad[0] = 0
	if _, err := readNBDRequest(bytes.NewReader(bad)); err == nil {
		t.Error("a bad magic was read")
	}
}
