// Package nbd is the transmission phase of the Network Block Device
// protocol as Linux's nbd driver speaks it over the socket it is handed
// (NBD_SET_SOCK): fixed-size request and simple-reply headers, a write's
// data after its request, a read's data after its reply. The guest agent
// relays the kernel's requests and the host (internal/volumes) answers
// them; both read headers with this package. The handshake is not here:
// the agent sets the device up with ioctls, so none is spoken. No Go NBD
// module is on the module proxy, and this part is small.
package nbd

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// Magic numbers of the headers.
const (
	RequestMagic = 0x25609513
	ReplyMagic   = 0x67446698
)

// Commands (Request.Type).
const (
	CmdRead  = 0
	CmdWrite = 1
	CmdDisc  = 2
	CmdFlush = 3
	CmdTrim  = 4
)

// Header sizes.
const (
	RequestLen = 28
	ReplyLen   = 16
)

// MaxLength bounds one request's length: the guest kernel's are at most
// max_sectors_kb (1280 KiB by default), so a larger read or write is a
// broken stream, and a stream holds at most this much memory on either
// side per request.
const MaxLength = 4 << 20

// Errors a reply carries (Linux errno values, as the protocol defines).
const (
	EIO    = 5
	EINVAL = 22
	ENOSPC = 28
)

// ErrProtocol is a header that breaks the protocol: the stream ends.
var ErrProtocol = errors.New("nbd: protocol violation")

// Request is a request header.
type Request struct {
	Flags  uint16
	Type   uint16
	Handle uint64
	Offset uint64
	Length uint32
}

// ParseRequest reads a request header, checking its magic and bounding its
// length by MaxLength.
func ParseRequest(hdr *[RequestLen]byte) (Request, error) {
	if binary.BigEndian.Uint32(hdr[0:4]) != RequestMagic {
		return Request{}, fmt.Errorf("%w: bad request magic", ErrProtocol)
	}
	q := Request{
		Flags:  binary.BigEndian.Uint16(hdr[4:6]),
		Type:   binary.BigEndian.Uint16(hdr[6:8]),
		Handle: binary.BigEndian.Uint64(hdr[8:16]),
		Offset: binary.BigEndian.Uint64(hdr[16:24]),
		Length: binary.BigEndian.Uint32(hdr[24:28]),
	}
	if q.Length > MaxLength {
		return Request{}, fmt.Errorf("%w: %d bytes in one request", ErrProtocol, q.Length)
	}
	return q, nil
}

// PutReply writes a simple reply header for handle with errno (0: done).
func PutReply(b *[ReplyLen]byte, handle uint64, errno uint32) {
	binary.BigEndian.PutUint32(b[0:4], ReplyMagic)
	binary.BigEndian.PutUint32(b[4:8], errno)
	binary.BigEndian.PutUint64(b[8:16], handle)
}
