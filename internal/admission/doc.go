// Package admission keeps the ledger of what the server has promised its
// sandboxes (vCPUs, memory, disk and boot slots) and volumes (disk) and decides
// whether one more fits: on the host, within the free space of the data dir's
// filesystem, and within its key's quota. The sandbox manager holds a claim
// from the moment it records a sandbox until the sandbox is stopped or deleted,
// the volume service from a volume's create to its delete; the ledger is in
// memory and rebuilt from the store's live sandboxes and volumes at every
// start.
//
// `Ledger` (`Reserve` checks and holds a `Claim`, `Booted`, `Release` (once),
// `Restore` without checks, `Total`, `Owner`); `Capacity`, `Quota`, `Config`
// (per-VM overhead, disk and memory probes with their reserves); `HostCPUs`,
// `HostMemoryMiB`, `MemAvailableMiB`, `DiskFreeMiB` read the host
// (`/proc/meminfo`, cgroup v1/v2 limits, `statfs`). It imports only `errdefs`.
//
// The server promises only what it has (flags in README "Limits"; why in
// DESIGN.md D10).
//
//   - Ledger. One `Claim` per live sandbox: owner, vCPUs, memory, disk, and a
//     boot slot while it boots. `Manager.Create` reserves it before inserting
//     the record (and releases it if the insert fails). The manager's one
//     update, where every transition passes, keeps the ledger in step with the
//     record: `running` gives back the boot slot, `stopped` and `deleted` give
//     back everything. `Release` is keyed by sandbox id and acts once, so a
//     stop, a failed boot, a delete, a lost VM at restart, or all of them,
//     release exactly once. `stopping` and `deleting` still hold: the VM runs
//     until it has ended.
//   - Restart. The ledger is memory only. `Recover` first `Restore`s a claim
//     for every sandbox the store lists as live (booting if `starting`),
//     without checks, then reattaches; sandboxes found gone are released as
//     they are marked stopped.
//   - Host checks (`no_capacity`, errdefs conflict → 409, `retryAfterMs` 2 s
//     for boot slots, 10 s otherwise, and `Retry-After`): boots <
//     `--max-concurrent-boots`; vCPUs ≤ `--max-vcpus` (when capped);
//     Σ(memory + overhead) of sandboxes not paused ≤ the nominal memory
//     capacity; the host's MemAvailable, less what admitting the sandbox
//     asks, keeps the host reserve (other programs on the host count
//     too); the data dir's free space (`statfs`) − every live disk's full
//     size ÷ the disk overcommit − the new disk ≥ `--disk-reserve-mib`
//     (conservative: a live overlay's used part counts twice). The message
//     names the resource, not the host's figures.
//   - Two models of what a sandbox asks of MemAvailable (`Config.Measured`,
//     `--admission`). Strict: its whole memory and overhead, with nominal
//     ratios of 1 (vCPUs 8 per core), so the host never overcommits.
//     Measured (the default): what it is expected to take plus what every
//     running sandbox is expected to take beyond what the host already
//     shows: `StartMiB` until its VM's first reading (`Ledger.Measured`,
//     fed by the sandbox meter at every reading: as the VM starts, every
//     interval, at reattach), then `HeadroomMiB`, each at most what the
//     sandbox's size leaves (its cgroup ceiling stays its nominal size).
//     vCPUs are uncapped and the nominal ratios (memory 32, disk 16) are a
//     ceiling beside it and what a cluster node offers placement. Readings
//     lag by up to an interval, so a sandbox that grew since shows in
//     MemAvailable and in its headroom at once: conservative. What keeps
//     a host safe when sandboxes grow together is the sandbox manager's
//     memory-pressure pause (`--memory-floor-mib`) and MemAvailable's
//     refusal of creates and wakes meanwhile. Guest memory files are not
//     promised disk in either model (only overlays are): they grow as
//     guests touch memory, and the sandbox manager's disk-pressure pause
//     (`--disk-floor-mib`) stops every growing sandbox before the data
//     dir fills, as the disk check here refuses creates and wakes.
//   - Quotas per key, checked first (`quota_exceeded`, conflict with
//     `codeStatus` 429, details `quota`, `limit`, `used`, `requested`, a hint
//     naming the `serve` flag that raises it): live sandboxes, vCPUs, memory,
//     disk (sandboxes' disks and volumes together), boots, volumes and their
//     size. Configured on `serve` for every key alike; nothing per key is
//     stored.
//   - Volumes hold a claim too (`Claim.Volume`: disk alone, its full size, as
//     the sparse file grows to it while guests write), from create to delete,
//     grown by `Replace` at a resize; they are no sandbox (no slot, no VM
//     overhead). `volumes.Service.Recover` restores them at start, beside the
//     manager's `Recover`.
//   - Build VMs belong to `system:build` (tenants never list them) but carry
//     `emberbox.quota/key`, the key whose image they build; `claim` charges
//     that key (the label counts only on `system:` owners). Builds queued or
//     running are capped per key (`--quota-image-builds`, counted in the store
//     at each create, 429 `imageBuilds`).
//   - Paused sandboxes hold only their disk (`claim`), and no VM overhead: a
//     wake grows the claim back with `Ledger.Replace`, which checks the whole
//     sandbox as if the disk claim were given back first and leaves it held
//     when it refuses.
//   - Per sandbox: `sandbox.Limits` (max vCPUs, memory, disk, lifetime),
//     checked by the manager, refused as `invalid_request` with
//     `details.issues` like the API's own validation.
//   - Rate limits (`internal/api/ratelimit.go`, `serveRoute` → `gate`): token
//     buckets (`golang.org/x/time/rate`) per key id, one for GET/HEAD and one
//     for everything else; public routes per client address. Before a key is
//     looked up, an address whose failed-authentication bucket is empty is
//     refused, and each 401 takes a token, so a wrong-key flood costs no
//     hashing and no database read. Addresses are the connection's (IPv6 by
//     /64), never a forwarded header (in a cluster, a peer node's
//     `X-Emberbox-Client-Addr`, believed from cluster certificates only). A
//     bucket idle for its refill time is forgotten (a new one would be
//     identical); at most `MaxTracked` (10 000) per kind are kept, callers
//     beyond share one bucket. Over the rate: 429 `rate_limited`,
//     `retryAfterMs` until the next token, `Retry-After`. E2B's front (control
//     plane and sandbox traffic) counts in the same buckets through
//     `api.RateLimiter` (`AuthBlocked`, `AuthFailed`, `Allow`), answering 429
//     in E2B's shape.
//   - Answers with a `Retry-After` are never stored for an `Idempotency-Key`:
//     the SDK retries them with the same key, and the retry must run.
package admission
