package volumes

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"

	"golang.org/x/sys/unix"
)

// The host's side of the NBD transmission phase: the agent relays the
// guest kernel's requests (already past the handshake: the agent sets the
// device up with ioctls) and this answers them from the volume's file. No
// Go NBD module is on the proxy, and this phase is small: READ, WRITE,
// FLUSH, TRIM and DISC with simple replies.

const (
	nbdRequestMagic = 0x25609513
	nbdReplyMagic   = 0x67446698

	nbdCmdRead  = 0
	nbdCmdWrite = 1
	nbdCmdDisc  = 2
	nbdCmdFlush = 3
	nbdCmdTrim  = 4

	// MaxRequest bounds one request's length: the guest kernel's are at
	// most max_sectors_kb (1280 KiB by default), so a larger read or write
	// ends the stream. With one stream served per attachment, a guest
	// holds at most MaxRequest of the host's memory per volume.
	MaxRequest = 4 << 20

	nbdEIO    = 5
	nbdEINVAL = 22
	nbdENOSPC = 28
)

// errProtocol is a request that breaks the protocol: the stream ends.
var errProtocol = errors.New("nbd: protocol violation")

// serveNBD answers the requests read from r with replies on w, from f of
// size bytes, until DISC, the end of r, or a request that breaks the
// protocol (errProtocol). Every offset and length is checked against size
// before the file is touched.
func serveNBD(r *bufio.Reader, w io.Writer, f *os.File, size int64) error {
	var hdr [28]byte
	var reply [16]byte
	binary.BigEndian.PutUint32(reply[0:4], nbdReplyMagic)
	buf := make([]byte, 0, 1<<20)
	for {
		if _, err := io.ReadFull(r, hdr[:]); err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
		if binary.BigEndian.Uint32(hdr[0:4]) != nbdRequestMagic {
			return fmt.Errorf("%w: bad magic", errProtocol)
		}
		typ := binary.BigEndian.Uint16(hdr[6:8])
		copy(reply[8:16], hdr[8:16]) // the handle
		off := binary.BigEndian.Uint64(hdr[16:24])
		length := binary.BigEndian.Uint32(hdr[24:28])
		if length > MaxRequest {
			return fmt.Errorf("%w: %d bytes in one request", errProtocol, length)
		}
		inBounds := off <= uint64(size) && uint64(length) <= uint64(size)-off
		var code uint32
		var data []byte
		switch typ {
		case nbdCmdRead:
			if !inBounds {
				code = nbdEINVAL
				break
			}
			buf = grow(buf, int(length))
			data = buf
			if _, err := f.ReadAt(data, int64(off)); err != nil && !errors.Is(err, io.EOF) {
				code, data = nbdEIO, nil
			}
		case nbdCmdWrite:
			buf = grow(buf, int(length))
			data = buf
			if _, err := io.ReadFull(r, data); err != nil {
				return err
			}
			switch {
			case !inBounds:
				code = nbdEINVAL
			default:
				if _, err := f.WriteAt(data, int64(off)); err != nil {
					code = nbdEIO
					if errors.Is(err, unix.ENOSPC) {
						code = nbdENOSPC
					}
				}
			}
			data = nil
		case nbdCmdFlush:
			if err := datasync(f); err != nil {
				code = nbdEIO
			}
		case nbdCmdTrim:
			if !inBounds {
				code = nbdEINVAL
			} else if length > 0 {
				// A hole where the guest freed blocks; a failure to punch
				// one loses nothing.
				punchHole(f, int64(off), int64(length))
			}
		case nbdCmdDisc:
			return nil
		default:
			code = nbdEINVAL
		}
		binary.BigEndian.PutUint32(reply[4:8], code)
		if _, err := w.Write(reply[:]); err != nil {
			return err
		}
		if code == 0 && typ == nbdCmdRead {
			if _, err := w.Write(data); err != nil {
				return err
			}
		}
	}
}

func grow(b []byte, n int) []byte {
	if cap(b) >= n {
		return b[:n]
	}
	return make([]byte, n)
}
