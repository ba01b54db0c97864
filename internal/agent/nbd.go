package agent

import (
	"io"

	"github.com/emberbox/emberbox/internal/nbd"
)

// ioctls of /dev/nbdN (linux/nbd.h) and its flags.
const (
	nbdSetSock       = 0xab00
	nbdSetBlksize    = 0xab01
	nbdDoIt          = 0xab03
	nbdClearSock     = 0xab04
	nbdSetSizeBlocks = 0xab07
	nbdDisconnect    = 0xab08
	nbdSetFlags      = 0xab0a

	nbdFlagHasFlags  = 1 << 0
	nbdFlagSendFlush = 1 << 2
	nbdFlagSendTrim  = 1 << 5
)

// nbdRequest is one request the kernel sent, kept until answered.
type nbdRequest struct {
	seq    uint64 // order read from the kernel, for resending in order
	hdr    [nbd.RequestLen]byte
	typ    uint16
	handle uint64
	length uint32
	data   []byte // a write's bytes
}

// readNBDRequest reads one request (and a write's data) from r.
func readNBDRequest(r io.Reader) (*nbdRequest, error) {
	q := &nbdRequest{}
	if _, err := io.ReadFull(r, q.hdr[:]); err != nil {
		return nil, err
	}
	h, err := nbd.ParseRequest(&q.hdr)
	if err != nil {
		return nil, err
	}
	q.typ, q.handle, q.length = h.Type, h.Handle, h.Length
	if q.typ == nbd.CmdWrite {
		q.data = make([]byte, q.length)
		if _, err := io.ReadFull(r, q.data); err != nil {
			return nil, err
		}
	}
	return q, nil
}
