package agent

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
	"unsafe"

	"github.com/hashicorp/yamux"
	"golang.org/x/sys/unix"

	"github.com/emberbox/emberbox/internal/agentproto"
	"github.com/emberbox/emberbox/internal/nbd"
)

// A volume reaches the guest as /dev/nbdN: the kernel's NBD client talks
// to one end of a socketpair, and a relay carries its requests over a
// volume.nbd stream to the host, which answers them from the volume's file
// (internal/volumes). The relay keeps every request until its reply came
// back, so when the stream is lost (server restart, pause and wake) it
// opens a new one and sends those again: reads and writes of whole blocks
// are idempotent. The kernel waits meanwhile (no NBD timeout is set).

const (
	maxNBDDevices = 16 // the nbd module's default nbds_max
	// ext4IocResizeFS grows a mounted ext4 to a block count
	// (_IOW('f', 16, __u64)).
	ext4IocResizeFS = 0x40086610
)

// forbiddenMounts are paths a volume may not be mounted on or under.
var forbiddenMounts = []string{"/proc", "/sys", "/dev", "/run", "/etc", "/bin", "/sbin", "/lib", "/lib64",
	"/usr", "/boot", "/var/lib/dpkg", "/tmp/.X11-unix"}

// validMountPath reports why p cannot carry a volume, or "".
func validMountPath(p string) string {
	switch {
	case p == "" || !strings.HasPrefix(p, "/"):
		return "path must be absolute"
	case len(p) > 1024:
		return "path too long"
	case filepath.Clean(p) != p:
		return "path must be clean (no //, . or .. parts, no trailing /)"
	case p == "/":
		return "path must not be /"
	}
	for _, f := range forbiddenMounts {
		if p == f || strings.HasPrefix(p, f+"/") {
			return "path must not be " + f + " or under it"
		}
	}
	return ""
}

// volume is one attached volume.
type volume struct {
	a    *Agent
	id   string
	path string
	dev  *os.File // /dev/nbdN
	kern *os.File // our end of the socketpair
	peer *os.File // the kernel's end
	doIt chan error
	done chan struct{} // closed at detach: the relay stops

	mu      sync.Mutex
	pending map[uint64]*nbdRequest // by handle, until answered
	seq     uint64
	st      *yamux.Stream // the current host stream; nil while reconnecting
	wmu     sync.Mutex    // one writer on st at a time
	kmu     sync.Mutex    // one writer on kern at a time
	thaw    *time.Timer   // set while frozen: thaws when no thaw comes
}

func (a *Agent) volumeAttach(req *agentproto.VolumeRequest) error {
	if req == nil || req.AttachmentID == "" || len(req.AttachmentID) > 64 {
		return invalid("volume.attach: missing attachment")
	}
	if why := validMountPath(req.Path); why != "" {
		return invalid("volume.attach: " + why)
	}
	if req.SizeBytes <= 0 || req.SizeBytes%agentproto.VolumeBlockSize != 0 {
		return invalid("volume.attach: bad size")
	}
	a.volMu.Lock()
	defer a.volMu.Unlock()
	if a.vols == nil {
		a.vols = map[string]*volume{}
	}
	if v, ok := a.vols[req.AttachmentID]; ok {
		if v.path == req.Path {
			return nil // a retry of an attach that went through
		}
		return &agentproto.Error{Code: agentproto.CodeExists, Message: "attachment is mounted at " + v.path}
	}
	if len(a.vols) >= agentproto.MaxVolumeAttachments {
		return &agentproto.Error{Code: agentproto.CodeTooLarge, Message: "too many volumes attached"}
	}
	for _, v := range a.vols {
		if v.path == req.Path {
			return &agentproto.Error{Code: agentproto.CodeExists, Message: "a volume is mounted at " + req.Path}
		}
	}
	dev, err := a.freeNBD()
	if err != nil {
		return err
	}
	v := &volume{a: a, id: req.AttachmentID, path: req.Path, doIt: make(chan error, 1), done: make(chan struct{}),
		pending: map[uint64]*nbdRequest{}}
	if err := v.connect(dev, req.SizeBytes); err != nil {
		v.teardown()
		return err
	}
	if err := v.mount(req.SizeBytes); err != nil {
		v.disconnect()
		v.teardown()
		return err
	}
	a.vols[req.AttachmentID] = v
	a.log.Info("volume attached", "attachment", v.id, "device", dev, "path", v.path)
	return nil
}

