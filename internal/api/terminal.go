package api

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/coder/websocket"

	"github.com/emberbox/emberbox/internal/errdefs"
	"github.com/emberbox/emberbox/internal/guest"
)

// Terminal limits.
const (
	defaultTerminalCommand = "bash -l"
	maxTerminalCommand     = 16 << 10
	// maxTerminalMessage bounds one WebSocket message from the client;
	// input goes to the guest in pieces of terminalInputPiece.
	maxTerminalMessage = 1 << 20
	terminalInputPiece = 64 << 10
	// terminalsPerSandbox bounds the open terminal sockets of a sandbox.
	terminalsPerSandbox = 12
	// inputFullWait is how long typing waits for a terminal whose input
	// buffer is full before it tries again.
	inputFullWait = 50 * time.Millisecond
)

// terminalSlots counts the open terminal sockets per sandbox.
type terminalSlots struct {
	mu   sync.Mutex
	open map[string]int
}

func (t *terminalSlots) acquire(id string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.open == nil {
		t.open = map[string]int{}
	}
	if t.open[id] >= terminalsPerSandbox {
		return false
	}
	t.open[id]++
	return true
}

func (t *terminalSlots) release(id string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.open[id]--; t.open[id] <= 0 {
		delete(t.open, id)
	}
}

// terminalQuery is what GET …/terminal asks for.
type terminalQuery struct {
	size      guest.PtySize
	req       guest.ExecRequest
	processID string
}

func parseTerminalQuery(r *http.Request) (*terminalQuery, error) {
	q := r.URL.Query()
	tq := &terminalQuery{size: guest.PtySize{Cols: 80, Rows: 24}, processID: q.Get("processId")}
	var issues []issue
	for _, f := range []struct {
		name string
		dst  *int
	}{{"cols", &tq.size.Cols}, {"rows", &tq.size.Rows}} {
		if v := q.Get(f.name); v != "" {
			n, err := strconv.Atoi(v)
			if err != nil || n < 1 || n > guest.MaxPtySide {
				issues = append(issues, issue{Path: f.name, Message: fmt.Sprintf("must be from 1 to %d", guest.MaxPtySide)})
			}
			*f.dst = n
		}
	}
	command := q.Get("command")
	if strings.TrimSpace(command) == "" {
		command = defaultTerminalCommand
	}
	if len(command) > maxTerminalCommand {
		issues = append(issues, issue{Path: "command", Message: fmt.Sprintf("must be at most %d bytes", maxTerminalCommand)})
	}
	issues = append(issues, commandFields(&command, nil, q.Get("cwd"), nil, nil, nil, nil, q.Get("user"), &tq.req)...)
	if len(tq.processID) > 256 {
		issues = append(issues, issue{Path: "processId", Message: "is not a process id"})
	}
	if len(issues) > 0 {
		return nil, invalid(sortIssues(issues))
	}
	tq.req.Detach = true
	tq.req.Pty = &tq.size
	return tq, nil
}

// terminal serves GET …/terminal: a process on a terminal, carried by a
// WebSocket. Everything that can be refused (the query, the sandbox's
// state, a processId that is not a terminal) is refused before the
// upgrade, as an ordinary error. The process outlives the socket, so a
// client can attach again with its processId; its earlier output is
// replayed from the output the guest keeps.
func (s sockets) terminal(w http.ResponseWriter, r *http.Request, c *call) error {
	tq, err := parseTerminalQuery(r)
	if err != nil {
		return err
	}
	sb, g, err := s.guest(r, c)
	if err != nil {
		return err
	}
	if !strings.EqualFold(r.Header.Get("Upgrade"), "websocket") {
		return newError(http.StatusUpgradeRequired, "upgrade_required", "The terminal is a WebSocket.").
			withHint("Connect with a WebSocket client (Upgrade: websocket), such as withruntime's sandbox.terminal().")
	}
	if !s.terminals.acquire(sb.ID) {
		return newError(http.StatusTooManyRequests, "too_many_terminals",
			fmt.Sprintf("The sandbox has %d terminals open.", terminalsPerSandbox)).
			withHint("Close a terminal first.")
	}
	defer s.terminals.release(sb.ID)

	ctx := r.Context()
	var p *guest.ProcessInfo
	spawned := false
	if tq.processID != "" {
		if p, err = g.Process(ctx, tq.processID); err != nil {
			return err
		}
		if p.Pty == nil {
			return newError(http.StatusConflict, "not_a_terminal", "Process "+p.ID+" does not run on a terminal.").
				withHint("Attach by processId only to a process a terminal, or a spawn with pty, started.")
		}
	} else {
		if p, err = g.Spawn(ctx, tq.req); err != nil {
			return err
		}
		spawned = true
	}

	// Streams run for as long as the terminal is open.
	rc := http.NewResponseController(w)
	_ = rc.SetReadDeadline(time.Time{})
	_ = rc.SetWriteDeadline(time.Time{})
	conn, err := websocket.Accept(w, r, &websocket.AcceptOptions{CompressionMode: websocket.CompressionDisabled, Subprotocols: webSocketAccept})
	if err != nil {
		// Accept answered the client; a terminal nobody can reach ends.
		if spawned {
			_, _ = g.Signal(context.WithoutCancel(ctx), p.ID, "SIGKILL")
		}
		s.log.LogAttrs(ctx, slog.LevelWarn, "terminal upgrade failed",
			slog.String("request_id", requestID(ctx)), slog.Any("err", err))
		return nil
	}
	conn.SetReadLimit(maxTerminalMessage)
	s.runTerminal(ctx, conn, g, p)
	return nil
}

