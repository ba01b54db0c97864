package api

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
)

// echoListener accepts connections and echoes each until its writer
// half-closes; it stands for a server in the guest.
func echoListener(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); _, _ = io.Copy(c, c) }()
		}
	}()
	return l.Addr().String()
}

func tunnelFrame(kind byte, n uint32, p []byte) []byte {
	b := make([]byte, 5+len(p))
	b[0] = kind
	binary.BigEndian.PutUint32(b[1:5], n)
	copy(b[5:], p)
	return b
}

// TestTunnelSpeaksTheSDKProtocol opens two connections over one tunnel
// as withruntime's _tunnel.py does: one to an echo port, one to a port
// nothing listens on.
func TestTunnelSpeaksTheSDKProtocol(t *testing.T) {
	e := newEnv(t)
	e.m.add("key_a", "sbx_t", "running", time.Hour)
	e.m.listen("sbx_t", 3000, echoListener(t))
	srv := httptest.NewServer(e.s)
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ws, _, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(srv.URL, "http")+"/v1/sandboxes/sbx_t/tunnel",
		&websocket.DialOptions{HTTPHeader: http.Header{"Authorization": {"Bearer secret-a"}}})
	if err != nil {
		t.Fatal(err)
	}
	defer ws.CloseNow()
	ws.SetReadLimit(1 << 20)
	typ, msg, err := ws.Read(ctx)
	if err != nil || typ != websocket.MessageText || string(msg) != `{"type":"ready"}` {
		t.Fatalf("first message %v %q %v, want ready", typ, msg, err)
	}
	write := func(b []byte) {
		if err := ws.Write(ctx, websocket.MessageBinary, b); err != nil {
			t.Fatal(err)
		}
	}
	write(tunnelFrame('o', 1, []byte("tcp 3000")))
	write(tunnelFrame('o', 2, []byte("tcp 3001")))
	want := bytes.Repeat([]byte("0123456789"), 20000)
	var got []byte
	var credit uint64
	opened, refused, ended, closed := false, false, false, false
	for !(closed && refused) {
		_, msg, err := ws.Read(ctx)
		if err != nil {
			t.Fatalf("reading: %v (got %d bytes)", err, len(got))
		}
		kind, n, p := msg[0], binary.BigEndian.Uint32(msg[1:5]), msg[5:]
		switch {
		case kind == 'o' && n == 1:
			opened = true
			for i := 0; i < len(want); i += 64 << 10 {
				write(tunnelFrame('d', 1, want[i:min(i+64<<10, len(want))]))
			}
			write(tunnelFrame('e', 1, nil))
		case kind == 'c' && n == 2:
			refused = len(p) > 0
		case kind == 'a':
			credit = binary.BigEndian.Uint64(p)
		case kind == 'd' && n == 1:
			got = append(got, p...)
		case kind == 'e' && n == 1:
			ended = true
		case kind == 'c' && n == 1:
			closed = true
		default:
			t.Fatalf("unexpected frame %q on stream %d", kind, n)
		}
	}
	if !opened || !ended || !bytes.Equal(got, want) {
		t.Fatalf("opened %v ended %v, echoed %d bytes equal=%v", opened, ended, len(got), bytes.Equal(got, want))
	}
	if credit != uint64(len(want)) {
		t.Errorf("credited %d, want %d", credit, len(want))
	}
}

func TestTunnelRefusals(t *testing.T) {
	e := newEnv(t)
	e.m.add("key_a", "sbx_t", "running", time.Hour)
	e.m.add("key_a", "sbx_s", "stopped", time.Hour)
	if w := e.do("GET", "/v1/sandboxes/sbx_t/tunnel", ""); w.Code != http.StatusUpgradeRequired {
		t.Errorf("no upgrade: %d %s", w.Code, w.Body)
	}
	if w := e.do("GET", "/v1/sandboxes/sbx_s/tunnel", ""); w.Code != http.StatusConflict {
		t.Errorf("stopped: %d %s", w.Code, w.Body)
	}
	if w := e.do("GET", "/v1/sandboxes/sbx_t/tunnel", "", "Authorization", "Bearer secret-b"); w.Code != http.StatusNotFound {
		t.Errorf("another key's: %d %s", w.Code, w.Body)
	}
}

// previewSandbox has a well-formed id: a preview's host carries it.
const previewSandbox = "sbx_0123456789abcdef0123"

