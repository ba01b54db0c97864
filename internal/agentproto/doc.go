// Package agentproto is the wire protocol between the host and emberbox-agent
// inside the guest.
//
// One byte stream connects them (a virtio-serial port under QEMU, vsock under
// Firecracker). Each new connection starts with a line handshake (Hello /
// Ready) that skips any stale bytes left from an earlier connection, after
// which the stream is a yamux session; the host opens one yamux stream per
// call. A call is a Request frame from the host followed by method-specific
// frames in both directions. Frames are length-prefixed: a kind byte, a 32-bit
// big-endian payload length and the payload. JSON frames carry messages, data
// frames carry raw bytes (file contents), so large files cross without base64.
//
// Its parts: `Conn` framing, method names, `Request`/`Reply`/`Event`,
// request/entry types, error codes, `PortName`, handshake prefixes.
//
// # Protocol
//
//   - Stream: virtio-serial port `org.emberbox.agent.0` ↔ unix socket
//     `agent.sock` on the host (vsock under Firecracker: planned).
//   - Handshake, line based, before yamux: host writes `EMBERBOX-HELLO <24-hex
//     nonce>\n`; the agent discards everything up to a Hello line (nonce ≤ 64
//     bytes) and answers `EMBERBOX-READY <nonce> 1\n`; the host discards lines
//     (read in bounded pieces, at most 16 MiB in all) until a line starting
//     with Ready and its nonce. Why: the port outlives connections, so bytes
//     the previous host connection or agent session wrote and nobody read are
//     still queued; without a resync point a new yamux session would start
//     mid-frame, and the nonce proves the Ready answers this Hello. With no
//     host connected the port reads EOF, so the agent polls every 100 ms.
//   - Session: yamux (host client, agent server), one stream per call, 30 s
//     write timeout. The host grants 256 KiB of window per stream and never
//     more (the agent grants 1 MiB); a stream the host has closed is reset
//     after 5 s if the guest does not close its side.
//   - Frames: kind byte (`'J'` JSON, `'D'` raw data) + uint32 big-endian length
//   - payload; `MaxFrame` 4 MiB, refused by both sides. File bytes go in `'D'`
//     frames ≤ 256 KiB (`DataChunk`): no base64.
//   - Methods: `info`, `configure`, `renew`, `exec`, `spawn`,
//     `process.list|get| output|signal|write|resize`,
//     `file.read|write|list|stat|mkdir|remove|chmod|glob|rename|
//     archive|unarchive`, `volume.attach|detach|freeze|thaw|sync` (see
//     internal/volumes), `file.watch.start|list|events|stop` (a `Watch`
//     request; answers `watch`, `watches`, `batch`, `stopped`), `port.connect`
//     (Request{port}, Reply ok or `port_refused`, then raw bytes both ways;
//     closing one side of the stream half-closes the TCP connection: see
//     internal/api, "Tunnel" and "Previews"). The guest opens streams too (the
//     host's `Client.ServeGuestStreams` decodes them for a typed
//     `guest.EgressHandler`, which the manager adapts to the sandbox's gate):
//     `egress.proxy` (raw bytes of one proxy connection after the Request),
//     `egress.dns` (one D frame query, one D frame answer), `egress.tcp`
//     (Request{egress:{addr}}, Reply ok or `egress_refused`, then raw bytes),
//     `volume.nbd` (Request{volume:{attachmentId}}, Reply ok or an error, then
//     NBD requests and replies both ways; served through the optional
//     `guest.VolumeHandler`; see internal/volumes). A call is one `Request`
//     frame, then per-method frames: usually one `Reply`; streamed `exec` and
//     `process.output` send `Event`s ending in `exit` or `error`; `file.write`
//     sends exactly `size` bytes of D frames, then reads a Reply; `file.read`
//     gets Reply{entry}, D frames, Reply{ok} or an error; `file.archive` gets
//     Reply{ok} (or the error about the directory), D frames, Reply{ok} or an
//     error; `file.unarchive` sends exactly `size` bytes of D frames (≤
//     `MaxUnarchive`, 4 GiB), then reads Reply{unpacked}.
//   - Errors: `Error{code,message}`; `guest.wireError` maps codes
//     (`file_not_found`, `permission_denied`, `no_space`, …) to errdefs
//     classes; the guest's message reaches callers cut to 4 KiB.
package agentproto
