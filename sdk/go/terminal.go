package emberbox

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"

	"github.com/coder/websocket"
)

// TerminalOptions shape a terminal.
type TerminalOptions struct {
	Cols, Rows int    // the window; 0: 80x24
	Command    string // default bash -l
	Cwd        string // default /workspace
	User       string // "sandbox" (default) or "root"
	// ProcessID attaches to a terminal that is still running; its earlier
	// output is replayed.
	ProcessID string
}

// Terminal is a process on a terminal in a sandbox, carried by a
// WebSocket: Read gives its output, Write types into it. The process
// outlives the connection; attach again with its ProcessID.
type Terminal struct {
	conn      *websocket.Conn
	processID string
	ctx       context.Context
	cancel    context.CancelFunc

	readMu  sync.Mutex
	pending []byte // the unread rest of an output frame

	mu       sync.Mutex
	exited   bool
	exitCode *int
	err      error
}

// terminalFrame is a text frame of the terminal protocol.
type terminalFrame struct {
	Type      string        `json:"type"`
	ProcessID string        `json:"processId,omitempty"`
	ExitCode  *int          `json:"exitCode,omitempty"`
	Cols      int           `json:"cols,omitempty"`
	Rows      int           `json:"rows,omitempty"`
	Error     *errorPayload `json:"error,omitempty"`
}

// maxTerminalFrame bounds one message from the server.
const maxTerminalFrame = 4 << 20

// Terminal opens a terminal. Refusals (a sandbox not running, too many
// terminals) come back as an *APIError before anything is started.
// ctx bounds the dial only; Close ends the terminal's connection.
func (c *Client) Terminal(ctx context.Context, id string, o TerminalOptions) (*Terminal, error) {
	if id == "" {
		return nil, errors.New("emberbox: no sandbox id")
	}
	q := url.Values{}
	if o.Cols > 0 {
		q.Set("cols", strconv.Itoa(o.Cols))
	}
	if o.Rows > 0 {
		q.Set("rows", strconv.Itoa(o.Rows))
	}
	for k, v := range map[string]string{"command": o.Command, "cwd": o.Cwd, "user": o.User, "processId": o.ProcessID} {
		if v != "" {
			q.Set(k, v)
		}
	}
	u := "ws" + strings.TrimPrefix(c.baseURL, "http") + sandboxPath(id, "/terminal")
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	hdr := http.Header{"Authorization": {"Bearer " + c.key}, "User-Agent": {c.UserAgent}}
	for attempt := 1; ; attempt++ {
		conn, resp, err := websocket.Dial(ctx, u, &websocket.DialOptions{HTTPClient: c.HTTPClient, HTTPHeader: hdr,
			CompressionMode: websocket.CompressionDisabled})
		if err == nil {
			return newTerminal(conn)
		}
		if resp == nil || resp.StatusCode == http.StatusSwitchingProtocols {
			return nil, fmt.Errorf("emberbox: opening a terminal: %w", err)
		}
		var body []byte
		if resp.Body != nil {
			body, _ = io.ReadAll(resp.Body)
		}
		apiErr := errorFromResponse(resp.StatusCode, resp.Header, body)
		if attempt > c.MaxRetries || !apiErr.retryable() {
			return nil, apiErr
		}
		if err := c.wait(ctx, attempt, apiErr.RetryAfter); err != nil {
			return nil, err
		}
	}
}

// newTerminal reads the "ready" frame that names the process.
func newTerminal(conn *websocket.Conn) (*Terminal, error) {
	conn.SetReadLimit(maxTerminalFrame)
	ctx, cancel := context.WithCancel(context.Background())
	t := &Terminal{conn: conn, ctx: ctx, cancel: cancel}
	typ, data, err := conn.Read(ctx)
	if err != nil {
		t.Close()
		return nil, fmt.Errorf("emberbox: the terminal did not start: %w", err)
	}
	var f terminalFrame
	if typ != websocket.MessageText || json.Unmarshal(data, &f) != nil || f.Type != "ready" {
		t.Close()
		return nil, fmt.Errorf("emberbox: the terminal began with %.100q, not ready", data)
	}
	t.processID = f.ProcessID
	return t, nil
}

// ProcessID names the terminal's process, for attaching again.
func (t *Terminal) ProcessID() string { return t.processID }

// Read reads the terminal's output. It returns io.EOF once the process
// has exited (see ExitCode), and the connection's error if it broke.
func (t *Terminal) Read(p []byte) (int, error) {
	t.readMu.Lock()
	defer t.readMu.Unlock()
	for len(t.pending) == 0 {
		if err := t.readFrame(); err != nil {
			return 0, err
		}
	}
	n := copy(p, t.pending)
	t.pending = t.pending[n:]
	return n, nil
}

// readFrame reads one message: output, or a text frame (exit, error).
func (t *Terminal) readFrame() error {
	t.mu.Lock()
	exited, err := t.exited, t.err
	t.mu.Unlock()
	if exited {
		return io.EOF
	}
	if err != nil {
		return err
	}
	typ, data, err := t.conn.Read(t.ctx)
	if err != nil {
		return t.fail(fmt.Errorf("emberbox: the terminal's connection: %w", err))
	}
	if typ == websocket.MessageBinary {
		t.pending = data
		return nil
	}
	var f terminalFrame
	if json.Unmarshal(data, &f) != nil {
		return nil // nothing else is sent as text; skip what is not understood
	}
	switch f.Type {
	case "exit":
		t.mu.Lock()
		t.exited, t.exitCode = true, f.ExitCode
		t.mu.Unlock()
		return io.EOF
	case "error":
		p := f.Error
		if p == nil {
			p = &errorPayload{Code: "terminal_error"}
		}
		return t.fail(p.toError(http.StatusBadGateway, ""))
	}
	return nil
}

func (t *Terminal) fail(err error) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.err == nil {
		t.err = err
	}
	return t.err
}

// Write types p into the terminal.
func (t *Terminal) Write(p []byte) (int, error) {
	if err := t.conn.Write(t.ctx, websocket.MessageBinary, bytes.Clone(p)); err != nil {
		return 0, fmt.Errorf("emberbox: typing into the terminal: %w", err)
	}
	return len(p), nil
}

// Resize sets the terminal's window size.
func (t *Terminal) Resize(ctx context.Context, cols, rows int) error {
	b, err := json.Marshal(terminalFrame{Type: "resize", Cols: cols, Rows: rows})
	if err != nil {
		return err
	}
	if err := t.conn.Write(ctx, websocket.MessageText, b); err != nil {
		return fmt.Errorf("emberbox: resizing the terminal: %w", err)
	}
	return nil
}

// ExitCode reports whether the process has exited and, if so, its exit
// status (nil when a signal ended it).
func (t *Terminal) ExitCode() (code *int, exited bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.exitCode, t.exited
}

// Close closes the connection; the process keeps running unless it has
// exited.
func (t *Terminal) Close() error {
	defer t.cancel()
	err := t.conn.Close(websocket.StatusNormalClosure, "")
	var ce websocket.CloseError
	if err == nil || errors.As(err, &ce) || t.ctx.Err() != nil {
		return nil
	}
	if _, exited := t.ExitCode(); exited {
		return nil // the server closed it first
	}
	return fmt.Errorf("emberbox: closing the terminal: %w", err)
}
