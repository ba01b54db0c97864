// Package console serves the web console: one HTML page, a small hand-written
// JavaScript app and its CSS, and a vendored xterm.js, all embedded in the
// binary. The console is only a client of the HTTP API (/v1): it holds the key
// in the browser's sessionStorage and sends it as a bearer header, or as a
// WebSocket subprotocol for the terminal. Nothing it serves loads from another
// origin, and a strict Content-Security-Policy says so to the browser.
//
// # What it serves
//
// `emberbox serve` serves a web console at `/console/` beside the API: the
// server's root mux sends `/console/` to `console.Handler()` and everything
// else to the API handler, so `/v1` keeps its one error shape and the route
// table (and OpenAPI document) holds only API operations. The package embeds
// (`go:embed static`) one HTML page, a hand-written JavaScript app (`app.js`,
// no framework, no build step), its CSS, and xterm.js 6.0.0 with `addon-fit`
// 0.11.0 vendored from npm under `static/vendor/xterm` (licences and versions
// beside them; source-map comments removed). Only `.html`, `.js`, `.css` and
// `.svg` files are served, with explicit content types, `nosniff`,
// `X-Frame-Options: DENY`, `Referrer-Policy: no-referrer` and the policy
// `default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline';
// connect-src 'self'; img-src 'self' data:; font-src 'self'; base-uri 'none';
// form-action 'none'; frame-ancestors 'none'` (no inline script; inline styles
// only because xterm.js writes its cell sizes and theme into `<style>`
// elements). The console is only an API client: the key is checked with `GET
// /v1/me` and kept in `sessionStorage` (gone with the tab), sent as
// `Authorization: Bearer`; views are a hash router over sandboxes (list with
// state, size, lease end and the egress policy from `GET …/network`; create,
// stop, delete), files (`files/list`, download via `files/content` into a blob,
// upload by `PUT files/content`, at most 1 MiB), terminal, previews (list,
// share a port, open `urlWithToken`, stop), events and checkpoints (a
// timeline, oldest first, of label, time and size; "Checkpoint now", and per
// checkpoint Restore after a confirm, optionally keeping the present state,
// Branch into 1–10 new sandboxes, and Delete). Everything shown is built with
// DOM calls and `textContent`, never HTML strings.
//
// # How the terminal authenticates
//
// A browser's `WebSocket` cannot set `Authorization`, and a key in the query
// string would land in access logs and history. The console offers two
// subprotocols, `emberbox.v1` and `emberbox.key.<the key in unpadded
// base64url>`, which travel in the `Sec-WebSocket-Protocol` header.
// `api.authenticate` (`websocket_auth.go`) reads a key there only when there is
// no `Authorization` header and the request is a `GET` with `Upgrade:
// websocket`, so no other request can be authorized that way; failures count
// against the address's bad-key limit like any other. The terminal and tunnel
// routes select `emberbox.v1`, never echoing the key. `coder/websocket`'s
// `Accept` refuses a cross-origin handshake (its `Origin` must match the host),
// so another site's page cannot ride a user's browser into a terminal, and it
// could not read the key from `sessionStorage` anyway.
package console
