// Package liveview serves a sandbox desktop's live view: noVNC 1.7.0
// (vendored under static/novnc, MPL-2.0, served from the binary, never a
// CDN) in a page of its own, and a WebSocket that carries the RFB bytes of
// the desktop's VNC server. The API serves it on the preview of the
// desktop's VNC port (Port), an origin of its own, after the preview's
// authentication: the page and its WebSocket need the preview's token
// (the page hands the one in its URL to the socket, since a frame's
// requests may carry no cookie); its scripts and styles, the same public
// files for every sandbox, do not.
package liveview

import (
	"context"
	"embed"
	"io"
	"io/fs"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/coder/websocket"
)

// Port is the desktop's VNC server in the guest (x11vnc, on 127.0.0.1
// only). An HTTP request to it means nothing, so its preview is the live
// view.
const Port = 5900

// SocketPath is where the page opens its WebSocket.
const SocketPath = "/websockify"

//go:embed static
var static embed.FS

// fileServer serves the page and the client, the same for every view.
var fileServer = func() http.Handler {
	files, err := fs.Sub(static, "static")
	if err != nil {
		panic(err) // the embed's own directory
	}
	return http.FileServerFS(files)
}()

// IsAsset reports whether path is one of the view's static files, which
// are the same for every sandbox: anything but the page and its socket.
func IsAsset(path string) bool {
	return path != "/" && path != "/index.html" && path != SocketPath
}

// Dial connects to the desktop's VNC server, starting it if it must.
type Dial func(ctx context.Context) (net.Conn, error)

// Handler serves the live view of one request. frameAncestors are the
// origins that may embed the page (the console's); none: only itself.
func Handler(dial Dial, frameAncestors []string) http.Handler {
	ancestors := "'self'"
	if len(frameAncestors) > 0 {
		ancestors = strings.Join(frameAncestors, " ")
	}
	csp := "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data: blob:; connect-src 'self'; " +
		"base-uri 'none'; form-action 'none'; frame-ancestors " + ancestors
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == SocketPath {
			serveSocket(w, r, dial)
			return
		}
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
			return
		}
		w.Header().Set("Content-Security-Policy", csp)
		w.Header().Set("X-Content-Type-Options", "nosniff")
		w.Header().Set("Referrer-Policy", "no-referrer")
		w.Header().Set("Cache-Control", "no-cache")
		fileServer.ServeHTTP(w, r)
	})
}

// serveSocket bridges a WebSocket of the page to the VNC server: binary
// messages carry the RFB stream both ways.
func serveSocket(w http.ResponseWriter, r *http.Request, dial Dial) {
	dctx, cancel := context.WithTimeout(r.Context(), 2*time.Minute)
	vnc, err := dial(dctx)
	cancel()
	if err != nil {
		http.Error(w, "the desktop's VNC server: "+err.Error(), http.StatusBadGateway)
		return
	}
	defer vnc.Close()
	// The page is of this origin (the default origin check); noVNC asks
	// for no subprotocol.
	ws, err := websocket.Accept(w, r, nil)
	if err != nil {
		return
	}
	ws.SetReadLimit(1 << 20)
	ctx, stop := context.WithCancel(r.Context())
	defer stop()
	conn := websocket.NetConn(ctx, ws, websocket.MessageBinary)
	defer conn.Close()
	done := make(chan struct{}, 2)
	go func() { _, _ = io.Copy(vnc, conn); done <- struct{}{} }()
	go func() { _, _ = io.Copy(conn, vnc); done <- struct{}{} }()
	<-done // either side's end ends both
}
