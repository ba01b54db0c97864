package agentproto

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
)

// Frame kinds.
const (
	KindJSON byte = 'J'
	KindData byte = 'D'
)

// MaxFrame bounds one frame's payload. Both sides refuse bigger frames, so a
// hostile peer cannot make the other allocate without limit.
const MaxFrame = 4 << 20

// DataChunk is the size in which file contents are sent.
const DataChunk = 256 << 10

// ErrFrameTooLarge is returned for a frame whose declared size exceeds MaxFrame.
var ErrFrameTooLarge = errors.New("agentproto: frame too large")

// ErrUnknownKind is returned for a frame of a kind other than KindJSON and
// KindData.
var ErrUnknownKind = errors.New("agentproto: unknown frame kind")

// Conn reads and writes frames on one stream. It is not safe for concurrent
// writers; callers serialize writes themselves.
type Conn struct {
	r *bufio.Reader
	w io.Writer
}

// NewConn returns a Conn over rw.
func NewConn(rw io.ReadWriter) *Conn {
	return &Conn{r: bufio.NewReaderSize(rw, 64<<10), w: rw}
}

// WriteFrame writes one frame.
func (c *Conn) WriteFrame(kind byte, payload []byte) error {
	if len(payload) > MaxFrame {
		return ErrFrameTooLarge
	}
	var hdr [5]byte
	hdr[0] = kind
	binary.BigEndian.PutUint32(hdr[1:], uint32(len(payload)))
	// One write per frame keeps frames whole on the yamux stream.
	buf := make([]byte, 0, 5+len(payload))
	buf = append(buf, hdr[:]...)
	buf = append(buf, payload...)
	_, err := c.w.Write(buf)
	return err
}

// WriteJSON writes v as a JSON frame.
func (c *Conn) WriteJSON(v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("encoding %T: %w", v, err)
	}
	return c.WriteFrame(KindJSON, b)
}

// WriteData writes b as one or more data frames of at most DataChunk bytes.
// An empty b writes nothing.
func (c *Conn) WriteData(b []byte) error {
	for len(b) > 0 {
		n := min(len(b), DataChunk)
		if err := c.WriteFrame(KindData, b[:n]); err != nil {
			return err
		}
		b = b[n:]
	}
	return nil
}

// ReadFrame reads the next frame. The payload is freshly allocated.
func (c *Conn) ReadFrame() (kind byte, payload []byte, err error) {
	return c.ReadFrameMax(MaxFrame)
}

// readPrealloc bounds what ReadFrameMax allocates before the payload's bytes
// arrive: a peer that declares a large frame and then stalls costs no more.
const readPrealloc = 64 << 10

// ReadFrameMax reads the next frame, refusing with ErrFrameTooLarge one
// whose declared size exceeds limit (or MaxFrame). The buffer grows only as
// the payload's bytes arrive. The payload is freshly allocated.
func (c *Conn) ReadFrameMax(limit int) (kind byte, payload []byte, err error) {
	limit = min(limit, MaxFrame)
	var hdr [5]byte
	if _, err := io.ReadFull(c.r, hdr[:]); err != nil {
		return 0, nil, err
	}
	n := binary.BigEndian.Uint32(hdr[1:])
	if limit < 0 || uint64(n) > uint64(limit) {
		return 0, nil, ErrFrameTooLarge
	}
	kind = hdr[0]
	if kind != KindJSON && kind != KindData {
		return 0, nil, fmt.Errorf("%w %q", ErrUnknownKind, kind)
	}
	var buf bytes.Buffer
	buf.Grow(min(int(n), readPrealloc))
	if _, err := io.CopyN(&buf, c.r, int64(n)); err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return 0, nil, fmt.Errorf("agentproto: short frame: %w", err)
	}
	return kind, buf.Bytes(), nil
}

// ReadJSON reads the next frame, which must be a JSON frame, into v.
func (c *Conn) ReadJSON(v any) error {
	return c.ReadJSONMax(v, MaxFrame)
}

// ReadJSONMax is ReadJSON refusing a frame larger than limit.
func (c *Conn) ReadJSONMax(v any, limit int) error {
	kind, p, err := c.ReadFrameMax(limit)
	if err != nil {
		return err
	}
	if kind != KindJSON {
		return fmt.Errorf("agentproto: got frame kind %q, want JSON", kind)
	}
	if err := json.Unmarshal(p, v); err != nil {
		return fmt.Errorf("agentproto: decoding %T: %w", v, err)
	}
	return nil
}

// Reader returns the buffered reader of the stream: bytes after the last
// frame read may already be in it, so a stream that switches from frames to
// raw bytes must read them from here.
func (c *Conn) Reader() *bufio.Reader { return c.r }
