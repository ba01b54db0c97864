package integration

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/coder/websocket"

	"github.com/emberbox/emberbox/internal/guest"
)

// httpGuest is a guest.Handle over a running server's Runtime API: the
// process routes and the tunnel WebSocket. It lets a test drive
// in-process code that needs a guest (the interpreter's E2B handler)
// against a real VM. Only the methods the interpreter calls exist.
type httpGuest struct {
	guest.Handle
	base, key, id string
	hc            *http.Client
}

type httpProcess struct {
	ID        string     `json:"id"`
	Argv      []string   `json:"argv"`
	ExitCode  *int       `json:"exitCode"`
	StartedAt *time.Time `json:"startedAt"`
	EndedAt   *time.Time `json:"endedAt"`
}

func (p httpProcess) info() *guest.ProcessInfo {
	info := &guest.ProcessInfo{ID: p.ID, Argv: p.Argv, ExitCode: p.ExitCode, EndedAt: p.EndedAt}
	if p.StartedAt != nil {
		info.StartedAt = *p.StartedAt
	}
	return info
}

func (g *httpGuest) do(ctx context.Context, method, path string, body, out any) error {
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, g.base+"/v1/sandboxes/"+g.id+path, rd)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+g.key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := g.hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s %s: HTTP %d %s", method, path, resp.StatusCode, data)
	}
	if out == nil {
		return nil
	}
	return json.Unmarshal(data, out)
}

func (g *httpGuest) Spawn(ctx context.Context, req guest.ExecRequest) (*guest.ProcessInfo, error) {
	var p httpProcess
	err := g.do(ctx, "POST", "/processes", map[string]any{"argv": req.Argv, "cwd": req.Cwd, "env": req.Env,
		"stdin": string(req.Stdin)}, &p)
	if err != nil {
		return nil, err
	}
	return p.info(), nil
}

func (g *httpGuest) Process(ctx context.Context, id string) (*guest.ProcessInfo, error) {
	var p httpProcess
	if err := g.do(ctx, "GET", "/processes/"+id, nil, &p); err != nil {
		return nil, err
	}
	return p.info(), nil
}

func (g *httpGuest) Processes(ctx context.Context) ([]guest.ProcessInfo, error) {
	var list struct {
		Data []httpProcess `json:"data"`
	}
	if err := g.do(ctx, "GET", "/processes", nil, &list); err != nil {
		return nil, err
	}
	out := make([]guest.ProcessInfo, 0, len(list.Data))
	for _, p := range list.Data {
		out = append(out, *p.info())
	}
	return out, nil
}

func (g *httpGuest) Signal(ctx context.Context, id, signal string) (*guest.ProcessInfo, error) {
	var p httpProcess
	if err := g.do(ctx, "POST", "/processes/"+id+":signal", map[string]string{"signal": signal}, &p); err != nil {
		return nil, err
	}
	return p.info(), nil
}

func (g *httpGuest) ProcessOutput(ctx context.Context, req guest.ProcessRequest, onEvent func(guest.Event) error) error {
	path := fmt.Sprintf("%s/v1/sandboxes/%s/processes/%s/output?cursor=%d&waitMs=%d", g.base, g.id, req.ID, req.Cursor, req.WaitMs)
	hr, err := http.NewRequestWithContext(ctx, "GET", path, nil)
	if err != nil {
		return err
	}
	hr.Header.Set("Authorization", "Bearer "+g.key)
	resp, err := g.hc.Do(hr)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		data, _ := io.ReadAll(resp.Body)
		return fmt.Errorf("process output: HTTP %d %s", resp.StatusCode, data)
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 4<<20)
	for sc.Scan() {
		var ev struct {
			Type   string  `json:"type"`
			Data   *string `json:"data"`
			Base64 string  `json:"base64"`
			Offset *int64  `json:"offset"`
		}
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			return err
		}
		out := guest.Event{Type: ev.Type}
		if ev.Data != nil {
			out.Data = []byte(*ev.Data)
		} else if ev.Base64 != "" {
			out.Data, _ = base64.StdEncoding.DecodeString(ev.Base64)
		}
		if ev.Offset != nil {
			out.Offset = *ev.Offset
		}
		if err := onEvent(out); err != nil {
			return err
		}
	}
	return sc.Err()
}