// freeNBD returns a /dev/nbdN nobody uses. Called with volMu held.
func (a *Agent) freeNBD() (string, error) {
	if _, err := os.Stat("/sys/block/nbd0"); err != nil {
		return "", &agentproto.Error{Code: agentproto.CodeInternal, Message: "this guest has no nbd devices (module nbd)"}
	}
	used := map[string]bool{}
	for _, v := range a.vols {
		used[v.dev.Name()] = true
	}
	for i := range maxNBDDevices {
		dev := "/dev/nbd" + strconv.Itoa(i)
		if used[dev] {
			continue
		}
		if _, err := os.Stat(fmt.Sprintf("/sys/block/nbd%d/pid", i)); err == nil {
			continue // connected by someone else
		}
		if _, err := os.Stat(dev); err == nil {
			return dev, nil
		}
	}
	return "", &agentproto.Error{Code: agentproto.CodeTooLarge, Message: "no free nbd device"}
}

// connect hands the kernel a socketpair for dev, opens the host stream and
// starts the relay and the kernel's NBD_DO_IT.
func (v *volume) connect(dev string, size int64) error {
	f, err := os.OpenFile(dev, os.O_RDWR, 0)
	if err != nil {
		return fmt.Errorf("opening %s: %w", dev, err)
	}
	v.dev = f
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("socketpair: %w", err)
	}
	v.peer, v.kern = os.NewFile(uintptr(fds[0]), "nbd-kernel"), os.NewFile(uintptr(fds[1]), "nbd-relay")
	fd := int(f.Fd())
	for _, c := range []struct {
		req uint
		val int
	}{
		{nbdSetBlksize, agentproto.VolumeBlockSize},
		{nbdSetSizeBlocks, int(size / agentproto.VolumeBlockSize)},
		{nbdSetFlags, nbdFlagHasFlags | nbdFlagSendFlush | nbdFlagSendTrim},
		{nbdSetSock, int(v.peer.Fd())},
	} {
		if err := unix.IoctlSetInt(fd, c.req, c.val); err != nil {
			_ = unix.IoctlSetInt(fd, nbdClearSock, 0)
			return fmt.Errorf("nbd ioctl %#x on %s: %w", c.req, dev, err)
		}
	}
	st, err := v.open()
	if err != nil {
		_ = unix.IoctlSetInt(fd, nbdClearSock, 0)
		return err
	}
	v.st = st
	go func() { v.doIt <- unix.IoctlSetInt(fd, nbdDoIt, 0) }()
	go v.fromKernel()
	go v.fromHost(st)
	// The device has its size once NBD_DO_IT is running.
	name := filepath.Base(dev)
	deadline := time.Now().Add(10 * time.Second)
	for {
		b, _ := os.ReadFile("/sys/block/" + name + "/size")
		if n, _ := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64); n > 0 {
			return nil
		}
		select {
		case err := <-v.doIt:
			v.doIt <- err
			return fmt.Errorf("nbd on %s ended at once: %v", dev, err)
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			v.disconnect()
			return fmt.Errorf("%s did not come up", dev)
		}
	}
}

// open opens a volume.nbd stream on the current session and waits for the
// host to accept it.
func (v *volume) open() (*yamux.Stream, error) {
	st, fc, err := v.a.openEgressReq(agentproto.Request{Method: agentproto.MethodVolumeNBD,
		Volume: &agentproto.VolumeRequest{AttachmentID: v.id}})
	if err != nil {
		return nil, fmt.Errorf("opening the volume stream: %w", err)
	}
	_ = st.SetReadDeadline(time.Now().Add(30 * time.Second))
	var rep agentproto.Reply
	if err := fc.ReadJSON(&rep); err != nil {
		st.Close()
		return nil, fmt.Errorf("volume stream: %w", err)
	}
	_ = st.SetReadDeadline(time.Time{})
	if rep.Error != nil {
		st.Close()
		return nil, &agentproto.Error{Code: agentproto.CodePermission, Message: "host refused the volume: " + rep.Error.Message}
	}
	return st, nil
}

// fromKernel reads the kernel's requests, keeps them and sends them on.
func (v *volume) fromKernel() {
	for {
		q, err := readNBDRequest(v.kern)
		if err != nil {
			return // disconnected (or the socket closed at detach)
		}
		if q.typ == nbd.CmdDisc {
			// The kernel's receiver ends (and NBD_DO_IT returns) when the
			// "server" closes the connection. The host has nothing to do.
			_ = unix.Shutdown(int(v.kern.Fd()), unix.SHUT_RDWR)
			return
		}
		v.mu.Lock()
		v.seq++
		q.seq = v.seq
		v.pending[q.handle] = q
		st := v.st
		v.mu.Unlock()
		if st != nil {
			v.send(st, q) // on failure fromHost sees the stream end and resends
		}
	}
}

