package console

import (
	"bytes"
	"embed"
	"io/fs"
	"net/http"
	"path"
	"strings"
	"time"
)

//go:embed static
var files embed.FS

// Prefix is where the console is served.
const Prefix = "/console/"

// CSP allows scripts, connections (fetch and the terminal's WebSocket),
// images and fonts from this origin only, and no inline script. Styles
// admit inline ones because xterm.js writes its cell sizes and colours
// into <style> elements it makes; a style cannot run code. Frames may be
// of any http(s) origin: the desktop's live view is on a preview origin
// under the domain the operator chose, and only the console's own script
// makes frames.
const CSP = "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; " +
	"connect-src 'self'; img-src 'self' data:; font-src 'self'; base-uri 'none'; " +
	"form-action 'none'; frame-ancestors 'none'; frame-src http: https:"

// contentTypes are the types of the files served, by extension; any
// other file is not served.
var contentTypes = map[string]string{
	".html": "text/html; charset=utf-8",
	".js":   "text/javascript; charset=utf-8",
	".css":  "text/css; charset=utf-8",
	".svg":  "image/svg+xml",
}

// Handler serves the console under Prefix: GET and HEAD of the embedded
// files, the page itself at Prefix.
func Handler() http.Handler {
	root, err := fs.Sub(files, "static")
	if err != nil {
		panic("console: " + err.Error()) // the embed pattern guarantees it
	}
	return &handler{root: root}
}

type handler struct{ root fs.FS }

func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	hdr := w.Header()
	hdr.Set("Content-Security-Policy", CSP)
	hdr.Set("X-Content-Type-Options", "nosniff")
	hdr.Set("X-Frame-Options", "DENY")
	hdr.Set("Referrer-Policy", "no-referrer")
	hdr.Set("Cross-Origin-Opener-Policy", "same-origin")
	// The assets change with the binary; a revalidation is cheap.
	hdr.Set("Cache-Control", "no-cache")
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		hdr.Set("Allow", "GET, HEAD")
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	name, ok := strings.CutPrefix(r.URL.Path, Prefix)
	if !ok {
		http.NotFound(w, r)
		return
	}
	if name == "" {
		name = "index.html"
	}
	// path.Clean and fs.ValidPath keep the name inside the embedded tree.
	if name != path.Clean(name) || !fs.ValidPath(name) {
		http.NotFound(w, r)
		return
	}
	ctype, ok := contentTypes[path.Ext(name)]
	if !ok {
		http.NotFound(w, r)
		return
	}
	b, err := fs.ReadFile(h.root, name)
	if err != nil {
		http.NotFound(w, r)
		return
	}
	hdr.Set("Content-Type", ctype)
	http.ServeContent(w, r, "", time.Time{}, bytes.NewReader(b))
}
