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
	s := &nbdStream{r: r, f: f, size: size, buf: make([]byte, 0, 1<<20)}
	var hdr [nbd.RequestLen]byte
	var reply [nbd.ReplyLen]byte
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
		if q.Type == nbd.CmdDisc {
			return nil
		}
		code, data, err := s.answer(q)
		if err != nil {
			return err
		}
		nbd.PutReply(&reply, q.Handle, code)
		if _, err := w.Write(reply[:]); err != nil {
			return err
		}
		if code == 0 && q.Type == nbd.CmdRead {
			if _, err := w.Write(data); err != nil {
				return err
			}
		}
	}
}

// nbdStream is what one stream's requests are answered from: the volume's
// file of size bytes, and the buffer reads and writes reuse (bounded by
// nbd.MaxLength, as ParseRequest bounds a request's length).
type nbdStream struct {
	r    *bufio.Reader
	f    *os.File
	size int64
	buf  []byte
}

// answer carries out q (not DISC) and returns the reply's error code and,
// for a read that succeeded, its data. An error ends the stream.
func (s *nbdStream) answer(q nbd.Request) (code uint32, data []byte, err error) {
	off, length := q.Offset, q.Length
	inBounds := off <= uint64(s.size) && uint64(length) <= uint64(s.size)-off
	switch q.Type {
	case nbd.CmdRead:
		if !inBounds {
			return nbd.EINVAL, nil, nil
		}
		code, data = s.read(off, length)
		return code, data, nil
	case nbd.CmdWrite:
		code, err = s.write(off, length, inBounds)
		return code, nil, err
	case nbd.CmdFlush:
		if err := datasync(s.f); err != nil {
			return nbd.EIO, nil, nil
		}
		return 0, nil, nil
	case nbd.CmdTrim:
		if !inBounds {
			return nbd.EINVAL, nil, nil
		}
		if length > 0 {
			// A hole where the guest freed blocks; a failure to punch
			// one loses nothing.
			punchHole(s.f, int64(off), int64(length))
		}
		return 0, nil, nil
	}
	return nbd.EINVAL, nil, nil
}

// read reads length bytes at off, checked in bounds by the caller.
func (s *nbdStream) read(off uint64, length uint32) (code uint32, data []byte) {
	s.buf = grow(s.buf, int(length))
	if _, err := s.f.ReadAt(s.buf, int64(off)); err != nil && !errors.Is(err, io.EOF) {
		return nbd.EIO, nil
	}
	return 0, s.buf
}

// write takes a write's payload off the stream, whether in bounds or not,
// so that the next request is read where it starts; only then is a write
// out of bounds refused.
func (s *nbdStream) write(off uint64, length uint32, inBounds bool) (code uint32, err error) {
	s.buf = grow(s.buf, int(length))
	if _, err := io.ReadFull(s.r, s.buf); err != nil {
		return 0, err
	}
	if !inBounds {
		return nbd.EINVAL, nil
	}
	if _, err := s.f.WriteAt(s.buf, int64(off)); err != nil {
		if errors.Is(err, unix.ENOSPC) {
			return nbd.ENOSPC, nil
		}
		return nbd.EIO, nil
	}
	return 0, nil
}

func grow(b []byte, n int) []byte {
	if cap(b) >= n {
		return b[:n]
	}
	return make([]byte, n)
}
