package volumes

import (
	"bufio"
	"errors"
	"io"
	"os"

	"golang.org/x/sys/unix"

	"github.com/emberbox/emberbox/internal/nbd"
)

// The host's side of the NBD transmission phase (internal/nbd): the agent
// relays the guest kernel's requests and this answers them from the
// volume's file. A guest holds at most nbd.MaxLength of the host's memory
// per volume: one stream is served per attachment.

// serveNBD answers the requests read from r with replies on w, from f of
// size bytes, until DISC, the end of r, or a request that breaks the
// protocol (nbd.ErrProtocol). Every offset and length is checked against size
// before the file is touched.
func serveNBD(r *bufio.Reader, w io.Writer, f *os.File, size int64) error {
	var hdr [nbd.RequestLen]byte
	var reply [nbd.ReplyLen]byte
	buf := make([]byte, 0, 1<<20)
	for {
		if _, err := io.ReadFull(r, hdr[:]); err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
		q, err := nbd.ParseRequest(&hdr)
		if err != nil {
			return err
		}
		typ, off, length := q.Type, q.Offset, q.Length
		inBounds := off <= uint64(size) && uint64(length) <= uint64(size)-off
		var code uint32
		var data []byte
		switch typ {
		case nbd.CmdRead:
			if !inBounds {
				code = nbd.EINVAL
				break
			}
			buf = grow(buf, int(length))
			data = buf
			if _, err := f.ReadAt(data, int64(off)); err != nil && !errors.Is(err, io.EOF) {
				code, data = nbd.EIO, nil
			}
		case nbd.CmdWrite:
			buf = grow(buf, int(length))
			data = buf
			if _, err := io.ReadFull(r, data); err != nil {
				return err
			}
			switch {
			case !inBounds:
				code = nbd.EINVAL
			default:
				if _, err := f.WriteAt(data, int64(off)); err != nil {
					code = nbd.EIO
					if errors.Is(err, unix.ENOSPC) {
						code = nbd.ENOSPC
					}
				}
			}
			data = nil
		case nbd.CmdFlush:
			if err := datasync(f); err != nil {
				code = nbd.EIO
			}
		case nbd.CmdTrim:
			if !inBounds {
				code = nbd.EINVAL
			} else if length > 0 {
				// A hole where the guest freed blocks; a failure to punch
				// one loses nothing.
				punchHole(f, int64(off), int64(length))
			}
		case nbd.CmdDisc:
			return nil
		default:
			code = nbd.EINVAL
		}
		nbd.PutReply(&reply, q.Handle, code)
		if _, err := w.Write(reply[:]); err != nil {
			return err
		}
		if code == 0 && typ == nbd.CmdRead {
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
