// Package catalog is the image catalog: images as named, versioned,
// content-addressed objects owned by API keys, their build queue and logs, and
// the resolution of an image reference to the disk a sandbox boots. Builds
// themselves run elsewhere (internal/recipebuild), inside sandbox VMs, through
// the Builder interface (build.go: a Job in, a Result with a raw ext4 disk
// out).
//
//   - Records (`images`, `image_tags`, `image_logs`; migration 14, store
//     `images.go`): an image is one version: id (a UUID: the SDK tells ids from
//     names by that), owner key, name, version (1, 2, 3… per owner and name),
//     state `queued|building|ready|failed|deleting|deleted`, source kind, the
//     build request as JSON, error, digest, disk path, size, minimum disk, env,
//     workdir, user, start spec, labels, public. Tags are per owner and name
//     and move: `latest` (or the build's `tags`) points at each new ready
//     version.
//   - References: an id, `name` (its `latest`), `name:tag`, `name@version`; the
//     caller's own images first, then public ones. Another key's private image
//     is `image_not_found`, as if absent. The server's own guest image is the
//     public image `default` (owner `system`, digest the recipe hash, a new
//     version when it changes); a create naming it boots exactly as a create
//     without an image (its template serves it; other images get their own at
//     their first create, see the templates of internal/sandbox). `emberbox
//     images publish ID` makes an image public; `emberbox images import FILE
//     --name N [--owner KEY] [--start-command … --ready-port N]` registers a
//     disk built elsewhere (sparse copy, digest = sha256 of its bytes).
//   - Blobs: `<data>/images/blobs/<hex digest>/rootfs.img` (0644 in 0755
//     directories: the VM's confined uid reads it through its jail's bind
//     mount). Two images of one digest share the file, so a digest is always
//     the server's own hash (an import's verified key, a build's step chain, an
//     operator's file's sha256), never an uploader's; a delete removes it once
//     no image that is not deleted names the digest (under one mutex with the
//     build that would reuse it).
//   - Builds: `POST /v1/images` validates (one source; names; start; limits no
//     larger than the server's: 30 min, 16 GiB image, 16 GiB build disk
//     (default 4 GiB: the image's disk is the build's, and every sandbox of it
//     needs as much), 2 GiB memory, 2 vCPU), records `queued` and answers 201
//     at once, unless the key already has `--quota-image-builds` (4) builds
//     queued or running (429 `quota_exceeded`, `imageBuilds`; counted from the
//     store under one mutex, so it holds across restarts and concurrent
//     creates). A build starts only if the data dir keeps `--disk-reserve-mib`
//     free beyond its build disk's size (its image's most), else it fails
//     saying so. A pool of `--image-builds N` workers (default 1) runs them:
//     the context's chunks are assembled into `images/work/<id>/context.tar.gz`
//     (sha256 and size checked; a Dockerfile's inline `files` are packed the
//     same way), the Builder runs under the build's time limit, and its disk
//     (which must be a regular file inside the build's directory) moves into
//     the blob store. With no Builder every build fails `builder_unavailable`.
//     `Job.Resolve` finds a base for the build's owner (own, then public); the
//     default image comes back with an empty `Ref` (boot it as a create without
//     an image). At start (`Recover`) a build left `building` fails with
//     "server restarted", a `queued` one is queued again, a `deleting` one is
//     finished, and `images/work` is emptied.
//   - Logs: one row per line (stream `build`, `stdout` or `stderr`), at most 10
//     000 lines of at most 16 KiB per build; past that one note and the rest
//     dropped. `GET …/logs?after=N` pages (`lines`, `nextAfter`, `done`);
//     `follow=true` streams NDJSON `{"type":"line",seq,at,stream,text}` and
//     ends with `{"type":"done","image":{…}}`, or after 5 minutes with
//     `{"type":"continue","after":N}`, which the SDK resumes from. Followers
//     wait on a per-image channel closed at each write or state change.
//   - Contexts: `POST /v1/images/context/missing {digests}` and `PUT
//     /v1/images/context/{sha256}` (≤ 1 MiB, hashed here and refused
//     `digest_mismatch` unless it is that sha256, 413 above) keep chunks per
//     key in `images/context/<hash of the key id>/<sha256>`: `missing`, a
//     build's check and its assembly read only the caller's own, so no key
//     learns what another uploaded. Per key at most `ChunkLimits.BytesPerKey`
//     (`--image-context-quota-mib`, 10 GiB) and `PerKey`
//     (`--image-context-quota-chunks`, 10 000) chunks, counted in memory (read
//     from the directory at a key's first use), 429 `quota_exceeded` past them;
//     an upload must leave `FreeReserve` (`--image-context-reserve-mib`, 2 GiB,
//     by `upload.FreeSpace`) free, else 409 `storage_full` with `retryAfterMs`.
//     A context is at most 100 MiB. A chunk neither uploaded nor asked about
//     (`missing` renews it) for 24 hours is swept (hourly), as are the shared
//     chunks of earlier versions.
//   - Delete (`:delete`) is refused with 409 `image_in_use` while a sandbox or
//     snapshot that is not deleted has its id (`sandboxes.image_id`,
//     `snapshots.image_id`); a queued or running build is cancelled. The
//     builder's own cached steps on it (snapshots of owner `system:build`) do
//     not hold it: a Builder with `ForgetImage` (the `catalog.Forgetter`
//     interface) is asked to drop them first. Not deletable by others: the
//     default and other public images (403).
//   - At a switch (`:switch-image`), the same resolution; see internal/sandbox.
//   - At create (`api/images.go`): `image` resolves to a `sandbox.ImageRef`
//     (nil for `default`); a not-ready image is 409 `image_not_ready`. The disk
//     is raised to the image's minimum when the create gave none; the image's
//     env is merged under the create's `env` (so `envNames` lists both).
//   - Start commands (`start.go`, a `sandbox.Preparer`): for a sandbox with an
//     image that has `start {command, readyPort | readyCommand,
//     readyTimeoutSeconds}`, the command is spawned as a background process (as
//     the image's user: `user`, `root`, or another account through `runuser`;
//     in its workdir; with its env) before the sandbox is `running`, and
//     readiness is polled every 200 ms: the port accepts on the guest's
//     loopback (`Guest.DialPort`), or the command exits 0; neither given:
//     started is ready. Bounded by the timeout (default 60 s). Not ready in
//     time, or the command exited first: the sandbox still runs, and the report
//     says so; either way an event records it (`start_ready` or
//     `start_not_ready`, with the command and the time). The report `start:
//     {command, ready, readyMs, error}` is in the create's answer and a `GET`
//     of the sandbox while the server keeps it in memory (at most 10 000, lost
//     at a restart; the SDK keeps the create's). The preparer runs again after
//     a restart of the server: a start command already running is not spawned
//     twice; build sandboxes (an internal owner, `system:…`) never run it. The
//     image's workdir and user apply to its start command only; other commands
//     run as `user` in `/workspace` as in every sandbox.
package catalog
