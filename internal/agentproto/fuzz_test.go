package agentproto

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"testing"
)

// frame encodes one frame by hand, independently of WriteFrame.
func frame(kind byte, payload string) []byte {
	b := append([]byte{kind}, binary.BigEndian.AppendUint32(nil, uint32(len(payload)))...)
	return append(b, payload...)
}

// reader is a read-only stream over b.
func reader(b []byte) io.ReadWriter {
	return struct {
		io.Reader
		io.Writer
	}{bytes.NewReader(b), io.Discard}
}

// FuzzReadFrame reads a stream of frames under a size limit and checks every
// result against a plain reading of the bytes: frames come back exactly as
// sent and re-encode to the bytes they came from, a frame declared over the
// limit (or MaxFrame) is refused before its payload is read, nothing is
// invented past the input, and a JSON frame that decodes into a message
// re-encodes to a fixed point.
func FuzzReadFrame(f *testing.F) {
	f.Add(frame(KindJSON, `{"method":"exec","exec":{"command":"echo hi","stream":true}}`), MaxFrame)
	f.Add(append(frame(KindJSON, `{"entry":{"name":"a","path":"/workspace/a","type":"file","size":3,"mode":"644","modifiedAt":"2024-01-02T03:04:05Z"}}`),
		append(frame(KindData, "abc"), frame(KindJSON, `{"ok":true}`)...)...), MaxFrame)
	f.Add(frame(KindJSON, `{"type":"stdout","data":"aGk=","offset":0}`), 64)
	f.Add(frame(KindJSON, `{"type":"exit","offset":2,"exit":{"processId":"p1","exitCode":0,"state":"exited"}}`), 8)
	f.Add(frame(KindData, ""), 0)
	f.Add(frame(KindData, "x"), -1)
	f.Add(append([]byte{KindJSON}, binary.BigEndian.AppendUint32(nil, MaxFrame+1)...), MaxFrame+10)
	f.Add(append([]byte{KindData}, binary.BigEndian.AppendUint32(nil, 0xffffffff)...), MaxFrame)
	f.Add(frame('X', "??"), MaxFrame)
	f.Add([]byte{KindJSON, 0, 0}, MaxFrame)
	f.Fuzz(func(t *testing.T, data []byte, limit int) {
		c := NewConn(reader(data))
		effective := min(limit, MaxFrame)
		rest := data
		for {
			kind, payload, err := c.ReadFrameMax(limit)
			if len(rest) == 0 {
				if err != io.EOF {
					t.Fatalf("at the end of the input: kind %q, %d bytes, err %v; want io.EOF", kind, len(payload), err)
				}
				return
			}
			if len(rest) < 5 {
				if !errors.Is(err, io.ErrUnexpectedEOF) {
					t.Fatalf("partial header: err %v, want unexpected EOF", err)
				}
				return
			}
			n := binary.BigEndian.Uint32(rest[1:5])
			switch {
			case effective < 0 || uint64(n) > uint64(effective):
				if !errors.Is(err, ErrFrameTooLarge) {
					t.Fatalf("frame of %d bytes under limit %d: err %v, want ErrFrameTooLarge", n, limit, err)
				}
				return
			case rest[0] != KindJSON && rest[0] != KindData:
				if err == nil {
					t.Fatalf("frame kind %q accepted", rest[0])
				}
				return
			case uint64(len(rest)-5) < uint64(n):
				if !errors.Is(err, io.ErrUnexpectedEOF) {
					t.Fatalf("short frame: err %v, want unexpected EOF", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("valid frame of %d bytes refused: %v", n, err)
			}
			want := rest[:5+n]
			rest = rest[5+n:]
			if kind != want[0] || !bytes.Equal(payload, want[5:]) {
				t.Fatalf("got frame %q %q, want %q", kind, payload, want)
			}
			// The buffer grows with the bytes that arrived, not beyond
			// about twice the payload.
			if c := cap(payload); c > 2*len(payload)+readPrealloc+1024 {
				t.Fatalf("payload of %d bytes held in a buffer of %d", len(payload), c)
			}
			var out bytes.Buffer
			if err := NewConn(&out).WriteFrame(kind, payload); err != nil || !bytes.Equal(out.Bytes(), want) {
				t.Fatalf("re-encoded as %q (%v), want %q", out.Bytes(), err, want)
			}
			if kind == KindJSON {
				checkMessage[Request](t, payload)
				checkMessage[Reply](t, payload)
				checkMessage[Event](t, payload)
			}
		}
	})
}

// checkMessage decodes p as a T the way ReadJSON does and, if that works,
// checks that its encoding is a fixed point: decoding and encoding it again
// gives the same bytes.
func checkMessage[T any](t *testing.T, p []byte) {
	c := NewConn(reader(frame(KindJSON, string(p))))
	var v T
	if err := c.ReadJSON(&v); err != nil {
		return
	}
	var first bytes.Buffer
	if err := NewConn(&first).WriteJSON(v); err != nil {
		t.Fatalf("%T decoded but does not encode: %v", v, err)
	}
	enc := bytes.Clone(first.Bytes())
	var again T
	if err := NewConn(&first).ReadJSON(&again); err != nil {
		t.Fatalf("%T re-encoded as something it cannot read: %v\n%q", v, err, enc)
	}
	var second bytes.Buffer
	if err := NewConn(&second).WriteJSON(again); err != nil || !bytes.Equal(second.Bytes(), enc) {
		t.Fatalf("%T changed in a round trip (%v):\n%q\n%q", v, err, enc, second.Bytes())
	}
}