// visitPreview sends a GET for url (a preview's, or any host) to the
// previews' handler; headers are name, value pairs.
func visitPreview(e *testEnv, url string, headers ...string) *httptest.ResponseRecorder {
	r := httptest.NewRequest("GET", url, nil)
	for i := 0; i+1 < len(headers); i += 2 {
		r.Header.Set(headers[i], headers[i+1])
	}
	w := httptest.NewRecorder()
	Previews{s: e.s}.ServeHTTP(w, r)
	return w
}

func TestPreviewRoutesAndAccess(t *testing.T) {
	e := newEnv(t)
	e.m.add("key_a", previewSandbox, "running", time.Hour)
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// What reached the guest: no credentials of the preview.
		_ = json.NewEncoder(w).Encode(map[string]string{"path": r.URL.Path, "query": r.URL.RawQuery,
			"auth": r.Header.Get("Authorization"), "token": r.Header.Get(previewTokenHeader), "cookie": r.Header.Get("Cookie"), "host": r.Host})
	}))
	defer backend.Close()
	e.m.listen(previewSandbox, 8080, strings.TrimPrefix(backend.URL, "http://"))
	base := "/v1/sandboxes/" + previewSandbox + "/previews"

	for _, body := range []string{`{"port":0}`, `{"port":8080,"visibility":"secret"}`, `{"port":8080,"ttlSeconds":5}`,
		`{"port":8080,"embedOrigins":["javascript:x"]}`, `{"port":8080,"nope":1}`} {
		if w := e.do("POST", base, body); w.Code != http.StatusBadRequest {
			t.Errorf("%s: %d %s, want 400", body, w.Code, w.Body)
		}
	}
	w := e.do("POST", base, `{"port":8080}`)
	if w.Code != http.StatusOK {
		t.Fatalf("create: %d %s", w.Code, w.Body)
	}
	p := decodeBody[previewJSON](t, w)
	// The API was asked at example.com (port 80): the preview is on a
	// host of its own under localhost.
	url := "http://8080-" + hostLabelID(previewSandbox) + ".localhost/"
	if p.Visibility != "private" || p.Token == nil || p.URLWithToken == nil || p.URL != url || !strings.HasPrefix(p.ID, "pv") {
		t.Fatalf("created %+v", p)
	}
	visit := func(target string, headers ...string) *httptest.ResponseRecorder {
		return visitPreview(e, target, headers...)
	}
	if w := visit(url + "a/b?x=1"); w.Code != http.StatusUnauthorized || errorOf(t, w).Code != "preview_token_required" {
		t.Fatalf("no token: %d %s", w.Code, w.Body)
	}
	if w := visit(url, "Authorization", "Bearer secret-b"); w.Code != http.StatusUnauthorized {
		t.Errorf("another key: %d %s", w.Code, w.Body)
	}
	seen := func(w *httptest.ResponseRecorder) map[string]string {
		t.Helper()
		if w.Code != http.StatusOK {
			t.Fatalf("%d %s", w.Code, w.Body)
		}
		var m map[string]string
		if err := json.Unmarshal(w.Body.Bytes(), &m); err != nil {
			t.Fatal(err)
		}
		return m
	}
	got := seen(visit(url+"a/b?x=1", previewTokenHeader, *p.Token))
	if got["path"] != "/a/b" || got["query"] != "x=1" || got["token"] != "" || got["host"] != "localhost:8080" {
		t.Errorf("with the header, the guest saw %v", got)
	}
	w = visit(url+"a?"+previewTokenQuery+"="+*p.Token+"&y=2", "Cookie", "other=1")
	got = seen(w)
	if got["query"] != "y=2" || got["cookie"] != "other=1" {
		t.Errorf("with the query, the guest saw %v", got)
	}
	ck := w.Result().Cookies()
	// The cookie is the preview host's alone: no Domain, the whole path.
	if len(ck) != 1 || ck[0].Name != previewCookie || !ck[0].HttpOnly || ck[0].Path != "/" || ck[0].Domain != "" {
		t.Fatalf("cookies %v", ck)
	}
	got = seen(visit(url, "Cookie", previewCookie+"="+ck[0].Value+"; other=2"))
	if got["cookie"] != "other=2" {
		t.Errorf("with the cookie, the guest saw %v", got)
	}
	got = seen(visit(url, "Authorization", "Bearer secret-a"))
	if got["auth"] != "" {
		t.Errorf("the owner's key reached the guest: %v", got)
	}
	// A rotation refuses the old token.
	w = e.do("POST", base+"/8080:rotate", "{}")
	rotated := decodeBody[previewJSON](t, w)
	if w.Code != http.StatusOK || *rotated.Token == *p.Token {
		t.Fatalf("rotate: %d %s", w.Code, w.Body)
	}
	if w := visit(url, previewTokenHeader, *p.Token); w.Code != http.StatusUnauthorized {
		t.Errorf("old token after rotate: %d", w.Code)
	}
	seen(visit(url, previewTokenHeader, *rotated.Token))
	// Listing, a port nothing answers on, and deletion.
	w = e.do("GET", base, "")
	if list := decodeBody[struct{ Data []previewJSON }](t, w); len(list.Data) != 1 || list.Data[0].Port != 8080 || list.Data[0].URL != url {
		t.Errorf("list: %s", w.Body)
	}
	w = e.do("POST", base, `{"port":9,"visibility":"public"}`)
	pub := decodeBody[previewJSON](t, w)
	if pub.Token != nil {
		t.Errorf("a public preview has a token: %s", w.Body)
	}
	if w := visit(pub.URL); w.Code != http.StatusBadGateway || errorOf(t, w).Code != "preview_unreachable" {
		t.Errorf("nothing on the port: %d %s", w.Code, w.Body)
	}
	if w := e.do("DELETE", base+"/8080", ""); w.Code != http.StatusOK {
		t.Fatalf("delete: %d %s", w.Code, w.Body)
	}
	if w := visit(url, previewTokenHeader, *rotated.Token); w.Code != http.StatusNotFound {
		t.Errorf("deleted preview: %d %s", w.Code, w.Body)
	}
	if w := e.do("GET", base+"/8080", ""); w.Code != http.StatusNotFound {
		t.Errorf("get deleted: %d %s", w.Code, w.Body)
	}
	if w := e.do("GET", base+"/8080", "", "Authorization", "Bearer secret-b"); w.Code != http.StatusNotFound {
		t.Errorf("another key's: %d %s", w.Code, w.Body)
	}
}

