package agentproto

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"runtime"
	"testing"
)

func TestFrameRoundTrip(t *testing.T) {
	var buf bytes.Buffer
	c := NewConn(&buf)
	if err := c.WriteJSON(Request{Method: MethodExec, Exec: &ExecRequest{Command: "true", Stdin: []byte{0, 255}}}); err != nil {
		t.Fatal(err)
	}
	data := bytes.Repeat([]byte{7}, DataChunk+10)
	if err := c.WriteData(data); err != nil {
		t.Fatal(err)
	}
	var req Request
	if err := c.ReadJSON(&req); err != nil {
		t.Fatal(err)
	}
	if req.Method != MethodExec || req.Exec.Command != "true" || !bytes.Equal(req.Exec.Stdin, []byte{0, 255}) {
		t.Errorf("got %+v", req)
	}
	var got []byte
	for len(got) < len(data) {
		kind, p, err := c.ReadFrame()
		if err != nil || kind != KindData {
			t.Fatalf("frame kind %q, err %v", kind, err)
		}
		if len(p) > DataChunk {
			t.Errorf("data frame of %d bytes, want at most %d", len(p), DataChunk)
		}
		got = append(got, p...)
	}
	if !bytes.Equal(got, data) {
		t.Error("data changed in transit")
	}
	if _, _, err := c.ReadFrame(); !errors.Is(err, io.EOF) {
		t.Errorf("after the last frame: %v, want EOF", err)
	}
}

func TestHostileFrames(t *testing.T) {
	tests := []struct {
		name  string
		input []byte
	}{
		{"oversized length", append([]byte{KindJSON}, binary.BigEndian.AppendUint32(nil, MaxFrame+1)...)},
		{"unknown kind", append([]byte{'X'}, binary.BigEndian.AppendUint32(nil, 1)...)},
		{"short payload", append(append([]byte{KindData}, binary.BigEndian.AppendUint32(nil, 100)...), 1, 2, 3)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := NewConn(bytes.NewBuffer(tt.input))
			if _, _, err := c.ReadFrame(); err == nil {
				t.Error("got no error")
			}
		})
	}
	var buf bytes.Buffer
	if err := NewConn(&buf).WriteFrame(KindData, make([]byte, MaxFrame+1)); !errors.Is(err, ErrFrameTooLarge) {
		t.Errorf("writing an oversized frame: %v", err)
	}
	c := NewConn(bytes.NewBuffer(append(append([]byte{KindData}, binary.BigEndian.AppendUint32(nil, 1)...), 'x')))
	var v Reply
	if err := c.ReadJSON(&v); err == nil {
		t.Error("ReadJSON accepted a data frame")
	}
}

// A frame's declared size must not be allocated before its bytes arrive: a
// peer declaring MaxFrame and sending a few bytes costs little.
func TestReadFrameGrowsAsBytesArrive(t *testing.T) {
	input := append(append([]byte{KindData}, binary.BigEndian.AppendUint32(nil, MaxFrame)...), 1, 2, 3)
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for range 10 {
		c := NewConn(bytes.NewBuffer(input))
		if _, _, err := c.ReadFrame(); !errors.Is(err, io.ErrUnexpectedEOF) {
			t.Fatalf("got %v, want unexpected EOF", err)
		}
	}
	runtime.ReadMemStats(&after)
	// Each Conn has a 64 KiB bufio buffer and a 64 KiB payload buffer at
	// most; allocating the declared 4 MiB ten times would be 40 MiB.
	if d := after.TotalAlloc - before.TotalAlloc; d > 4<<20 {
		t.Errorf("reading 10 truncated 4 MiB frames allocated %d bytes", d)
	}

	// Large frames that do arrive are read whole.
	var buf bytes.Buffer
	data := bytes.Repeat([]byte{9}, MaxFrame)
	if err := NewConn(&buf).WriteFrame(KindData, data); err != nil {
		t.Fatal(err)
	}
	if _, p, err := NewConn(&buf).ReadFrame(); err != nil || !bytes.Equal(p, data) {
		t.Errorf("full frame: %d bytes, %v", len(p), err)
	}
}

func TestReadFrameMax(t *testing.T) {
	var buf bytes.Buffer
	c := NewConn(&buf)
	if err := c.WriteFrame(KindJSON, []byte(`{"method":"x"}`)); err != nil {
		t.Fatal(err)
	}
	if err := c.WriteFrame(KindData, make([]byte, 100)); err != nil {
		t.Fatal(err)
	}
	var req Request
	if err := c.ReadJSONMax(&req, 100); err != nil || req.Method != "x" {
		t.Errorf("small frame: %+v, %v", req, err)
	}
	if _, _, err := c.ReadFrameMax(99); !errors.Is(err, ErrFrameTooLarge) {
		t.Errorf("frame over the limit: %v, want ErrFrameTooLarge", err)
	}
}
