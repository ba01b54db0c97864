package api

import (
	"context"
	"encoding/base64"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/emberbox/emberbox/internal/sandbox"
)

// TestWebSocketKeySubprotocol: a browser offers the key as a subprotocol;
// the server selects emberbox.v1 and never echoes the key.
func TestWebSocketKeySubprotocol(t *testing.T) {
	e := newEnv(t)
	e.m.add("key_a", "sbx_r", sandbox.StateRunning, time.Hour)
	srv := httptest.NewServer(e.s)
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	url := strings.Replace(srv.URL, "http", "ws", 1) + "/v1/sandboxes/sbx_r/terminal"
	offer := func(key string) []string {
		return []string{wsProtocol, wsKeyPrefix + base64.RawURLEncoding.EncodeToString([]byte(key))}
	}

	c, resp, err := websocket.Dial(ctx, url, &websocket.DialOptions{Subprotocols: offer("secret-a")})
	if err != nil {
		t.Fatalf("dial with the key as a subprotocol: %v", err)
	}
	defer c.CloseNow()
	if got := resp.Header.Values("Sec-WebSocket-Protocol"); len(got) != 1 || got[0] != wsProtocol {
		t.Fatalf("selected subprotocol %q, want %q alone", got, wsProtocol)
	}
	if c.Subprotocol() != wsProtocol {
		t.Fatalf("subprotocol %q", c.Subprotocol())
	}
	if ready := readJSONFrame(t, ctx, c); ready["type"] != "ready" {
		t.Fatalf("first frame: %v", ready)
	}

	// A wrong key, a key that is not base64url, and no key are refused
	// before the upgrade, in the error shape.
	for _, protos := range [][]string{offer("wrong"), {wsProtocol, wsKeyPrefix + "not base64!"}, {wsProtocol}} {
		_, resp, err := websocket.Dial(ctx, url, &websocket.DialOptions{Subprotocols: protos})
		if err == nil || resp == nil || resp.StatusCode != http.StatusUnauthorized {
			t.Fatalf("offer %q: %v %v, want 401", protos, resp, err)
		}
	}
}

// TestWebSocketKeyOnlyOnUpgrades: the subprotocol authorizes nothing but
// a WebSocket handshake.
func TestWebSocketKeyOnlyOnUpgrades(t *testing.T) {
	e := newEnv(t)
	e.m.add("key_a", "sbx_r", sandbox.StateRunning, time.Hour)
	proto := wsKeyPrefix + base64.RawURLEncoding.EncodeToString([]byte("secret-a"))
	for _, method := range []string{"GET", "POST"} {
		r := httptest.NewRequest(method, "/v1/sandboxes", strings.NewReader("{}"))
		r.Header.Set("Sec-WebSocket-Protocol", wsProtocol+", "+proto)
		w := httptest.NewRecorder()
		e.s.ServeHTTP(w, r)
		if w.Code != http.StatusUnauthorized {
			t.Fatalf("%s without Upgrade: %d %s", method, w.Code, w.Body)
		}
	}
	r := httptest.NewRequest("GET", "/v1/sandboxes", nil)
	r.Header.Set("Upgrade", "websocket")
	r.Header.Set("Sec-WebSocket-Protocol", wsProtocol+", "+proto)
	if _, ok := webSocketKey(r); !ok {
		t.Fatal("an upgrade's subprotocol key was not read")
	}
}
