// Package api serves Emberbox's HTTP API, the Runtime Cloud v1 wire format:
// routes with colon verbs, camelCase JSON, one error shape, bearer keys,
// Idempotency-Key, Prefer: wait=N and NDJSON exec streaming. It maps errdefs
// classes to statuses and leaves every decision about sandboxes to the manager.
//
// # Routes
//
// One `route` table drives the mux, `/v1/openapi.json` and tests; `group`
// splits colon verbs. Its handlers live on one small type per area
// (areas.go: `sandboxesAPI`, `snapshots`, `files`, `uploadsAPI`,
// `processes`, `sockets`, `watches`, `interpreterAPI`, `imagesAPI`,
// `volumesAPI`, `previewsAPI`, `linksAPI`, `networkAPI`, `usageAPI`,
// `nodesAPI`), each holding the `server`, which keeps what every route
// shares and the helpers of more than one area; `previewHost` serves the
// previews' hosts. `serveRoute`: bearer auth (`Keys`) and rate limits
// (`gate`), body ≤ 1 MiB, `Idempotency-Key` (`idempotent`/`runReserved`/
// `recorder`: JSON answers stored and replayed with `"replayed":true`; 5xx and
// NDJSON released). `streamEvents` writes NDJSON. `uploads.go`: the handlers of
// chunked uploads of files > 1 MiB (≤ 4 GiB), staged by `internal/upload` under
// `<data>/uploads` and committed with the guest's `WriteFile`; `files:chmod`
// calls the guest's `Chmod`. `archive.go`: `files/list?glob=` (the guest's
// `Glob`), `files:rename`, `GET files/archive` (the guest's tar streamed as it
// is packed; no length is promised, and a failure after the first byte aborts
// the response so it cannot pass for a whole archive) and `PUT files/archive`
// (a body ≤ 1 MiB given to `Unarchive`). `archive_uploads.go`: chunked archive
// uploads (`files/archive/uploads`, what `files.unarchive` and
// `files.upload(dir)` use over 1 MiB): open-ended uploads of the same staging
// store (same per-key and server limits), chunks ≤ 1 MiB strictly in sequence
// (the last one may come again), no hash, length fixed at commit, which streams
// the staged tar into `Unarchive` as the user given at begin. `links.go`:
// signed links (`files:link`, `files:revoke-links`, and the public
// `/v1/links/{token}`: GET a file, one byte range, or a directory as .tar.gz;
// PUT a file, `Content-Length` required, ≤ the link's `maxBytes`, the body
// streamed to `WriteFile`: such routes are `StreamBody`, read by the handler
// and never idempotent). The link's URL is the scheme and host the caller
// reached the server at (`X-Forwarded-Proto: https` honoured). A link acts as
// the key that made it: a paused sandbox is woken if the link asked to (`wake`)
// or its autoWake is on, else the state's refusal. `watches.go`: file watches
// (`files/watches`, `…/{watchId}/events`, `DELETE …/{watchId}`): a long poll
// (`waitMs` ≤ 30 s) answering `{events, nextCursor, notices, ended}`, or with
// `follow` NDJSON lines `{"k":"events",events,cursor}`, notices (`overflow`,
// `limit`), then `end` (with its reason), `paused`, `failure`, or after 110 s
// `continue` (the SDK reads again from its cursor). `stdin.go` (`:write`,
// `:resize`) and `terminal.go` (the terminal WebSocket): see "Process input and
// terminals" below. What api needs of the manager it declares itself, as role
// interfaces by area (lifecycle, guests, snapshots, previews, usage, …); the
// guests role, `Guest(owner, id)`, is the only way into a guest: it answers a
// running sandbox and its guest handle or the refusal of the sandbox's state.
// Routes that call a guest are marked `Guest` in the route table. `api` speaks
// the sandbox and guest packages' types and never imports `agentproto` or
// `store`. Paths withruntime 0.35.0 calls that this server has not built
// (`unavailable.go`: sessions, the products under `/v1/` such as image
// registries, resize, volume backup policies, egress secrets, job imports,
// a process's traced files) answer 501 with a code ending in `_unavailable`,
// which the SDK never retries; any other unknown path is 404 `route_not_found`.
// `TestEveryWithruntimeRouteIsKnown` walks every route the SDK can call
// (`testdata/withruntime_routes.txt`, extracted from the installed SDK's source
// by `tests/conformance/withruntime_routes.py`, whose test checks the list is
// complete) and refuses a `route_not_found`. errdefs classes → one JSON error
// shape (`errors.go`). `volumes.go` serves `/v1/volumes…` and
// `/v1/volume-backups…` from a `*volumes.Service` (`Config.Volumes`; nil: 501
// `volumes_unavailable`); `webhooks.go` serves `/v1/webhooks…`,
// `/v1/webhook-deliveries…` and `/v1/events` from a `*webhook.Service`
// (`Config.Webhooks`; nil: 501 `webhooks_unavailable`, `events_unavailable`).
//
// # A create
//
// `POST /v1/sandboxes` → `serveRoute`: bearer key authenticated (its id is the
// owner) and counted against its bucket, body read (≤ 1 MiB). With
// `Idempotency-Key`, `idempotent` reserves (owner, key, fingerprint); a retry
// waits for, replays, or (other fingerprint) gets 422.
//
// `sandboxesAPI.create`: strict decode; `createRequest.spec()` validates and fills
// defaults (2 vCPU, 4096 MiB memory, 4096 MiB disk with min 3072; no lease and
// a 300 s idle pause unless `timeoutSeconds` is given; onLeaseEnd `stop`).
// `getOrCreate` first looks for a live sandbox of that name.
//
// Then the sandbox package creates and boots it (see its package doc).
//
// # An exec
//
// `POST /v1/sandboxes/{id}:exec` → `serveRoute` → `s.exec`: `commandFields`
// validates command/argv, env, stdin (≤ 1 MiB), user (`sandbox`/`user`/
// `root`); `Manager.Guest` gives the sandbox and its guest, or the refusal of
// its state; `execTimeout` = min(60 s, lease left) by default, an explicit one
// beyond the lease is `time_limit_too_short` (streams: clamped to the lease);
// non-streamed capture 64 KiB per stream (1 MiB if the timeout is > 60 s).
//
// On the way back, `streamEvents`/`wireEvent` write and flush one NDJSON line
// per event; `data` is text, plus `base64` for chunks that are not valid UTF-8;
// `exit` keeps `exitCode: null` (timeout/kill by agent; signal death = −signo).
// Errors before the first line are JSON errors, after it `error` lines. Spawned
// processes are read via `…/processes/{pid}/output?cursor=` (`truncated` =
// bytes that left the ring).
//
// # Process input and terminals
//
//   - Spawn (`POST …/processes`) takes `stdinMode: "pipe"` (stdin stays open
//     for `:write`), `pty: {cols, rows}` (1..1000 each) and `outputEncoding:
//     "base64"` (every output chunk of `…/output` then carries its bytes as
//     `base64`; the agent keeps bytes either way, the API shapes the answer
//     from the process's `outputEncoding`). A pty process is started by the
//     agent (`procio.go`) on a new terminal from `creack/pty`, as the leader of
//     a new session with the terminal as its controlling tty (so `kill(-pid)`
//     still reaches its group); the terminal's output is its stdout. The master
//     is re-made non-blocking (pty.Open leaves it blocking, where `Close`
//     cannot end a read held open by a background job), and sized with
//     `TIOCSWINSZ` through `SyscallConn`. Process fields: `user`
//     (`sandbox`|`root`), `pty`, `stdinOpen`, `stdinOffset`, `outputEncoding`;
//     `outOfMemory` is not reported.
//   - Input (`agent/stdin.go`): `POST …/processes/{pid}:write {base64|data,
//     offset, eof}` → agent `process.write`. Input is accepted into a queue of
//     at most `MaxStdinBuffer` (1 MiB) not yet read by the process, at
//     cumulative offsets: bytes below the accepted offset are skipped (a retry
//     types nothing twice), an offset past it is 409 `stdin_offset_gap`, and a
//     write that does not fit is accepted in part (the answer's `offset` says
//     how far; withruntime resends the rest). One goroutine per process copies
//     the queue into the pipe or master, so a process that does not read blocks
//     only it. `eof` closes a pipe once the queue is written; on a pty it types
//     ^D (end of file at the start of a line), as a terminal cannot be
//     half-closed. After `eof` or the process's end, new input is 409
//     `stdin_closed`. A write without `offset` (the terminal's) is an append,
//     taken whole or refused with `stdin_full`. The route's body limit is 1.4
//     MiB (1 MiB base64 in JSON).
//   - Resize: `POST …/processes/{pid}:resize {cols, rows}` → `process.resize`
//     (`TIOCSWINSZ`; the kernel sends SIGWINCH); 409 `not_a_terminal` without a
//     pty.
//   - Terminal (`api/terminal.go`): `GET
//     …/terminal?cols&rows&command&cwd&user&processId`, a WebSocket
//     (`coder/websocket`) built on the methods above, with no agent method of
//     its own. Before the upgrade, as ordinary errors: the query (400), the key
//     (401), the sandbox's state (its refusal, e.g. 409 `not_running`), a
//     `processId` that is unknown (404) or has no pty (409 `not_a_terminal`),
//     no `Upgrade: websocket` (426), more than 12 open terminal sockets on the
//     sandbox (429 `too_many_terminals`). Then a pty process is spawned
//     (default `bash -l`) or the one named is attached, the server sends the
//     text frame `{"type":"ready","processId"}`, follows `process.output` from
//     offset 0 (so a reattach replays what the guest's 1 MiB output ring still
//     holds) as binary frames, and ends with `{"type":"exit","exitCode"}` and a
//     normal closure. From the client, binary frames are input (≤ 1 MiB a
//     message, appended in 64 KiB pieces, waiting out `stdin_full`) and text
//     frames `{"type":"resize",cols,rows}`. The process outlives the socket:
//     closing it leaves the program running for a reattach by `processId`; it
//     ends with the program, a signal or the sandbox.
//
// # Tunnel
//
// Tunnel (`internal/api/tunnel.go`, `GET /v1/sandboxes/{id}/tunnel`,
// key-authenticated WebSocket, `github.com/coder/websocket`): the protocol of
// withruntime's `forward_port` (`_tunnel.py`): `{"type":"ready"}`, then binary
// messages `kind(1) stream(4) payload` with kinds `o` ("tcp <port>"; answered
// `o`, or `c` with the reason), `d`, `e` (half-close), `c`, and the server's
// `a` (uint64 bytes of the client's data taken so far). The client sends at
// most 1 MiB past its credit, and data is credited once written into the guest,
// so a tunnel buffers at most 1 MiB; a client that overruns it, or sends a
// malformed message, ends the tunnel (an `error` text message, then close). ≤
// 64 connections per tunnel, messages ≤ 128 KiB. The tunnel carries the
// client's bytes unparsed: nothing of its handshake (the key in `Authorization`
// or a subprotocol, cookies) enters a connection to the guest.
//
// # Previews
//
// Previews (`internal/sandbox/previews.go`, `internal/api/previews.go`,
// `preview_proxy.go`): `POST/GET …/previews`, `GET/DELETE …/previews/{port}`,
// `POST …/previews/{port}:rotate`. A record per sandbox and port (store
// migration 9, table `previews`, ≤ 32 per sandbox): visibility `private`
// (default) or `public`, an optional end (`ttlSeconds`/`expiresAt`, 60 s to 7
// days), embed origins (sent as `Content-Security-Policy: frame-ancestors`),
// and a 32-byte secret. A token is `<previewId>.<unix
// expiry>.<HMAC-SHA256(secret)>`: 24 h by default, never past the preview's
// end; a rotation replaces the secret, refusing every earlier token. Deleting
// the sandbox deletes its previews (and `OpenPreview` refuses a deleted
// sandbox's at once); deleting a preview closes its open connections. Each
// preview is an origin of its own (`preview_host.go`): its URL is
// `<scheme>://<port>-<hex>.<preview domain>[:port]/`, `<hex>` being the sandbox
// id without `sbx_` (`_` is no letter, digit or hyphen: RFC 1123 names and
// certificates refuse it), the domain from `--preview-domain` (a domain: https;
// or a URL with scheme and port), by default `localhost` over http on the port
// the request came in on (browsers resolve `*.localhost` to loopback; no DNS).
// `api.NewWithPreviews` returns the API and `api.Previews`; `serve` sends every
// request whose Host is below the preview domain to Previews before anything
// else (E2B's front, the console, the API) and no other request: a page behind
// a preview can neither register a service worker over the console's origin nor
// read its `sessionStorage`. The host parser is strict (fuzzed,
// `FuzzPreviewHost`): exactly `<port>-<hex>.<domain>`, a port 1–65535 without
// leading zeros, 20 hex digits of a sandbox id, case-insensitive, any port
// after it; another name below the domain is 404 `preview_not_found`, never the
// API. The API's host answers `/preview/…` 421 `preview_moved`, with the URL
// form as the hint. `serve` refuses an `--e2b-domain` equal to, below or above
// the preview domain. The proxy is `httputil.ReverseProxy` (HTTP and Upgrade)
// whose transport dials `DialPort` of the preview's own sandbox and port, taken
// from the record (`OpenPreview(sandbox, port)`), never from the request. A
// private preview needs the owner's key as a bearer token, or a token in
// `x-runtime-preview-token`, `?runtime_preview_token=` (then kept as an
// HttpOnly host-only cookie, Path `/`, Secure under https) or that cookie. No
// credential of ours reaches a guest, whoever it belongs to and whether or not
// it opened the preview (`stripCredentials`): `Authorization`, `X-Api-Key`
// (E2B's API key too), `X-Access-Token` and `E2B-Traffic-Access-Token`, the
// preview token (header, query, cookie) and the console's `emberbox.key.*`
// WebSocket subprotocol; the guest sees `Host: localhost:<port>` and
// `X-Forwarded-*`. Nothing the guest answers reaches past its origin
// (`confineResponse`): `Service-Worker-Allowed`, `Clear-Site-Data`, and
// `Set-Cookie` with a `Domain` or our cookie's name are dropped. A paused
// sandbox is not woken by its preview unless it has `autoWake`: the preview
// answers 503, an HTML "paused" page to a browser (`Accept: text/html`), else
// `sandbox_paused` in the error shape. Traffic over a port connection counts as
// activity (the manager's `activeGuest` wraps `DialPort`, marking the sandbox
// active at most once a second while bytes flow), so an idle pause waits until
// a tunnel or preview goes quiet. `TestConsole` proves it in Chromium: a
// hostile page behind a public preview registers a worker, reads storage and
// cookies and fetches the API's origin, and gets nothing of the console's.
package api