// terminalEvent is a text frame of the terminal protocol.
type terminalEvent struct {
	Type      string     `json:"type"`
	ProcessID string     `json:"processId,omitempty"`
	ExitCode  *int       `json:"exitCode,omitempty"`
	Cols      int        `json:"cols,omitempty"`
	Rows      int        `json:"rows,omitempty"`
	Error     *errorJSON `json:"error,omitempty"`
}

// runTerminal carries one attached terminal until the process ends (exit
// frame, normal closure) or the client goes (the process keeps running).
func (s sockets) runTerminal(ctx context.Context, conn *websocket.Conn, g guest.Handle, p *guest.ProcessInfo) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer conn.CloseNow()
	sendJSON := terminalSender(ctx, conn)
	if err := sendJSON(terminalEvent{Type: "ready", ProcessID: p.ID}); err != nil {
		return
	}

	outputDone := make(chan struct{})
	go func() {
		defer close(outputDone)
		defer cancel()
		terminalOutput(ctx, conn, g, p.ID, sendJSON)
	}()
	terminalInput(ctx, conn, g, p.ID)
	cancel()
	<-outputDone
}

// terminalSender returns what sends a JSON frame on conn, keeping
// "exitCode": null on an exit frame, which omitempty would drop.
func terminalSender(ctx context.Context, conn *websocket.Conn) func(ev terminalEvent) error {
	return func(ev terminalEvent) error {
		b, err := json.Marshal(ev)
		if err != nil {
			return err
		}
		if ev.Type == "exit" && ev.ExitCode == nil {
			b = append(b[:len(b)-1], []byte(`,"exitCode":null}`)...)
		}
		return conn.Write(ctx, websocket.MessageText, b)
	}
}

// terminalOutput sends the process's output to conn as binary frames
// until it exits (an exit frame and a normal closure) or its output is
// lost (an error frame); a ctx ended first (the client went) sends nothing.
func terminalOutput(ctx context.Context, conn *websocket.Conn, g guest.Handle, id string, sendJSON func(terminalEvent) error) {
	exited := false
	err := g.ProcessOutput(ctx, guest.ProcessRequest{ID: id, Follow: true}, func(ev guest.Event) error {
		switch ev.Type {
		case guest.EventStdout, guest.EventStderr:
			return conn.Write(ctx, websocket.MessageBinary, ev.Data)
		case "exit":
			exited = true
			var code *int
			if ev.Exit != nil {
				code = ev.Exit.ExitCode
			}
			return sendJSON(terminalEvent{Type: "exit", ExitCode: code})
		}
		return nil // "truncated": what left the guest's buffer is not replayed
	})
	switch {
	case exited:
		_ = conn.Close(websocket.StatusNormalClosure, "exited")
	case ctx.Err() == nil:
		ae := toAPIError(err)
		_ = sendJSON(terminalEvent{Type: "error", Error: &errorJSON{Code: ae.Code, Status: ae.Status, Message: ae.Message}})
		_ = conn.Close(websocket.StatusInternalError, "lost the terminal's output")
	}
}

// terminalInput types the client's binary frames into the process and
// applies its resize frames, until the client goes or the guest cannot
// be reached.
func terminalInput(ctx context.Context, conn *websocket.Conn, g guest.Handle, id string) {
	for {
		typ, data, err := conn.Read(ctx)
		if err != nil {
			return
		}
		switch typ {
		case websocket.MessageBinary:
			err = typeInto(ctx, g, id, data)
		case websocket.MessageText:
			var ev terminalEvent
			if json.Unmarshal(data, &ev) != nil || ev.Type != "resize" {
				continue // nothing else comes as text
			}
			if ev.Cols < 1 || ev.Rows < 1 || ev.Cols > guest.MaxPtySide || ev.Rows > guest.MaxPtySide {
				continue
			}
			_, err = g.Resize(ctx, id, guest.PtySize{Cols: ev.Cols, Rows: ev.Rows})
		}
		if err != nil && ctx.Err() == nil && !errdefs.IsConflict(err) {
			// The guest is unreachable; the output side says so.
			return
		}
	}
}

// typeInto appends data to the terminal's input in pieces, each taken
// whole by the guest, waiting while its input buffer is full.
func typeInto(ctx context.Context, g guest.Handle, id string, data []byte) error {
	for len(data) > 0 {
		piece := data[:min(len(data), terminalInputPiece)]
		_, err := g.Write(ctx, id, piece, nil, false)
		if errdefs.Code(err) == guest.CodeStdinFull {
			select {
			case <-time.After(inputFullWait):
				continue
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		if err != nil {
			return err
		}
		data = data[len(piece):]
	}
	return nil
}
