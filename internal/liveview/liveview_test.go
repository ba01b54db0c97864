package liveview

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
)

// echoVNC is a VNC server that sends its greeting, then echoes.
func echoVNC(t *testing.T) Dial {
	return func(ctx context.Context) (net.Conn, error) {
		a, b := net.Pipe()
		go func() {
			defer b.Close()
			_, _ = b.Write([]byte("RFB 003.008\n"))
			_, _ = io.Copy(b, b)
		}()
		return a, nil
	}
}

func TestPageAndClient(t *testing.T) {
	ts := httptest.NewServer(Handler(echoVNC(t), []string{"https://console.example"}))
	defer ts.Close()
	for _, c := range []struct{ path, ctype, body string }{
		{"/", "text/html", `src="view.js"`},
		{"/view.js", "javascript", "import RFB from './novnc/core/rfb.js'"},
		{"/novnc/core/rfb.js", "javascript", "export default class RFB"},
		{"/novnc/vendor/pako/lib/zlib/inflate.js", "javascript", ""},
	} {
		resp, err := http.Get(ts.URL + c.path)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || !strings.Contains(resp.Header.Get("Content-Type"), c.ctype) || !bytes.Contains(body, []byte(c.body)) {
			t.Errorf("GET %s: %d %q", c.path, resp.StatusCode, resp.Header.Get("Content-Type"))
		}
		csp := resp.Header.Get("Content-Security-Policy")
		if !strings.Contains(csp, "script-src 'self'") || !strings.Contains(csp, "frame-ancestors https://console.example") {
			t.Errorf("GET %s: CSP %q", c.path, csp)
		}
	}
	resp, err := http.Post(ts.URL+"/", "text/plain", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("POST /: %d", resp.StatusCode)
	}
}

func TestSocketBridgesTheVNCServer(t *testing.T) {
	ts := httptest.NewServer(Handler(echoVNC(t), nil))
	defer ts.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ws, _, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(ts.URL, "http")+SocketPath, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ws.CloseNow()
	conn := websocket.NetConn(ctx, ws, websocket.MessageBinary)
	greeting := make([]byte, 12)
	if _, err := io.ReadFull(conn, greeting); err != nil || string(greeting) != "RFB 003.008\n" {
		t.Fatalf("greeting %q, %v", greeting, err)
	}
	if _, err := conn.Write([]byte("ping")); err != nil {
		t.Fatal(err)
	}
	back := make([]byte, 4)
	if _, err := io.ReadFull(conn, back); err != nil || string(back) != "ping" {
		t.Fatalf("echo %q, %v", back, err)
	}
}

func TestSocketWithoutAServer(t *testing.T) {
	ts := httptest.NewServer(Handler(func(context.Context) (net.Conn, error) {
		return nil, errors.New("desktop_not_running")
	}, nil))
	defer ts.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, resp, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(ts.URL, "http")+SocketPath, nil)
	if err == nil || resp == nil || resp.StatusCode != http.StatusBadGateway {
		t.Fatalf("a view of no desktop: %v, %+v", err, resp)
	}
}
