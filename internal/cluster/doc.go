// Package cluster makes several emberbox servers on one PostgreSQL store one
// service: each registers as a node with a heartbeat, any node answers any API
// call, a create is placed on a node by the store's view of what each holds, a
// call for a sandbox of another node is proxied to it over a mutual-TLS channel
// of the nodes' own, a node that stops answering is declared lost by the
// others, and a drained node hands its paused sandboxes to the others. See
// docs/cluster.md.
//
// A server whose `--store` is a PostgreSQL URL is a node of a cluster (DESIGN
// D18, docs/cluster.md for running one). `serve` then:
//
//   - joins before the manager recovers: `cluster.Join` registers the node
//     (`Store.RegisterNode`: epoch +1, heartbeat now, its capacity from the
//     admission flags, its accel, image digest and version) and scopes the
//     store to it (`Store.SetNode`). From then on `ListLive`, the housekeeping
//     lists (`ListOptions.Local`, expired snapshots, stopped disks) and every
//     insert are the node's; `UpdateSandbox`, `InsertSandbox` and `MoveSandbox`
//     refuse (code `node_fenced`) a row of another node or a node whose stored
//     epoch has moved on. `Store.LostSandboxes` + `Manager.EndVMs` end VMs of
//     sandboxes declared lost while the node was away, before `Recover`.
//   - runs `Cluster.Run` (heartbeat; `StaleNodes` + `DeclareLost` for nodes
//     silent past `--node-timeout`; a refused heartbeat calls `Fenced`, which
//     runs `Manager.StandDown`, ending every VM without a store write, and
//     makes `serve` return), `Cluster.RunDrain` (while its node is `draining`,
//     each paused sandbox goes to the best node by `Manager.MoveOut` →
//     `sendFiles`), and `Cluster.Serve` on `--cluster-listen`: mutual TLS
//     (certificates issued at start by the cluster CA, `tls.go`; the CA from
//     `--cluster-ca-cert/--cluster-ca-key` or the store's `cluster_settings`),
//     serving the server's handler itself (E2B's front, the console and the
//     API; forwarded requests are never routed again), `POST
//     /cluster/v1/sandboxes/{id}/move-in-extents` (the paused sandbox's files
//     as their data extents, `extents.go`; `move-in` takes a tar, from nodes
//     before extents; plain names only, zero runs written as holes;
//     `Moves.MoveIn` puts them in place and its commit is `Store.MoveSandbox`;
//     with `?wake=1` the receiver then wakes a sandbox that ran; its
//     checkpoints come first, each to `…/checkpoints/{cid}/move-in` to be
//     staged, and the move-in's `?checkpoints=` names those to take in the
//     same commit, which answers them in `X-Emberbox-Checkpoints`), and the
//     probes of liveness (`GET /cluster/v1/alive`, `/cluster/v1/probe/{id}`),
//     and a snapshot's files to a node making a copy of it (`GET
//     /cluster/v1/snapshots/{id}/files`, snapshots.go).
//   - puts `Cluster.Handler` in front of everything on `--listen`: `POST
//     /v1/sandboxes` (and E2B's `POST /sandboxes`, `/v2/sandboxes`) reads the
//     body (≤ 1 MiB) for memoryMiB, vcpu, snapshot and spreadFrom, asks
//     `Store.Place` (one read transaction over `nodes` joined with what their
//     sandboxes hold, then `cluster.Choose`: up, alive, allowed, fits, the
//     node of the snapshot a copy is made of first, then best fit by memory)
//     and sends the create to each candidate in turn (itself through
//     the API, others through the channel), passing on the first answer that is
//     not `no_capacity`; `/v1/sandboxes/{id}…` and `/v1/snapshots/{id}…` of
//     another node that is not down go to it through an `httputil.ReverseProxy`
//     (FlushInterval −1; WebSocket upgrades pass), and so do the calls
//     `cluster.Target`s name a sandbox of: E2B's traffic and control plane
//     (`e2b.Handler.Target`: the `E2b-Sandbox-Id` header, the
//     `{port}-{id}.{domain}` host, `/sandboxes/{id}…`), previews (by their
//     host, `api.Previews.Target`, checked before any path:
//     `Cluster.RouteSandbox`) and signed links (`/v1/links/{token}`, the
//     checked claims); everything else, and resources of down nodes or deleted
//     ones, is answered here from the store. A refusal of E2B's create keeps
//     E2B's error shape. The keys of signed links and of E2B's tokens are the
//     cluster's (`cluster_settings` `link-key`, `e2b-key`, made by the first
//     node), not each node's file, so what one node signs any node opens.
//   - authenticates and rate-limits at the entry node: before a Runtime API
//     call a client sent goes to another node, `api.Admit` (given to
//     `Cluster.SetAdmit`) runs the API's gate on it there (the route's key, the
//     failed-auth bucket of the client's own address, the key's bucket); a
//     refusal never reaches the owner. The forward carries the client's IP in
//     `X-Emberbox-Client-Addr`; `Cluster.Serve` (`fromPeer`) puts it in
//     `RemoteAddr` only for a request whose connection showed a cluster
//     certificate, and drops the header always; `Handler` drops it from every
//     client request. So the owner's per-address limits (and E2B's, previews')
//     count the client, never the peer node: one client failing keys through
//     node b cannot lock out the others behind b.
//
// Admin routes `GET /v1/nodes`, `POST /v1/nodes/{id}:drain|:undrain` (409
// `not_clustered` off a cluster) and `emberbox node list|drain|undrain`.
// `spreadFrom` is accepted only on a node (ids must be the caller's own).
// Images (builds) and volumes are off on a node (their files would be on one
// node only).
package cluster
