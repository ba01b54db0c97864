package guest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/emberbox/emberbox/internal/agentproto"
	"github.com/emberbox/emberbox/internal/errdefs"
)

// Nothing a guest sends is trusted: root in the guest can stop the agent
// and answer the host's calls itself. Each answer is therefore bounded per
// method, in bytes and in list elements, and a list is counted before it is
// decoded, so an oversized one is refused before the host builds it.
const (
	// MaxReply bounds the JSON reply of an ordinary call (info, stat,
	// mkdir, process.get, ...): one small struct.
	MaxReply = 1 << 20
	// maxListReply bounds the replies that carry a list (process.list,
	// file.list) or captured output (exec): what the frame format allows.
	maxListReply = agentproto.MaxFrame
	// MaxEventFrame bounds one event of a streamed exec or of
	// process.output; the agent sends output in chunks of 32 KiB.
	MaxEventFrame = 1 << 20
	// maxNestedItems bounds the elements of all lists nested inside one
	// reply (a process's argv, say), and maxJSONDepth their nesting.
	maxNestedItems = 1 << 16
	maxJSONDepth   = 16
)

// CodeProtocolError is the error code of a call whose answer broke the
// protocol or its limits.
const CodeProtocolError = "guest_protocol_error"

// Violation describes what a guest did wrong. Its text names only the
// guest's behaviour, never anything of the host, so it may be shown to the
// sandbox's owner.
type Violation struct {
	Method  string // the call or guest-opened stream, or "session"
	Problem string
}

func (v Violation) String() string { return v.Method + ": " + v.Problem }

// SetViolationHandler makes c call f (on any goroutine) for each protocol
// violation it sees. Set it before the client is shared.
func (c *Client) SetViolationHandler(f func(Violation)) { c.onViolation.Store(&f) }

// violation reports a violation and returns the error callers get.
func (c *Client) violation(method, format string, args ...any) error {
	v := Violation{Method: method, Problem: fmt.Sprintf(format, args...)}
	if f := c.onViolation.Load(); f != nil {
		(*f)(v)
	}
	return protocolError()
}

func protocolError() error {
	return errdefs.New(errdefs.ErrUnavailable, CodeProtocolError,
		"the sandbox's agent sent an answer that breaks the protocol").
		WithHint("the sandbox may be compromised; stop it if this repeats")
}

// readLimit bounds one JSON frame of a call's answer: its size, and the
// elements of its list field (listKey; "" for none).
type readLimit struct {
	bytes    int
	listKey  string
	maxItems int
	// eofOK: the stream may end cleanly instead; readJSON returns io.EOF.
	eofOK bool
}

var (
	ordinaryReply = readLimit{bytes: MaxReply}
	eventFrame    = readLimit{bytes: MaxEventFrame}
)

// readJSON reads one JSON frame of method's answer into v within lim. A
// frame that breaks the limits or does not decode is a violation; a lost
// stream is a transport error.
func (c *Client) readJSON(ctx context.Context, fc *agentproto.Conn, method string, lim readLimit, v any) error {
	kind, p, err := fc.ReadFrameMax(lim.bytes)
	switch {
	case ctx.Err() != nil:
		return ctx.Err()
	case errors.Is(err, agentproto.ErrFrameTooLarge):
		return c.violation(method, "reply frame over %d bytes", lim.bytes)
	case lim.eofOK && err == io.EOF:
		return io.EOF
	case errors.Is(err, agentproto.ErrUnknownKind):
		return c.violation(method, "unknown frame kind")
	case err != nil:
		return c.lost(ctx)
	case kind != agentproto.KindJSON:
		return c.violation(method, "data frame where a reply was due")
	}
	if err := checkShape(p, lim.listKey, lim.maxItems); err != nil {
		return c.violation(method, "%v", err)
	}
	if err := json.Unmarshal(p, v); err != nil {
		return c.violation(method, "reply does not decode")
	}
	return nil
}

// checkShape walks the JSON object p token by token, without building it,
// and refuses it if its listKey list has more than maxItems elements, if
// the lists nested anywhere in it have more than maxNestedItems in all, or
// if it nests deeper than maxJSONDepth. Keys match as encoding/json matches
// them, case-insensitively, and repeated keys count together.
func checkShape(p []byte, listKey string, maxItems int) error {
	dec := json.NewDecoder(bytes.NewReader(p))
	w := shapeWalker{dec: dec}
	t, err := dec.Token()
	if err != nil || t != json.Delim('{') {
		return errors.New("reply is not a JSON object")
	}
	items := 0
	for dec.More() {
		k, err := dec.Token()
		if err != nil {
			return errors.New("reply is not valid JSON")
		}
		key, _ := k.(string)
		if listKey == "" || !strings.EqualFold(key, listKey) {
			if err := w.skip(1); err != nil {
				return err
			}
			continue
		}
		t, err := dec.Token()
		if err != nil {
			return errors.New("reply is not valid JSON")
		}
		if t == nil {
			continue
		}
		if t != json.Delim('[') {
			return fmt.Errorf("%s is not a list", listKey)
		}
		for dec.More() {
			if items++; items > maxItems {
				return fmt.Errorf("%s has more than %d elements", listKey, maxItems)
			}
			if err := w.skip(2); err != nil {
				return err
			}
		}
		if _, err := dec.Token(); err != nil {
			return errors.New("reply is not valid JSON")
		}
	}
	if _, err := dec.Token(); err != nil {
		return errors.New("reply is not valid JSON")
	}
	if _, err := dec.Token(); err != io.EOF {
		return errors.New("data after the reply")
	}
	return nil
}

type shapeWalker struct {
	dec    *json.Decoder
	nested int
}

// skip reads one value at depth, counting the elements of its lists.
func (w *shapeWalker) skip(depth int) error {
	if depth > maxJSONDepth {
		return fmt.Errorf("reply nests deeper than %d", maxJSONDepth)
	}
	t, err := w.dec.Token()
	if err != nil {
		return errors.New("reply is not valid JSON")
	}
	d, ok := t.(json.Delim)
	if !ok {
		return nil
	}
	for w.dec.More() {
		if d == '{' {
			if _, err := w.dec.Token(); err != nil {
				return errors.New("reply is not valid JSON")
			}
		} else if w.nested++; w.nested > maxNestedItems {
			return fmt.Errorf("reply's nested lists have more than %d elements", maxNestedItems)
		}
		if err := w.skip(depth + 1); err != nil {
			return err
		}
	}
	if _, err := w.dec.Token(); err != nil {
		return errors.New("reply is not valid JSON")
	}
	return nil
}
