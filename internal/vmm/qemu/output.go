package qemu

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"syscall"

	"golang.org/x/sys/unix"
)

// listenSockets makes the VM's agent and console sockets, listening, as
// files for QEMU to inherit in the order agentFD, consoleFD, qmpFD. The server
// owns their directory; QEMU only ever holds the descriptors.
func listenSockets(dir string) ([]*os.File, error) {
	var files []*os.File
	for _, name := range []string{agentSocket, consoleSock, qmpSocket} {
		f, err := listenUnix(dir, name)
		if err != nil {
			closeAll(files)
			return nil, err
		}
		files = append(files, f)
	}
	return files, nil
}

// listenUnix listens on dir/name and returns the listener's file. The path
// goes through /proc/self/fd, as in dialUnix, to stay short.
func listenUnix(dir, name string) (*os.File, error) {
	df, err := os.Open(dir)
	if err != nil {
		return nil, err
	}
	defer df.Close()
	path := fmt.Sprintf("/proc/self/fd/%d/%s", df.Fd(), name)
	_ = os.Remove(path) // left by an earlier boot
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("making %s: %w", name, err)
	}
	// The socket stays for QEMU; closing the server's copy must not
	// unlink it.
	l.SetUnlinkOnClose(false)
	defer l.Close()
	f, err := l.File()
	if err != nil {
		return nil, fmt.Errorf("making %s: %w", name, err)
	}
	return f, nil
}

func closeAll(files []*os.File) {
	for _, f := range files {
		f.Close()
	}
}

// openOutput makes the FIFO QEMU's stdout and stderr go to and opens both
// ends: a FIFO rather than a pipe, so that a restarted server can open it
// again and keep copying what QEMU writes into the bounded qemu.log. While
// no server reads it, QEMU's writes fail (EPIPE; QEMU ignores SIGPIPE)
// rather than block.
func openOutput(dir string) (r, w *os.File, err error) {
	p := filepath.Join(dir, qemuPipe)
	_ = os.Remove(p)
	if err := unix.Mkfifo(p, 0o600); err != nil {
		return nil, nil, fmt.Errorf("making %s: %w", qemuPipe, err)
	}
	// The read end first, without blocking: then opening the write end
	// does not wait for a reader.
	if r, err = os.OpenFile(p, os.O_RDONLY|syscall.O_NONBLOCK, 0); err != nil {
		return nil, nil, err
	}
	if w, err = os.OpenFile(p, os.O_WRONLY, 0); err != nil {
		r.Close()
		return nil, nil, err
	}
	return r, w, nil
}

// reopenOutput opens the FIFO of a VM started by an earlier server.
func reopenOutput(dir string) (*os.File, error) {
	p := filepath.Join(dir, qemuPipe)
	if st, err := os.Lstat(p); err != nil || st.Mode()&os.ModeNamedPipe == 0 {
		return nil, errors.New("no output fifo")
	}
	return os.OpenFile(p, os.O_RDONLY|syscall.O_NONBLOCK, 0)
}

// copyOutput copies QEMU's output into qemu.log, two generations of
// consoleLimit bytes, until QEMU closes it by exiting.
func copyOutput(r *os.File, dir string) {
	defer r.Close()
	w := &boundedLog{path: filepath.Join(dir, qemuLog), limit: consoleLimit}
	defer w.Close()
	buf := make([]byte, 16<<10)
	for {
		n, err := r.Read(buf)
		if n > 0 {
			w.Write(buf[:n])
		}
		if err != nil { // io.EOF once QEMU has exited
			return
		}
	}
}
