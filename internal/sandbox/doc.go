// Package sandbox manages the lifecycle of sandboxes: creating their VMs,
// tracking their state in the store, enforcing leases, reattaching after a
// restart of the server, and relaying calls to their guest agents.
//
// # Files
//
// `Manager` is the state machine: the live instances (a VM and its guest
// client per sandbox with a VM), the transitions (every one through
// `update`), the per-sandbox VM lock, and recovery; `Sandbox` is the durable
// record. What is not a transition is a collaborator with its own state and
// a small unexported interface for what it needs of the manager (a `…Host`):
// the exported ones are fields of the manager (`Meter`, `Snapshots`,
// `Switcher`, `Previews`, `Moves`, `Reaper`, `Networks`, `Templates`); the
// unexported ones serve its transitions: `gates` (the per-VM egress gates),
// `conduct` (a guest's warnings and violations), `guestLink` (connecting to
// and detaching from a guest), `guestCalls` (the guest of a call, woken or
// reconnected), `volumeHooks`, `outcomes` (the Observer), `waiters` (the
// channel `WaitFor` sleeps on), `envMemory` (env values, memory only) and
// `sandboxFiles` (a sandbox's directory and VM spec). `states.go` is the state table
// (`States()`: each state, what the API shows, its status, whether it is
// terminal, and the refusal a guest call gets in it); `types.go` holds stop
// reasons, `CreateSpec`, `ListOptions`, limits. Around the state machine, in
// files named for them: the boot path shared by cold boots, template copies,
// restores and wakes; templates; the meter, told of every transition; previews,
// moves, switches of image, snapshots and forks as collaborators; the lease
// clock and idle pause; recovery; egress gates; pause and wake (and the
// per-sandbox VM lock that pause, wake, restart, snapshot, a switch of image
// and the end of a stop or delete take); restart and update; stopped-disk
// retention. The guest handle a caller gets and its types are internal/guest's.
// The manager owns every goroutine it starts (a base context and a wait group;
// `Close` cancels and waits; nothing starts after `Close`).
//
// # A create
//
// `Manager.Create` checks the spec against the operator's `Limits` (size,
// lifetime: 400 naming the field), reserves its claim in the admission ledger
// (409 `no_capacity` or 429 `quota_exceeded`, nothing recorded), inserts the
// record in `starting` (env names only; values go to the guest, never to the
// store) and, in the same transaction, stores its id with the request's
// Idempotency-Key; registers an `instance`, starts the boot in an owned
// goroutine (a cold boot; with a template of its shape, a copy of the template;
// with `snapshot`, a copy of the snapshot: internal/vmm/qemu, "Saving a guest")
// and returns; the create then waits up to `Prefer: wait=N`.
//
// A cold boot makes up to 2 attempts, each bounded by `--boot-timeout` (default
// 90 s). A failed attempt's console is kept as `console-attemptN.log`.
//
// Then the host connects: `DialGuest` (retries every 50 ms until QEMU made the
// socket) → `guest.Handshake` (Hello/Ready nonce) → yamux → `Info`; then
// `Configure{Env}`. All the ways in (cold boot, template and snapshot copies,
// restores, wakes) share this one boot path.
//
// Record → `running`, `readyAt`, `expiresAt = now + timeoutSeconds`; event
// `ready`; a watcher follows the VM. Two failed attempts → `stopped`
// (`start_failed`).
//
// # A guest call
//
// `Manager.Guest` read the record once (owner; state from the state table,
// below), found the live `instance` and its connected client (a call waits up
// to 15 s for a reconnecting one, then 503 `guest_busy`); the handler calls
// `Guest.Exec` = `guest.Client.Exec`.
//
// # States and leases
//
//	create ─► starting ──ready──► running ──stop / lease end──► stopping ──► stopped ──restart──► starting
//	            │  └─stop──► stopping      │  ▲   VM exits by itself ──► stopped (vm_exited)
//	            │                          │  │
//	            │      pause / idle / lease end (pause)      wake / autoWake call
//	            │                          ▼  │
//	            │                       pausing ──saved──► paused ──wake──► resuming ──renewed──► running
//	            └─ two failed boots ──► stopped (start_failed)      ▲            │ failed: paused if the saved
//	any state but deleted ──delete──► deleting ──VM ended, files removed──► deleted  state is there, else stopped
//	create {snapshot} ─► starting ──clone, resume (memory) or boot (disk)──► running
//	running ──switch-image──► pausing ──saved──► starting (new image) ──► running
//	                                                  └─ failed ──► pausing ──► resuming (old VM) ──► running
//
// The states, what the API shows for each, and what a call into the guest gets
// in each come from one table, `sandbox.States()` (`states.go`);
// docs/ARCHITECTURE.md carries it, kept equal by a test. The API answers the
// class `conflict` with 409 and `not found` with 404, in the one error shape,
// with `details.state` set to the state the API shows.
//
// Every transition goes through the manager's one update →
// `store.UpdateSandbox`: the committed record is read, changed and written in
// one IMMEDIATE transaction, so two transitions never interleave (an `:extend`
// cannot write `running` back over a stop that came between its read and its
// write); then only the waiters of that sandbox are woken. Stop reasons:
// `requested`, `lease_expired`, `deleted`, `start_failed`, `vm_exited`,
// `lost_on_restart`, `guest_protocol_violation` (see "A hostile guest" below);
// a stop under way keeps its own reason. `stop` marks `stopping` synchronously;
// an owned goroutine (`endVM`) cancels the boot and waits for it, closes the
// client and the gate, `mach.Stop` (15 s bound), and records `stopped`.
// `Delete` first records `deleting` (the API shows `stopping`), then ends the
// VM, removes `sandboxes/<id>/` and records `deleted` (then `Get` is 404); each
// step can be repeated, so a crash anywhere is finished by the next start.
// `watch` follows a running VM: `mach.Done` → `finish(vm_exited)`; a dropped
// yamux session only → reconnect (fresh handshake, 5 s per try, backing off
// with jitter; see "A hostile guest" below).
//
// Lease clock: `Reaper.Run` ticks every second; `ExpireLeases` takes each live
// `running` sandbox with `expiresAt ≤ now` and stops, deletes or pauses it per
// `onLeaseEnd`, reason `lease_expired`; and pauses each running sandbox that
// has been idle for its `idlePauseSeconds`. Work is activity: every call into a
// guest goes through `Manager.Guest` (every exec, file, archive, process,
// input, terminal, watch, interpreter and tunnel route, E2B's envd traffic,
// `:update`), which holds the sandbox busy until the call's context ends
// (`instance.hold`: a count of calls in flight, released by
// `context.AfterFunc`), so an exec, an attached process's output or input, a
// terminal, a tunnel, a file or archive transfer, an interpreter run and a
// long-poll watch keep their sandbox awake for their whole duration; the idle
// clock starts when the last of them ends. A preview's connections count by
// their traffic (`activeConn`, marked at most once a second) and hold the
// sandbox only while being dialled, since the proxy's transport keeps them
// pooled. The idle pause looks again inside its store transaction, so a call
// that began after the sandbox was found idle keeps it running. Activity is
// kept in memory: after a restart the idle time starts again. A lease
// (`timeoutSeconds`) still ends on time whatever is in flight: `onLeaseEnd`
// stop or delete ends the VM, and a call in flight then ends with the sandbox
// (an exec answers 409 `not_running` or, if the VM went first, 503
// `guest_unavailable`; a streamed exec ends its stream without an exit event);
// `pause` saves the VM with its processes, so a command keeps running after a
// wake, but the call that watched it ends with 409 `sandbox_paused` (attach
// again, or read the process's output by its id). A client that needs more time
// calls `:extend` first. Memory pressure pauses a sandbox with a call in flight
// only when every candidate has one; disk pressure pauses every sandbox whose
// files grow, with a call in flight or not, as a full disk would end its VM. A create without `timeoutSeconds` has no
// lease and `idlePauseSeconds` 300; a `persistent` sandbox has neither.
// `expiresAt` is set when the sandbox becomes running (and again at each wake:
// `timeoutSeconds` from then; a paused sandbox has no lease); `:extend` moves
// it to now+seconds (≤ 1 h ahead) and never shortens it, and does nothing to a
// sandbox without a time limit. `starting` never expires.
//
// Pause (`pause.go`): `update` running → `pausing` (`pausedAt`), fault point
// `pause.recorded`; then, in an owned goroutine under the sandbox's VM lock:
// the instance's watcher and guest connection end, `Machine.Pause` saves
// memory, devices and disk in the sandbox's dir and ends the VMM
// (`pause.saved`), the gate closes, and `update` pausing → `paused` (VM record
// and lease cleared); the admission claim shrinks to the disk alone
// (`Ledger.Restore`). A pause that fails with the VM still running lets it run
// (`Continue`) and records it running again; one that ended the VM is `paused`
// if `Driver.Saved`, else `stopped` (`pause_failed`). Pausing a pausing or
// paused sandbox answers it.
//
// Wake: under the VM lock, `Ledger.Replace` grows the claim back to the whole
// sandbox with a boot slot (no room: 409 `no_capacity`, still paused); `update`
// paused → `resuming` (`wake.recorded`); then in an owned goroutine: a new
// instance and egress gate from the stored policy, `Driver.Resume` (the state
// loaded, the guest still stopped; `wake.resumed`), the VM record saved,
// `Machine.Continue` (the state consumed, then the guest runs: a crash before
// it leaves a VM that never ran and a state to resume again), a connection on a
// new socket every 2 s until the agent answers, `Client.Renew` with 32 fresh
// random bytes and the host's clock (an agent that answers `unknown_method` is
// logged and let run), then `update` → `running` with a new lease, and `watch`.
// A failed wake pauses a VM that runs again if it can, and records the sandbox
// `paused` if its saved state is there, else `stopped` (`wake_failed`). A guest
// call to a `paused` sandbox with `autoWake` wakes it and waits (through
// `pausing` and `resuming` too); without `autoWake` it gets 409
// `sandbox_paused`. Waking a running sandbox is 409 `not_paused`.
//
// # Templates
//
// Templates (`templates.go`, `--templates`, default on): at start the server
// builds the template of the default shape in the background: a VM booted
// outside any sandbox (`templates/<hash of boot files and CA
// bundle>/<shape>.build`), admitted like a sandbox but for a boot slot,
// configured with the CA bundle, run through a first command's path (so copies
// find it in their page cache), detached and snapshotted with memory into
// `templates/<hash>/<shape>` (marked `template.ok` last), then ended. A create
// with no snapshot whose shape has a template is made as a copy of it (`Clone`,
// `Resume`, `Continue`, `Renew` with its own identity, `Configure` with its
// env); if that fails it boots. A create of another shape boots, as does one
// that comes before the template is ready (which starts its build again if it
// is not under way; a failed build is retried after 10 minutes). A crash
// mid-build leaves its VM, ended at the next build.
//
// Custom images get templates too, keyed by their root disk (a blob, whose path
// names its content) besides the boot files and CA: `templates/images/<hash of
// the disk's path>/<hash of boot files, disk and CA>/<shape>`, the shape being
// the image's default one (default vCPUs and memory, disk `max(4096, the
// image's minimum)`). They are made lazily: the image's first create of that
// shape boots cold and, once booted (not beside its boot, which would slow it),
// starts the build (one build at a time, across all images and the default one;
// a create that finds another build under way queues its template, up to 8
// waiting, built in turn as each build ends). Nothing is built when an image
// build finishes: a template costs a boot and a few hundred MiB, and many
// images (bases, old versions) never serve a sandbox. The template VM boots the
// image's disk and gets only the CA bundle, so nothing of the image's
// configuration runs in it: the image's env comes with the create's
// `Configure`, and its start command (the catalog's Preparer), workdir and user
// apply per command after the restore, as after a boot. A copy's disk is an
// overlay over its template's disk (snapshots are flattened onto the image's
// disk, moves carry the template's disk along), so a copy's directory names its
// template in `template.use`, written while the create holds a pin on the
// template and removed if the copy falls back to a boot. At most
// `--image-templates` (default 8; 0: none) custom images' templates are kept:
// before a build, the least recently used (`template.ok`'s mtime, touched at
// each copy) that no pin or `template.use` names (a sandbox's, or one a switch
// of image keeps aside in `<id>.switch/old/`) is removed; if all are in use the
// create boots and no build is tried for a minute. When the catalog releases an
// image's disk (its last image of that digest deleted, so no sandbox or
// snapshot of it is left) it calls `Templates.RemoveTemplates`
// (`catalog.Service.SetTemplates`, set in `serve`), which removes the disk's
// templates; a build of them under way drops its result. At start, templates
// whose disk (named in `templates/images/<hash>/rootfs`) is gone are swept. The
// default image's templates are never removed by the server.
//
// # Restart, update and snapshots
//
// Restart (`lifecycle.go`): a `stopped` sandbox whose disk the retention has
// not removed (else 409 `disk_removed`) is admitted as a create and booted with
// `Spec.KeepDisk`; the environment's values are sent again if this process
// still knows them (they are never stored; otherwise the record's `envNames` is
// cleared). The retention removes a disk only under the sandbox's VM lock and
// only if it is still stopped. Update changes name, labels, env (the whole set
// sent to the guest's `configure`; refused with 409 `env_unavailable` when this
// process does not know the values), `autoWake`, `idlePauseSeconds`,
// `persistent`, `timeoutSeconds` (from now; 0 none) and `onLeaseEnd`.
//
// Snapshots (`snapshots.go`, `fork.go`): `:snapshot` records the snapshot
// `capturing`, has `Machine.Snapshot` write `snapshots/<id>` under the VM lock
// (a paused sandbox is woken for it and paused again), and answers it `ready`
// or `failed`. A create with `snapshot` takes the snapshot's shape, is admitted
// as any create, and boots by `Driver.Clone` into its own dir, then `Resume`
// and `Renew` with its own seed, clock, hostname (its name or id), machine-id
// and boot id (memory), or `Start` with `KeepDisk` (disk). `:fork` is a memory
// snapshot and `count` (1..10) such copies, answered once they run; the
// snapshot is deleted after unless `keepSnapshot`. A copy's disk is built on
// its snapshot's, so a deleted (or expired: `retentionDays`, 1..365, default 7,
// enforced each minute by `RunDiskRetention`) snapshot disappears from its
// owner at once but its files stay until no sandbox made from it has a disk.
// Another key's snapshot is 404. A capture a stop of the server cut short is
// recorded `failed` by `Recover` (`FailInterrupted`).
//
// Checkpoints (`checkpoints.go`, D22): a memory snapshot whose `CheckpointOf`
// names its sandbox, taken by the same capture (`wait:false` runs it in an
// owned goroutine and answers `capturing`), listed under the sandbox only,
// its memory a difference over the sandbox's newest whole checkpoint where
// the driver can (`vmm.DeltaSnapshotter`, `BaseID`; the base's files stay
// while a difference over it has files), bounded by `CheckpointLimits`
// (per sandbox, oldest pruned; per key, bytes)
// and deleted in `finishDelete`; `Manager.Checkpoints` is their collaborator.
// `RestoreCheckpoint` pauses a running
// sandbox, then under its VM lock has `vmm.Restorer` copy the checkpoint's
// files in (the disk whole, so nothing depends on the checkpoint after), and
// wakes it; a wake between the two is paused again. `BranchCheckpoint` makes
// copies as `:fork` does. No lease passes `createdAt + --max-lifetime`
// (default 24 h): `ready` cuts the first lease there, `:extend` stops there,
// and an `:extend` of a lease that already ends there is 409
// `lifetime_exceeded`.
//
// # A hostile guest
//
// Violations and reconnects (`internal/sandbox/guestsafety.go`): a session that
// ends within 10 s of its handshake (or before answering `info`) is a violation
// too. 10 violations within 10 minutes are "repeated": the sandbox is stopped
// with reason `guest_protocol_violation`; each violation is an event
// `guest_protocol_violation` naming the method and what the guest did (the
// first 20 of a run), and one more says it is stopping. Reconnects back off:
// after a failed attempt or a short session the next waits a random time in
// [d/2, d], d doubling from 250 ms to 10 s (failed attempts wait at least 1 s).
// Warnings a guest can cause are logged at most 10 a minute per sandbox, then
// one line counts those left out.
//
// # Switching a sandbox's image
//
// `POST /v1/sandboxes/{id}:switch-image {image, keep: "workspace"}`
// (withruntime's `Sandbox.switch_image`) moves a sandbox to another image's
// disk and answers once it runs there, whatever `Prefer: wait` says (the SDK's
// 300 s timeout covers a TCG switch). The API checks the body (`keep` other
// than `workspace`: 400), the sandbox (another key's: 404), then the image as a
// create does (`ForCreate`: 404 `image_not_found`, 409 `image_not_ready`;
// `default` is the server's image; images off, as in a cluster: 501
// `images_unavailable`). The manager refuses an image whose minimum disk is
// over the sandbox's (400) and a sandbox whose env values the server no longer
// knows (409 `env_unavailable`). A paused sandbox is woken and a stopped one
// restarted first: its `/workspace` is read from a running guest. Then, under
// the sandbox's VM lock:
//
//  1. `/workspace` is read as root into `sandboxes/<id>.switch/workspace.tar`
//     (plain tar, at most the sandbox's disk + 64 MiB; volumes mounted under
//     `/workspace` left out), beside `switch.json` naming the old and new
//     image. A failure here changes nothing (409 `switch_undone`).
//  2. Its volumes are flushed and the VM paused as a pause does (record
//     `pausing`; its memory saved, the ledger claim kept whole).
//  3. `sandboxes/<id>/` (saved state and disk) moves to
//     `sandboxes/<id>.switch/old/`; the record goes `starting`, still naming
//     the old image.
//  4. A new VM boots a fresh overlay of the new image (two tries, as a create),
//     with the env values; the tar is unpacked into `/workspace` as root and
//     given to `user` (`chown -hR`: the agent's unpacking does not keep
//     owners); its volumes are mounted again at the same paths
//     (`VolumeReattacher`); the preparers run (the new image's start command).
//  5. Commit: one update sets `ImageID`/`Rootfs` to the new image and the state
//     `running` (a new lease, `readyAt` now: metering's interval opens at the
//     new VM, as a wake's). `switch.json` goes, then the old files; event
//     `image_switched {from, to, workspaceBytes, switchMs}`.
//
// A failure in 3-5 undoes it: the new VM ends, the record goes back to
// `pausing`, `old/` back to `sandboxes/<id>/`, and the old VM resumes from its
// saved memory as a wake does (processes and all); event `switch_undone`,
// answer 409 `switch_undone` with the cause. At start, `Recover` undoes a
// switch a crash cut short while `old/` is aside and `switch.json` is there
// (any new VM ended, files back, the record on the old image and `pausing`, so
// its saved state makes it `paused`); without them it removes the leftover
// directory. Images in use are counted from `sandboxes.image_id`, so after a
// switch the old image can be deleted and the new one cannot. A copy of a
// snapshot may switch: its new disk is over the new image alone (the snapshot
// stays referenced until the sandbox is deleted).
//
// # Moving a paused sandbox to another node
//
// `Moves.MoveOut` takes the sandbox's VM lock (no pause, wake or end of a
// stop or delete comes between), checks it is paused here with no volumes
// (`not_paused`, `not_on_node`, `volumes_attached`), charges its kept disk up
// to now, and hands the record and the files to the cluster's sender. Only if
// that succeeds does the sandbox stop being this node's: its claim in the
// ledger is released, its environment values (memory only) forgotten and its
// directory removed; otherwise it stays paused here. `Moves.MoveIn` on the
// new node checks the id and that the node has room for the disk (not the
// owner's quota: the move adds nothing to it), has the receiver write the files
// into `incoming/<id>-*/`, renames that into `sandboxes/<id>/`, calls `Moved`,
// and runs the cluster's commit (the record's owner switches there) last; any
// failure removes what it made and releases the claim, and a start removes what
// a crash left in `incoming/`. A sender that dies after the commit but before
// removing the directory removes it at its next start
// (`Moves.RemoveMovedAway` asking `Store.MovedAway`, before `Recover`). A
// wake on the new node is then an ordinary wake; one on the old node is refused
// (`not_on_node`, as a sandbox paused on a node always holds its disk in that
// node's ledger) rather than finding no saved state and recording the sandbox
// stopped. Drivers without `vmm.Mover` refuse both (`move_unsupported`). The
// fake driver (`vmmtest`) moves its saved-state marker and disk; managers of
// two data dirs sharing one fake driver and one store are two nodes in the
// tests.
//
// # Restart safety
//
//   - QEMU runs under `Setsid` via `exec.Command` (not CommandContext): it
//     survives the server and terminal signals; `serve` does not stop VMs. In
//     its own pid namespace it is still found by its host pid; the record keeps
//     its uid, so a restarted server does not hand that uid out while it runs.
//   - `Recover` (before HTTP) loads every non-terminal sandbox. `qemu.Attach`
//     accepts the VM only if the recorded pid has the same `/proc/PID/stat`
//     start time (field 22: against pid reuse; zombies rejected), its cmdline
//     contains `emberbox-<id>`, and `pidfd_open` works; polling the pidfd
//     closes `Done`. The console copy resumes. Otherwise →
//     `stopped/lost_on_restart`.
//   - By recorded state: `running` → `watch` again (reconnects; the handshake
//     skips stale bytes); `stopping` → stop finished; `starting` →
//     `resumeBoot`: created with env → stopped `start_failed` (values were
//     never stored); else waits for the agent up to one full `BootTimeout`, no
//     retry, then `running`.
//   - Leases that ended meanwhile are enforced on the first tick.
//
// Pause and wake, by recorded state (each step is recorded before the next
// begins, so a `kill -9` anywhere leaves the old state or the new):
//
//	| recorded | VM (Attach) | saved state (`Driver.Saved`) | Recover does |
//	|---|---|---|---|
//	| `pausing` | runs | any | `Machine.Pause` again (finishes the pause) → `paused` |
//	| `pausing` | gone | yes | → `paused` |
//	| `pausing` | gone | no | → `stopped` (`lost_on_restart`) |
//	| `paused` | — | — | nothing: holds its disk in the ledger |
//	| `resuming` | runs | yes | the VM is stopped → `paused` (the saved state is the truth) |
//	| `resuming` | runs | no | `Continue`, connect, `Renew` → `running` |
//	| `resuming` | gone | yes | → `paused` |
//	| `resuming` | gone | no | → `stopped` (`lost_on_restart`) |
//
// A crash between `Driver.Resume` returning and the VM record being saved
// leaves a VM no record names: it is ended as a stray, and as its saved state
// was used, the sandbox is recorded stopped.
//
//   - A clean shutdown (SIGTERM) drains HTTP, then `Manager.Close` ends the
//     watchers and guest connections without stopping any VM; a boot it
//     interrupts leaves its VM for the next process to resume, as after a
//     crash.
//   - A VM no record names (a crash between starting QEMU and saving its
//     record) is found by its exact `-name emberbox-<id>` argument and killed
//     when its sandbox is marked lost (`vmm.StrayKiller`, implemented by the
//     QEMU driver).
//   - A sandbox recorded `deleting` is deleted by `Recover` whether its VM
//     still runs (it is stopped first) or not. (A delete a server from before
//     the `deleting` state left half done, `stopped` with reason `deleted`, is
//     finished too.)
//   - A create cut short by a crash is never made twice: its Idempotency-Key
//     was stored with the sandbox's id in the transaction that recorded it, and
//     at startup such pending keys become answers that render that sandbox
//     (`ResolvePendingIdempotency`); keys whose request recorded nothing are
//     released for the retry to run.
//   - The admin key file is written (temp file, fsync, rename) before its row.
//   - Upload staging files left by a crash are removed at start and by the
//     periodic sweep.
//   - The kill tests (`internal/integration/kill_test.go`) SIGKILL the server
//     at each `faultpoint` of create and delete and check all of the above.
//   - A stop or delete waits for a boot in progress to return before stopping
//     its VM, so no VM outlives a sandbox recorded as stopped.
package sandbox
