package interpreter

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"

	"github.com/emberbox/emberbox/internal/sandbox"
)

// fakeGuest starts fake bridges: Spawn records the request, ProcessOutput
// prints the port line, DialPort connects to a Go bridge speaking the
// bridge's protocol with scripted behaviour (see fakeBridge.execute).
type fakeGuest struct {
	sandbox.Guest // methods the interpreter never calls panic

	t       *testing.T
	mu      sync.Mutex
	spawned []sandbox.ExecRequest
	tokens  []string
	conns   []net.Conn // the bridge ends, to cut them
	killed  []string
}

func (g *fakeGuest) Spawn(_ context.Context, req sandbox.ExecRequest) (*sandbox.ProcessInfo, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.spawned = append(g.spawned, req)
	g.tokens = append(g.tokens, strings.TrimSpace(string(req.Stdin)))
	return &sandbox.ProcessInfo{ID: fmt.Sprintf("p%d", len(g.spawned))}, nil
}

func (g *fakeGuest) ProcessOutput(_ context.Context, req sandbox.ProcessRequest, onEvent func(sandbox.Event) error) error {
	line := `{"port": 40001, "cwd": "/workspace"}` + "\n"
	if req.Cursor >= int64(len(line)) {
		return nil
	}
	return onEvent(sandbox.Event{Type: sandbox.EventStdout, Data: []byte(line), Offset: 0})
}

func (g *fakeGuest) Signal(_ context.Context, id, _ string) (*sandbox.ProcessInfo, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.killed = append(g.killed, id)
	return &sandbox.ProcessInfo{ID: id}, nil
}

func (g *fakeGuest) DialPort(_ context.Context, port int) (net.Conn, error) {
	if port != 40001 {
		g.t.Errorf("DialPort(%d), want the port the bridge printed", port)
	}
	host, bridgeEnd := net.Pipe()
	g.mu.Lock()
	token := g.tokens[len(g.tokens)-1]
	g.conns = append(g.conns, bridgeEnd)
	g.mu.Unlock()
	go (&fakeBridge{conn: bridgeEnd, token: token}).serve()
	return host, nil
}

// cut ends every bridge connection, as a stopped sandbox does.
func (g *fakeGuest) cut() {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, c := range g.conns {
		c.Close()
	}
}

type fakeBridge struct {
	conn      net.Conn
	token     string
	wmu       sync.Mutex
	count     int
	vars      map[string]string
	interrupt chan struct{}
}

func (b *fakeBridge) send(v any) {
	line, _ := json.Marshal(v)
	b.wmu.Lock()
	defer b.wmu.Unlock()
	_, _ = b.conn.Write(append(line, '\n'))
}

func (b *fakeBridge) serve() {
	defer b.conn.Close()
	r := bufio.NewReaderSize(b.conn, 1<<20)
	first, err := r.ReadString('\n')
	if err != nil || strings.TrimSpace(first) != b.token {
		return
	}
	b.vars = map[string]string{}
	b.interrupt = make(chan struct{}, 1)
	jobs := make(chan map[string]any, 8)
	go func() {
		b.send(map[string]any{"ev": "ready"})
		for req := range jobs {
			switch req["op"] {
			case "execute":
				b.execute(req["code"].(string))
			case "restart":
				b.vars = map[string]string{}
				b.count = 0
				b.send(map[string]any{"ev": "restarted"})
			}
		}
	}()
	defer close(jobs)
	for {
		line, err := r.ReadBytes('\n')
		if err != nil {
			return
		}
		var req map[string]any
		if json.Unmarshal(line, &req) != nil {
			continue
		}
		switch req["op"] {
		case "interrupt":
			select {
			case b.interrupt <- struct{}{}:
			default:
			}
		case "shutdown":
			return
		default:
			jobs <- req
		}
	}
}

// execute plays a cell: "set k v", "get k", "print s", "raise", "plot",
// "sleep" (until interrupted), "stubborn" (ignores interrupts), "huge"
// (a line over MaxEventLine), "flood" (output past MaxOutput).
func (b *fakeBridge) execute(code string) {
	b.count++
	b.send(map[string]any{"ev": "count", "n": b.count})
	verb, arg, _ := strings.Cut(code, " ")
	status := "ok"
	switch verb {
	case "set":
		k, v, _ := strings.Cut(arg, " ")
		b.vars[k] = v
	case "get":
		v, ok := b.vars[arg]
		if !ok {
			b.send(map[string]any{"ev": "error", "name": "NameError", "value": fmt.Sprintf("name '%s' is not defined", arg), "traceback": "tb"})
			status = "error"
			break
		}
		b.send(map[string]any{"ev": "result", "main": true, "data": map[string]any{"text/plain": "'" + v + "'"}})
	case "print":
		b.send(map[string]any{"ev": "stdout", "text": arg + "\n"})
		b.send(map[string]any{"ev": "stderr", "text": "warn\n"})
	case "raise":
		b.send(map[string]any{"ev": "error", "name": "ValueError", "value": "bad", "traceback": "Traceback...\nValueError: bad"})
		status = "error"
	case "plot":
		b.send(map[string]any{"ev": "result", "main": false, "data": map[string]any{
			"text/plain": "<Figure>", "image/png": "iVBORw0KGgo=", "application/vnd.custom": map[string]int{"a": 1}}})
		b.send(map[string]any{"ev": "result", "main": true, "data": map[string]any{
			"text/plain": "df", "text/html": "<table></table>", "application/json": map[string]int{"x": 1}}})
	case "sleep":
		<-b.interrupt
		b.send(map[string]any{"ev": "error", "name": "KeyboardInterrupt", "value": "", "traceback": ""})
		status = "error"
	case "stubborn":
		select {} // never ends: the host must give the context up
	case "huge":
		b.send(map[string]any{"ev": "stdout", "text": strings.Repeat("x", MaxEventLine)})
	case "flood":
		chunk := strings.Repeat("y", 1<<20)
		for range MaxOutput/len(chunk) + 2 {
			b.send(map[string]any{"ev": "stdout", "text": chunk})
		}
	}
	b.send(map[string]any{"ev": "end", "status": status})
}
