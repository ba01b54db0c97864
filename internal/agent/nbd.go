package agent

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// The NBD transmission phase as the kernel speaks it over the socket it is
// handed (NBD_SET_SOCK): fixed-size request and simple-reply headers, a
// write's data after its request, a read's data after its reply.

const (
	nbdRequestMagic = 0x25609513
	nbdReplyMagic   = 0x67446698

	nbdCmdRead  = 0
	nbdCmdWrite = 1
	nbdCmdDisc  = 2
	nbdCmdFlush = 3
	nbdCmdTrim  = 4

	nbdRequestLen = 28
	nbdReplyLen   = 16

	// maxNBDLength bounds one request's length. The kernel's requests are
	// far smaller (max_sectors_kb), so a larger one is a broken stream.
	maxNBDLength = 4 << 20 // as the host's volumes.MaxRequest
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
	hdr    [nbdRequestLen]byte
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
	if binary.BigEndian.Uint32(q.hdr[0:4]) != nbdRequestMagic {
		return nil, errors.New("nbd: bad request magic")
	}
	q.typ = binary.BigEndian.Uint16(q.hdr[6:8])
	q.handle = binary.BigEndian.Uint64(q.hdr[8:16])
	q.length = binary.BigEndian.Uint32(q.hdr[24:28])
	if q.typ == nbdCmdWrite {
		if q.length > maxNBDLength {
			return nil, fmt.Errorf("nbd: write of %d bytes", q.length)
		}
		q.data = make([]byte, q.length)
		if _, err := io.ReadFull(r, q.data); err != nil {
			return nil, err
		}
	}
	return q, nil
}