// TestTunnelPassesNoCredential: a tunnel carries the client's bytes into
// the guest unparsed, and nothing of its handshake: a server in the guest
// that records what reaches it sees neither the key (in Authorization or
// as a subprotocol) nor a preview cookie the handshake carried.
func TestTunnelPassesNoCredential(t *testing.T) {
	e := newEnv(t)
	e.m.add("key_a", "sbx_t", "running", time.Hour)
	l, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	got := make(chan []byte, 1)
	go func() {
		c, err := l.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		b, _ := io.ReadAll(c) // until the client's half-close
		got <- b
	}()
	e.m.listen("sbx_t", 3000, l.Addr().String())
	srv := httptest.NewServer(e.s)
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	keyProto := wsKeyPrefix + base64.RawURLEncoding.EncodeToString([]byte("secret-a"))
	ws, _, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(srv.URL, "http")+"/v1/sandboxes/sbx_t/tunnel",
		&websocket.DialOptions{Subprotocols: []string{wsProtocol, keyProto},
			HTTPHeader: http.Header{"Authorization": {"Bearer secret-a"}, "Cookie": {previewCookie + "=pv.1.secret"}}})
	if err != nil {
		t.Fatal(err)
	}
	defer ws.CloseNow()
	if _, msg, err := ws.Read(ctx); err != nil || string(msg) != `{"type":"ready"}` {
		t.Fatalf("first message %q %v", msg, err)
	}
	request := []byte("GET / HTTP/1.1\r\nHost: localhost:3000\r\n\r\n")
	for _, f := range [][]byte{tunnelFrame('o', 1, []byte("tcp 3000")), tunnelFrame('d', 1, request), tunnelFrame('e', 1, nil)} {
		if err := ws.Write(ctx, websocket.MessageBinary, f); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case b := <-got:
		if !bytes.Equal(b, request) {
			t.Errorf("the guest got %q, want exactly the client's bytes %q", b, request)
		}
		for _, secret := range []string{"secret-a", "pv.1.secret", keyProto, "Authorization"} {
			if bytes.Contains(b, []byte(secret)) {
				t.Errorf("the guest saw %q", secret)
			}
		}
	case <-ctx.Done():
		t.Fatal("the guest's server got nothing")
	}
}