func (v *volume) send(st *yamux.Stream, q *nbdRequest) {
	v.wmu.Lock()
	defer v.wmu.Unlock()
	if _, err := st.Write(q.hdr[:]); err != nil {
		st.Close()
		return
	}
	if len(q.data) > 0 {
		if _, err := st.Write(q.data); err != nil {
			st.Close()
		}
	}
}

// fromHost hands the host's replies to the kernel until the stream ends,
// then reconnects and resends what is unanswered.
func (v *volume) fromHost(st *yamux.Stream) {
	for {
		v.relayReplies(st)
		st.Close()
		v.mu.Lock()
		if v.st == st {
			v.st = nil
		}
		v.mu.Unlock()
		if st = v.reopen(); st == nil {
			return
		}
	}
}

func (v *volume) relayReplies(st *yamux.Stream) {
	var hdr [nbd.ReplyLen]byte
	for {
		if _, err := io.ReadFull(st, hdr[:]); err != nil {
			return
		}
		if binary.BigEndian.Uint32(hdr[0:4]) != nbd.ReplyMagic {
			v.a.log.Warn("volume: bad reply magic from host", "attachment", v.id)
			return
		}
		handle := binary.BigEndian.Uint64(hdr[8:16])
		v.mu.Lock()
		q := v.pending[handle]
		pending := len(v.pending)
		v.mu.Unlock()
		if q == nil {
			v.a.log.Warn("volume: reply to no request", "attachment", v.id, "handle", handle, "pending", pending)
			return
		}
		var data []byte
		if q.typ == nbd.CmdRead && binary.BigEndian.Uint32(hdr[4:8]) == 0 {
			data = make([]byte, q.length)
			if _, err := io.ReadFull(st, data); err != nil {
				return // still pending: resent on the next stream
			}
		}
		// Answered: forgotten before the kernel sees the reply, because
		// the kernel may send its next request under the same handle at
		// once (a flush and the write it orders share a tag, and their
		// cookies can be equal). Forgotten after, that request would be
		// lost, its reply refused and the device hung.
		v.mu.Lock()
		if v.pending[handle] == q {
			delete(v.pending, handle)
		}
		v.mu.Unlock()
		v.kmu.Lock()
		_, err := v.kern.Write(append(hdr[:], data...))
		v.kmu.Unlock()
		if err != nil {
			return
		}
	}
}

// reopen waits for a host session, opens a new stream and resends the
// unanswered requests in order; nil once the volume is detached.
func (v *volume) reopen() *yamux.Stream {
	wait := 100 * time.Millisecond
	for {
		select {
		case <-v.done:
			return nil
		case <-time.After(wait):
		}
		wait = min(2*wait, time.Second)
		if s := v.a.session(); s == nil || s.IsClosed() {
			continue
		}
		st, err := v.open()
		if err != nil {
			v.a.log.Warn("volume: reopening its stream", "attachment", v.id, "err", err)
			continue
		}
		v.mu.Lock()
		v.st = st
		resend := make([]*nbdRequest, 0, len(v.pending))
		for _, q := range v.pending {
			resend = append(resend, q)
		}
		v.mu.Unlock()
		slices.SortFunc(resend, func(a, b *nbdRequest) int { return int(a.seq - b.seq) })
		for _, q := range resend {
			v.send(st, q)
		}
		v.a.log.Info("volume stream reopened", "attachment", v.id, "resent", len(resend))
		return st
	}
}

// mount mounts the device and grows its filesystem to the volume's size.
// noinit_itable: the host made the filesystem on a new sparse file, whose
// inode tables read as zeros already, so the kernel need not write them
// over the stream.
func (v *volume) mount(size int64) error {
	if fi, err := os.Lstat(v.path); err == nil && !fi.IsDir() {
		return &agentproto.Error{Code: agentproto.CodeNotADirectory, Message: v.path + " is not a directory"}
	}
	if err := os.MkdirAll(v.path, 0o755); err != nil {
		return fmt.Errorf("creating %s: %w", v.path, err)
	}
	if err := unix.Mount(v.dev.Name(), v.path, "ext4", unix.MS_NOSUID|unix.MS_NODEV, "noinit_itable"); err != nil {
		return fmt.Errorf("mounting %s on %s: %w", v.dev.Name(), v.path, err)
	}
	var fs unix.Statfs_t
	if err := unix.Statfs(v.path, &fs); err != nil {
		return nil
	}
	if bs := int64(fs.Bsize); bs > 0 && int64(fs.Blocks)*bs < size-64<<20 {
		d, err := os.Open(v.path)
		if err != nil {
			return nil
		}
		defer d.Close()
		blocks := uint64(size / bs)
		// The ioctl takes a pointer to the new block count.
		if _, _, e := unix.Syscall(unix.SYS_IOCTL, d.Fd(), ext4IocResizeFS, uintptr(unsafe.Pointer(&blocks))); e != 0 {
			v.a.log.Warn("volume: growing the filesystem", "attachment", v.id, "err", e)
		}
	}
	return nil
}

