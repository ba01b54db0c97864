// Package envd serves E2B's in-sandbox API ("envd") from the host: the process
// and filesystem services over Connect RPC, /health and /files. Nothing of it
// runs in the guest: every call is carried to the agent over the host↔guest
// stream through the guest handle. A request reaches it already routed and
// authenticated (sandbox.RoutedFrom).
//
// The .proto files under proto/ match the wire of E2B's own (their descriptors
// are those of the e2b SDK); the Go code generated from them is committed, and
// regenerated with scripts/protoc.sh.
//
// # What it serves
//
// E2B's in-sandbox API ("envd") is served by the host, never by the guest:
// `envd.New(logger)` is an `http.Handler` that the E2B router (port 49983 of a
// sandbox URL) hands requests already authenticated and resolved with
// `sandbox.WithRouted`; every call goes to the agent through the routed guest
// handle. It serves:
//
//   - Connect RPC (`connectrpc.com/connect` handlers: Connect, gRPC and
//     gRPC-Web; JSON and proto codecs; unary, server and client streams;
//     `Connect-Timeout-Ms`; messages ≤ 8 MiB). The `.proto` files
//     (`internal/envd/proto/{process,filesystem}`) were written to match the
//     e2b SDK's descriptors exactly (same FileDescriptorProto); the generated
//     Go is committed and `scripts/protoc.sh` (`go generate ./internal/envd`)
//     regenerates it. E2B's SDKs speak Connect with the JSON codec over
//     HTTP/1.1 to a plain-HTTP server, which carries client streams too
//     (`StreamInput`): the request body streams while nothing is answered.
//   - `process.Process`: an E2B pid is the process's pid in the guest
//     (`ProcessInfo.PID`); a selector by pid picks the newest running process
//     with it, so a finished one is NotFound (the SDK's `kill` answers false).
//     `Start` runs argv as given with `envs`, `cwd` and the user of
//     `Authorization: Basic base64(user:)`: without `stdin` or `pty` as a
//     streamed `Exec` (output with backpressure, none lost; a client that
//     leaves detaches, the process runs on), else as `Spawn` (`stdin` → a stdin
//     pipe, `pty` → a terminal whose output comes as `pty` data) followed with
//     `ProcessOutput` from offset 0 (a reader more than the guest's kept MiB
//     behind loses the oldest output). The stream is `StartEvent{pid}`, data,
//     `EndEvent` as Go's `ProcessState` renders it (`exit status N`, or exit
//     code -1 and `signal: killed` for a process killed or timed out),
//     keep-alives every `Keepalive-Ping-Interval` seconds (1 s–5 min, default
//     50). As with envd, the request's deadline bounds the process (the agent's
//     timeout), while a client leaving the stream does not end it. `Connect`
//     follows a running process from its current output offset; `List` lists
//     running processes (argv, cwd, tag; not envs); `SendInput`/`StreamInput`
//     append 64 KiB pieces, waiting while the guest's input buffer is full;
//     `CloseStdin` is EOF; `SendSignal` SIGTERM/SIGKILL; `Update` resizes the
//     terminal. Tags live in the server's memory (≤ 4096, oldest forgotten).
//   - `filesystem.Filesystem`: `Stat`, `MakeDir` (parents; an existing
//     directory is AlreadyExists), `Move` (replaces as rename(2)), `ListDir`
//     (depth 1–10, hidden entries, ≤ 10000), `Remove` (recursive), `WatchDir`
//     (a guest watch for the stream's life, its events named relative to the
//     directory, with entries if asked, keep-alives every 50 s),
//     `CreateWatcher`/`GetWatcherEvents`/`RemoveWatcher` (a guest watch of at
//     most a day, its cursor in the server's memory; an ended one is NotFound).
//     `EntryInfo.mode` is the permission bits, `permissions` Go's
//     `FileMode.String()`. The guest's temporary files of atomic writes are
//     left out of watch events. Guest errors map to Connect codes as envd's:
//     not found, already exists, invalid argument (also not/is a directory),
//     permission denied, resource exhausted (no space), failed precondition
//     (other conflicts), unavailable.
//   - `GET /health` (204), `GET /files?path=` (streamed, gzipped if accepted),
//     `POST /files` (multipart `file` parts, each to `path=` or its raw file
//     name; or one octet-stream body, maybe `Content-Encoding: gzip`),
//     answering `[{name, type: "file", path}]`, and errors as `{code, message}`
//     with envd's statuses (400, 403, 404, 409, 413, 415, 507). The guest takes
//     a file of a known size only: a body with a Content-Length streams
//     through; a chunked, gzipped or multipart one is spooled to an unlinked
//     temporary file (≤ 4 GiB, refused while the host has less than 1 GiB
//     free).
//
// File calls act as the request's user (Basic auth for the RPCs, `username=`
// for `/files`): `sandbox.WithFileUser(ctx, user)` (in `internal/guest`: the
// client puts the user on every file and watch request of that ctx that names
// none), as the `Guest` methods take no user. `envd.Version` is 0.5.7
// (octet-stream and gzip uploads). Not served: file metadata (0.6.2, extended
// attributes), and with it the later versions' features (event entries of 0.6.3
// are served, as are recursive watches); `allow_network_mounts` is ignored.
package envd

//go:generate ../../scripts/protoc.sh

// Version is the envd version reported to E2B's SDKs (envdVersion): they
// switch features on by it, so it names only what this package serves.
// 0.5.7 is octet-stream (and gzip) uploads; 0.6.2 would promise file
// metadata (extended attributes), which the guest does not keep.
const Version = "0.5.7"
