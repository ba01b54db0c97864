// Package guest is the host's client of emberbox-agent: it performs the
// handshake on a fresh connection to the guest, multiplexes calls over one
// yamux session, and maps the agent's error codes to errdefs classes.
//
// It also holds what callers above the sandbox manager see of a guest: a
// Handle, whose roles (ProcessRunner, FileSystem, Watcher, PortDialer,
// VolumeAttacher) are small interfaces a caller can declare alone, and the
// request and answer types of those calls. So a package that only talks
// to a guest (the API's handlers, envd, the interpreter, image builds)
// uses this package's types, not the wire protocol's.
//
// Its parts: `Handshake`, then `Client`: one yamux stream per call (`Info`,
// `Configure`, `Exec`, `Spawn`, `Process*`, `Signal`, `Write`, `Resize`,
// `Stat`, `List`, `Mkdir`, `Remove`, `Chmod`, `WriteFile`, `ReadFile`, `Glob`,
// `Rename`, `Archive`, `Unarchive`, `WatchStart`, `Watches`, `WatchEvents`,
// `WatchStop`, `DialPort`), closed when ctx ends; `wireError` maps agent codes
// to errdefs classes; `limits.go` bounds every answer per method and reports
// violations; `ServeGuestStreams` serves guest-opened streams within their
// budgets.
//
// # A call
//
// `Client.call` opens a yamux stream and writes a `Request{method:"exec"}` JSON
// frame; ctx cancel closes the stream.
//
// # Nothing from the guest is trusted
//
// Nothing from the guest is trusted (root in a guest can freeze PID 1 with
// ptrace, take its port descriptor with `pidfd_getfd` and answer the host
// itself). Per method, `internal/guest` bounds each answer while reading it:
// ordinary replies ≤ 1 MiB of JSON; `process.list`, `file.list`, non-streamed
// `exec` and `process.output` frames ≤ 4 MiB (`MaxFrame`); streamed `exec`
// events ≤ 1 MiB each; `file.read` and `file.archive` data frames ≤ 256 KiB.
// Lists are counted token by token before anything is decoded: at most 1024
// processes (`agentproto.MaxProcessList`; the agent lists the newest 1024) and,
// for a listing, the limit the request asked for (default 1000, at most 10
// 000); keys match case-insensitively and repeats add up; all lists nested in
// one reply (argv, …) ≤ 65 536 elements, nesting ≤ 16. An answer that breaks a
// bound, does not decode, has an unknown or wrong frame kind or lacks its
// result is a violation: the call fails with 503 `guest_protocol_error` (class
// unavailable) before the answer is built, and the manager is told
// (`Client.SetViolationHandler`).
//
//   - Guest-opened streams (egress): first frame ≤ 64 KiB within 30 s;
//     `egress.dns` query ≤ 65 535 bytes (`MaxDNSMessage`), 20 s per exchange,
//     at most 32 DNS exchanges per sandbox at once; at most 128 streams served
//     at once (more are refused: load, not a violation) and at most 192 held,
//     counting streams the host has finished with until the guest closes them
//     or the 5 s close timeout resets them (what the guest sends meanwhile is
//     read and discarded, ≤ 1 MiB); while 192 are held the host accepts nothing
//     and new streams wait in yamux's backlog of 64, beyond which yamux resets
//     them. So a guest's streams hold at most (192 + 64) × 256 KiB = 64 MiB
//     (`guest.GuestStreamBytes`) of the host's memory. A malformed first frame,
//     an oversized DNS query, an unknown method or a bad `egress.tcp` address
//     is a violation.
//
// # Ports
//
// `port.connect` (`internal/agent/port.go`, `internal/guest/port.go`): the host
// opens a yamux stream whose Request names a port; the agent dials
// `127.0.0.1:<port>` (then `[::1]`), answers, and splices bytes both ways,
// passing a half-close on. `guest.Client.DialPort` returns the stream as a
// `net.Conn` with `CloseWrite`. Bounds: `guest.MaxPortConns` (128) connections
// per sandbox on the host (beyond: 503 `too_many_connections`), 256 in the
// agent; each holds at most the host's 256 KiB window of unread guest bytes.
// The guest handle's `DialPort` is the way in; every tunnel connection and
// every preview dial goes through `Manager.Guest` (state refusals, auto-wake,
// activity).
package guest