func (a *Agent) volumeDetach(req *agentproto.VolumeRequest) error {
	if req == nil || req.AttachmentID == "" {
		return invalid("volume.detach: missing attachment")
	}
	a.volMu.Lock()
	defer a.volMu.Unlock()
	v, ok := a.vols[req.AttachmentID]
	if !ok {
		return nil // detached already
	}
	if v.thaw != nil {
		v.thaw.Stop()
		v.thaw = nil
		_ = fsIoctl(v.path, fsThaw)
	}
	if err := unix.Unmount(v.path, 0); err != nil && !errors.Is(err, unix.EINVAL) {
		if errors.Is(err, unix.EBUSY) {
			return &agentproto.Error{Code: agentproto.CodeBusy, Message: v.path + " is in use (a process has a file or its working directory there)"}
		}
		return fmt.Errorf("unmounting %s: %w", v.path, err)
	}
	v.disconnect()
	v.teardown()
	delete(a.vols, req.AttachmentID)
	a.log.Info("volume detached", "attachment", v.id, "path", v.path)
	return nil
}

// disconnect ends NBD_DO_IT.
func (v *volume) disconnect() {
	fd := int(v.dev.Fd())
	_ = unix.IoctlSetInt(fd, nbdDisconnect, 0)
	select {
	case <-v.doIt:
	case <-time.After(10 * time.Second):
		v.a.log.Warn("volume: nbd did not disconnect", "attachment", v.id)
	}
	_ = unix.IoctlSetInt(fd, nbdClearSock, 0)
}

// teardown stops the relay and closes what connect opened.
func (v *volume) teardown() {
	select {
	case <-v.done:
	default:
		close(v.done)
	}
	v.mu.Lock()
	st := v.st
	v.st = nil
	v.mu.Unlock()
	if st != nil {
		st.Close()
	}
	for _, f := range []*os.File{v.kern, v.peer, v.dev} {
		if f != nil {
			f.Close()
		}
	}
}

// fsFreeze and fsThaw are FIFREEZE and FITHAW (_IOWR('X', 119/120, int)).
const (
	fsFreeze = 0xc0045877
	fsThaw   = 0xc0045878
)

// volumeFreeze freezes (or thaws) an attachment's filesystem, for a
// consistent copy on the host. A freeze thaws by itself after
// agentproto.FreezeTimeout, so a host that dies mid-copy cannot leave the
// guest's writes held.
func (a *Agent) volumeFreeze(req *agentproto.VolumeRequest, freeze bool) error {
	if req == nil || req.AttachmentID == "" {
		return invalid("volume.freeze: missing attachment")
	}
	a.volMu.Lock()
	defer a.volMu.Unlock()
	v, ok := a.vols[req.AttachmentID]
	if !ok {
		return &agentproto.Error{Code: agentproto.CodeFileNotFound, Message: "no such attachment"}
	}
	if freeze == (v.thaw != nil) {
		return nil // frozen already, or not frozen
	}
	if freeze {
		if err := fsIoctl(v.path, fsFreeze); err != nil {
			return fmt.Errorf("freezing %s: %w", v.path, err)
		}
		v.thaw = time.AfterFunc(agentproto.FreezeTimeout*time.Second, func() {
			a.log.Warn("volume: thawing after no thaw came", "attachment", v.id)
			_ = a.volumeFreeze(&agentproto.VolumeRequest{AttachmentID: v.id}, false)
		})
		return nil
	}
	v.thaw.Stop()
	v.thaw = nil
	if err := fsIoctl(v.path, fsThaw); err != nil && !errors.Is(err, unix.EINVAL) {
		return fmt.Errorf("thawing %s: %w", v.path, err)
	}
	return nil
}

func fsIoctl(path string, req uint) error {
	d, err := os.Open(path)
	if err != nil {
		return err
	}
	defer d.Close()
	return unix.IoctlSetPointerInt(int(d.Fd()), req, 0)
}

// volumeSyncAll flushes every attached volume's filesystem.
func (a *Agent) volumeSyncAll() {
	a.volMu.Lock()
	defer a.volMu.Unlock()
	for _, v := range a.vols {
		d, err := os.Open(v.path)
		if err != nil {
			continue
		}
		if err := unix.Syncfs(int(d.Fd())); err != nil {
			a.log.Warn("volume: syncfs", "attachment", v.id, "err", err)
		}
		d.Close()
	}
}
