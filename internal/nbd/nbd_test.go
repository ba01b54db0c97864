package nbd

import (
	"encoding/binary"
	"errors"
	"testing"
)

func TestParseRequest(t *testing.T) {
	var hdr [RequestLen]byte
	binary.BigEndian.PutUint32(hdr[0:4], RequestMagic)
	binary.BigEndian.PutUint16(hdr[6:8], CmdWrite)
	binary.BigEndian.PutUint64(hdr[8:16], 42)
	binary.BigEndian.PutUint64(hdr[16:24], 4096)
	binary.BigEndian.PutUint32(hdr[24:28], 512)
	q, err := ParseRequest(&hdr)
	if err != nil || q != (Request{Type: CmdWrite, Handle: 42, Offset: 4096, Length: 512}) {
		t.Fatalf("ParseRequest = %+v, %v", q, err)
	}
	binary.BigEndian.PutUint32(hdr[24:28], MaxLength+1)
	if _, err := ParseRequest(&hdr); !errors.Is(err, ErrProtocol) {
		t.Errorf("an oversize request: %v, want ErrProtocol", err)
	}
	binary.BigEndian.PutUint32(hdr[0:4], ReplyMagic)
	if _, err := ParseRequest(&hdr); !errors.Is(err, ErrProtocol) {
		t.Errorf("a bad magic: %v, want ErrProtocol", err)
	}
	var reply [ReplyLen]byte
	PutReply(&reply, 42, EIO)
	if binary.BigEndian.Uint32(reply[0:4]) != ReplyMagic || binary.BigEndian.Uint32(reply[4:8]) != EIO ||
		binary.BigEndian.Uint64(reply[8:16]) != 42 {
		t.Errorf("reply %x", reply)
	}
}