// DialPort opens one connection to a guest port through the tunnel
// WebSocket (api/tunnel.go describes its frames).
func (g *httpGuest) DialPort(ctx context.Context, port int) (net.Conn, error) {
	url := "ws" + strings.TrimPrefix(g.base, "http") + "/v1/sandboxes/" + g.id + "/tunnel"
	ws, _, err := websocket.Dial(ctx, url, &websocket.DialOptions{HTTPHeader: http.Header{"Authorization": {"Bearer " + g.key}}})
	if err != nil {
		return nil, err
	}
	ws.SetReadLimit(4 << 20)
	if typ, msg, err := ws.Read(ctx); err != nil || typ != websocket.MessageText || !strings.Contains(string(msg), "ready") {
		ws.CloseNow()
		return nil, fmt.Errorf("tunnel: no ready (%v %q)", err, msg)
	}
	if err := ws.Write(ctx, websocket.MessageBinary, tunnelFrame('o', []byte(fmt.Sprintf("tcp %d", port)))); err != nil {
		ws.CloseNow()
		return nil, err
	}
	_, msg, err := ws.Read(ctx)
	if err != nil || len(msg) < 5 || msg[0] != 'o' || len(msg) != 5 {
		ws.CloseNow()
		return nil, fmt.Errorf("tunnel: open refused (%v %q)", err, msg)
	}
	pr, pw := io.Pipe()
	c := &tunnelConn{ws: ws, r: pr}
	go func() {
		for {
			_, msg, err := ws.Read(context.Background())
			if err != nil || len(msg) < 5 {
				pw.CloseWithError(io.EOF)
				return
			}
			switch msg[0] {
			case 'd':
				if _, err := pw.Write(msg[5:]); err != nil {
					return
				}
			case 'e', 'c':
				pw.CloseWithError(io.EOF)
				return
			}
		}
	}()
	return c, nil
}

func tunnelFrame(kind byte, payload []byte) []byte {
	b := make([]byte, 5, 5+len(payload))
	b[0] = kind
	binary.BigEndian.PutUint32(b[1:], 1)
	return append(b, payload...)
}

// tunnelConn is stream 1 of a tunnel as a net.Conn (no deadlines).
type tunnelConn struct {
	ws   *websocket.Conn
	r    *io.PipeReader
	wmu  sync.Mutex
	once sync.Once
}

func (c *tunnelConn) Read(p []byte) (int, error) { return c.r.Read(p) }

func (c *tunnelConn) Write(p []byte) (int, error) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	n := 0
	for len(p) > 0 {
		chunk := p[:min(len(p), 64<<10)]
		if err := c.ws.Write(context.Background(), websocket.MessageBinary, tunnelFrame('d', chunk)); err != nil {
			return n, err
		}
		n += len(chunk)
		p = p[len(chunk):]
	}
	return n, nil
}

func (c *tunnelConn) Close() error {
	c.once.Do(func() {
		_ = c.ws.Write(context.Background(), websocket.MessageBinary, tunnelFrame('c', nil))
		c.ws.Close(websocket.StatusNormalClosure, "")
		c.r.CloseWithError(net.ErrClosed)
	})
	return nil
}

func (c *tunnelConn) LocalAddr() net.Addr              { return &net.TCPAddr{} }
func (c *tunnelConn) RemoteAddr() net.Addr             { return &net.TCPAddr{} }
func (c *tunnelConn) SetDeadline(time.Time) error      { return nil }
func (c *tunnelConn) SetReadDeadline(time.Time) error  { return nil }
func (c *tunnelConn) SetWriteDeadline(time.Time) error { return nil }
