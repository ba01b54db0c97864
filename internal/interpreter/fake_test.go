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
	"time"

	"github.com/emberbox/emberbox/internal/errdefs"
	"github.com/emberbox/emberbox/internal/guest"
)

// fakeGuest runs fake bridges: Spawn records a process, ProcessOutput
// prints its port line, DialPort connects to a Go bridge speaking the
// bridge's protocol with scripted cells (see fakeProc.execute). Its
// processes outlive their connections, as a paused and woken guest's do.
type fakeGuest struct {
	guest.Handle // methods the interpreter never calls panic

	t       *testing.T
	mu      sync.Mutex
	spawned []guest.ExecRequest
	procs   []*fakeProc
}

// handle returns g as a guest handle.
func (g *fakeGuest) handle() guest.Handle {
	return guest.Handle{ProcessRunner: g, FileSystem: g, Watcher: g, PortDialer: g}
}

type fakeProc struct {
	info  guest.ProcessInfo
	port  int
	token string

	mu        sync.Mutex
	alive     bool
	conn      net.Conn // the current host connection
	jobs      chan map[string]any
	interrupt chan struct{}
	count     int
	vars      map[string]string
}

func (g *fakeGuest) Spawn(_ context.Context, req guest.ExecRequest) (*guest.ProcessInfo, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.spawned = append(g.spawned, req)
	n := len(g.spawned)
	p := &fakeProc{
		info: guest.ProcessInfo{ID: fmt.Sprintf("p%d", n), Argv: req.Argv, StartedAt: time.Unix(int64(1000+n), 0).UTC(),
			State: "running"},
		port: 40000 + n, token: strings.TrimSpace(string(req.Stdin)), alive: true,
		jobs: make(chan map[string]any, 8), interrupt: make(chan struct{}, 1), vars: map[string]string{},
	}
	g.procs = append(g.procs, p)
	go p.work()
	info := p.info
	return &info, nil
}

func (g *fakeGuest) proc(match func(*fakeProc) bool) *fakeProc {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, p := range g.procs {
		if match(p) {
			return p
		}
	}
	return nil
}

func (g *fakeGuest) ProcessOutput(_ context.Context, req guest.ProcessRequest, onEvent func(guest.Event) error) error {
	p := g.proc(func(p *fakeProc) bool { return p.info.ID == req.ID })
	line := fmt.Sprintf(`{"port": %d, "cwd": "/workspace"}`+"\n", p.port)
	if req.Cursor >= int64(len(line)) {
		return nil
	}
	return onEvent(guest.Event{Type: guest.EventStdout, Data: []byte(line), Offset: 0})
}

func (g *fakeGuest) Process(_ context.Context, id string) (*guest.ProcessInfo, error) {
	p := g.proc(func(p *fakeProc) bool { return p.info.ID == id })
	if p == nil {
		return nil, errdefs.New(errdefs.ErrNotFound, "process_not_found", "no process %s", id)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	info := p.info
	if !p.alive {
		code := 137
		now := time.Now()
		info.ExitCode, info.EndedAt, info.State = &code, &now, "exited"
	}
	return &info, nil
}

func (g *fakeGuest) Processes(ctx context.Context) ([]guest.ProcessInfo, error) {
	g.mu.Lock()
	ids := make([]string, 0, len(g.procs))
	for _, p := range g.procs {
		ids = append(ids, p.info.ID)
	}
	g.mu.Unlock()
	var out []guest.ProcessInfo
	for _, id := range ids {
		info, _ := g.Process(ctx, id)
		out = append(out, *info)
	}
	return out, nil
}

func (g *fakeGuest) Signal(_ context.Context, id, _ string) (*guest.ProcessInfo, error) {
	if p := g.proc(func(p *fakeProc) bool { return p.info.ID == id }); p != nil {
		p.kill()
	}
	return g.Process(context.Background(), id)
}

func (g *fakeGuest) DialPort(_ context.Context, port int) (net.Conn, error) {
	p := g.proc(func(p *fakeProc) bool { return p.port == port })
	if p == nil || !p.isAlive() {
		return nil, errdefs.New(errdefs.ErrUnavailable, "port_refused", "nothing listens on %d", port)
	}
	host, bridgeEnd := net.Pipe()
	go p.serve(bridgeEnd)
	return host, nil
}

// alive counts the bridges running.
func (g *fakeGuest) alive() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	n := 0
	for _, p := range g.procs {
		if p.isAlive() {
			n++
		}
	}
	return n
}

