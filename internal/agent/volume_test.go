package agent

import (
	"bytes"
	"encoding/binary"
	"io"
	"log/slog"
	"net"
	"os"
	"testing"

	"github.com/hashicorp/yamux"
	"golang.org/x/sys/unix"

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

// TestReplyForgottenBeforeTheKernelSeesIt checks that an answered request
// leaves the pending set before its reply reaches the kernel: the kernel
// may reuse the handle for its next request as soon as it reads the reply,
// and that request must not be forgotten in its place. The kernel's end of
// the socket pair reads the reply's header while the relay is still blocked
// writing the reply's data, so the check does not depend on timing.
func TestReplyForgottenBeforeTheKernelSeesIt(t *testing.T) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	_ = unix.SetsockoptInt(fds[0], unix.SOL_SOCKET, unix.SO_SNDBUF, 4096)
	_ = unix.SetsockoptInt(fds[1], unix.SOL_SOCKET, unix.SO_RCVBUF, 4096)
	relayEnd, kernelEnd := os.NewFile(uintptr(fds[0]), "relay"), os.NewFile(uintptr(fds[1]), "kernel")
	defer relayEnd.Close()
	defer kernelEnd.Close()

	hostConn, guestConn := net.Pipe()
	cfg := yamux.DefaultConfig()
	cfg.LogOutput = io.Discard
	host, err := yamux.Server(hostConn, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer host.Close()
	guest, err := yamux.Client(guestConn, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer guest.Close()
	st, err := guest.OpenStream()
	if err != nil {
		t.Fatal(err)
	}
	hs, err := host.AcceptStream()
	if err != nil {
		t.Fatal(err)
	}

	const handle, length = 0x1_0000_0007, 1 << 20
	v := &volume{a: &Agent{log: slog.New(slog.DiscardHandler)}, id: "att_test", kern: relayEnd,
		pending: map[uint64]*nbdRequest{handle: {typ: nbd.CmdRead, handle: handle, length: length}}}
	relayed := make(chan struct{})
	go func() { defer close(relayed); v.relayReplies(st) }()

	var reply [nbd.ReplyLen]byte
	nbd.PutReply(&reply, handle, 0)
	go func() {
		_, _ = hs.Write(reply[:])
		_, _ = hs.Write(make([]byte, length))
	}()

	var got [nbd.ReplyLen]byte
	if _, err := io.ReadFull(kernelEnd, got[:]); err != nil {
		t.Fatal(err)
	}
	if got != reply {
		t.Fatalf("the kernel read %x, want %x", got, reply)
	}
	v.mu.Lock()
	_, still := v.pending[handle]
	v.mu.Unlock()
	if still {
		t.Errorf("request %#x still pending when the kernel read its reply", handle)
	}
	if n, err := io.CopyN(io.Discard, kernelEnd, length); err != nil {
		t.Fatalf("the reply's data: %d bytes, %v", n, err)
	}
	hs.Close()
	<-relayed
}