// detach ends every connection and keeps the processes, as a pause and a
// wake do.
func (g *fakeGuest) detach() {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, p := range g.procs {
		p.mu.Lock()
		if p.conn != nil {
			p.conn.Close()
		}
		p.mu.Unlock()
	}
}

// stop ends every process, as a stopped sandbox does.
func (g *fakeGuest) stop() {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, p := range g.procs {
		p.kill()
	}
}

func (p *fakeProc) isAlive() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.alive
}

func (p *fakeProc) kill() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.alive = false
	if p.conn != nil {
		p.conn.Close()
	}
}

func (p *fakeProc) send(v any) {
	line, _ := json.Marshal(v)
	p.mu.Lock()
	c := p.conn
	p.mu.Unlock()
	if c != nil {
		_, _ = c.Write(append(line, '\n'))
	}
}

func (p *fakeProc) serve(c net.Conn) {
	defer c.Close()
	r := bufio.NewReaderSize(c, 1<<20)
	first, err := r.ReadString('\n')
	if err != nil || strings.TrimSpace(first) != p.token {
		return
	}
	p.mu.Lock()
	if old := p.conn; old != nil {
		old.Close()
	}
	p.conn = c
	p.mu.Unlock()
	p.send(map[string]any{"ev": "ready"})
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
			case p.interrupt <- struct{}{}:
			default:
			}
		case "shutdown":
			p.kill()
			return
		default:
			if req["op"] == "execute" {
				select { // one left from the cell before
				case <-p.interrupt:
				default:
				}
			}
			p.jobs <- req
		}
	}
}

func (p *fakeProc) work() {
	for req := range p.jobs {
		id := req["id"]
		switch req["op"] {
		case "execute":
			p.execute(id, req["code"].(string))
		case "restart":
			p.vars = map[string]string{}
			p.count = 0
			p.send(map[string]any{"ev": "restarted", "id": id})
		}
	}
}

// execute plays a cell: "set k v", "get k", "print s", "raise", "plot",
// "sleep" (until interrupted), "abort" (ends aborted, with no traceback,
// when interrupted), "stubborn" (ignores interrupts), "huge"
// (a line over MaxEventLine), "flood" (output past MaxOutput).
func (p *fakeProc) execute(id any, code string) {
	ev := func(m map[string]any) { m["id"] = id; p.send(m) }
	p.count++
	ev(map[string]any{"ev": "count", "n": p.count})
	verb, arg, _ := strings.Cut(code, " ")
	status := "ok"
	switch verb {
	case "set":
		k, v, _ := strings.Cut(arg, " ")
		p.vars[k] = v
	case "get":
		v, ok := p.vars[arg]
		if !ok {
			ev(map[string]any{"ev": "error", "name": "NameError", "value": fmt.Sprintf("name '%s' is not defined", arg), "traceback": "tb"})
			status = "error"
			break
		}
		ev(map[string]any{"ev": "result", "main": true, "data": map[string]any{"text/plain": "'" + v + "'"}})
	case "print":
		ev(map[string]any{"ev": "stdout", "text": arg + "\n"})
		ev(map[string]any{"ev": "stderr", "text": "warn\n"})
	case "raise":
		ev(map[string]any{"ev": "error", "name": "ValueError", "value": "bad", "traceback": "Traceback...\nValueError: bad"})
		status = "error"
	case "plot":
		ev(map[string]any{"ev": "result", "main": false, "data": map[string]any{
			"text/plain": "<Figure>", "image/png": "iVBORw0KGgo=", "application/vnd.custom": map[string]int{"a": 1}}})
		ev(map[string]any{"ev": "result", "main": true, "data": map[string]any{
			"text/plain": "df", "text/html": "<table></table>", "application/json": map[string]int{"x": 1}}})
	case "sleep":
		<-p.interrupt
		ev(map[string]any{"ev": "error", "name": "KeyboardInterrupt", "value": "", "traceback": ""})
		status = "error"
	case "abort": // an interrupt that lands before the kernel runs the cell
		<-p.interrupt
		status = "aborted"
	case "stubborn":
		for p.isAlive() {
			time.Sleep(5 * time.Millisecond)
		}
		return
	case "huge":
		ev(map[string]any{"ev": "stdout", "text": strings.Repeat("x", MaxEventLine)})
	case "flood":
		chunk := strings.Repeat("y", 1<<20)
		for range MaxOutput/len(chunk) + 2 {
			ev(map[string]any{"ev": "stdout", "text": chunk})
		}
	}
	ev(map[string]any{"ev": "end", "status": status})
}
