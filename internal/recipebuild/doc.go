// Package recipebuild builds images (internal/catalog.Builder): a recipe or a
// Dockerfile compiled to steps, run as root in a build sandbox of ours (never
// on the host), each step's disk cached as a disk snapshot by the content of
// the steps up to it, and the last disk exported as the image's raw ext4 root
// disk.
//
// `Builder` implements `catalog.Builder` (the contract in
// `internal/catalog/build.go`): the catalog hands it a `Job` and a `LogSink`
// and gets back a raw ext4 root disk, its digest and its configuration.
//
//   - Compile, before any VM: a recipe becomes one stage of steps in a fixed
//     order: `APT` (`apt-get update && apt-get install -y
//     --no-install-recommends`), `PIP` (`python3 -m pip install
//     --no-cache-dir`), `NPM` (`npm install --global`), `GO` (`go install`,
//     GOBIN `/usr/local/bin`), `FILES`, `WORKDIR`, then each command as `RUN`.
//     Package names go to the tools as argv (never through a shell) and must
//     match a conservative pattern (no leading `-`). Recipe files are owned by
//     root, except under `/workspace` and `/home/user` (owned by `user`). A
//     Dockerfile is parsed by BuildKit's own parser and instruction package
//     (`github.com/moby/buildkit/frontend/dockerfile/{parser,instructions,shell}`):
//     global and stage `ARG` with build args, `FROM` an image of ours (by name,
//     `default` or none for the server's image), an earlier stage, or an OCI
//     reference (only through the `Importer` hook; without it a 400 naming the
//     line); `RUN` (shell and exec forms; build args and `ENV` in its
//     environment), `COPY`/`ADD` of local sources from the context (wildcards,
//     `--chown`, octal `--chmod`) and `COPY --from=<stage>`, `ENV`, `WORKDIR`,
//     `USER` (root and `user` directly, other users through
//     `runuser`/`setpriv`), `LABEL`; `CMD`/`ENTRYPOINT` compose the image's
//     start command (Docker's rules), a `HEALTHCHECK CMD` its ready command;
//     `--target` picks the last stage and stages it does not need are dropped.
//     `EXPOSE`, `VOLUME`, `STOPSIGNAL`, `MAINTAINER` are ignored with a log
//     line. Refused with `invalid_request` naming the line: `ONBUILD`, `SHELL`,
//     `RUN --mount`/ `--network`/`--security`/`--device`, heredocs, `ADD` of a
//     URL or of an archive (Docker would unpack it: COPY it and `RUN tar`),
//     `COPY --exclude`/`--parents`, `COPY --from=<image>`, `FROM scratch`, a
//     platform other than linux/amd64.
//   - Context: `ContextDir/context.tar.gz`, hostile. Every entry name is
//     cleaned and refused if absolute or leaving the context; only files,
//     directories and symlinks are taken; at most 200 000 entries and 4 GiB
//     unpacked. What one COPY takes is written to a fresh tar of its own
//     (entries relative to the directory it lands in, mode from the source or
//     `--chmod`) whose sha256 goes into the step's key; the agent's unpack
//     (`file.unarchive`, `os.Root`) checks names and links again.
//   - Run: each stage runs in a build sandbox created through the manager
//     (`recipebuild.Manager`, which `*sandbox.Manager` satisfies) as owner
//     `system:build` (no API key, so no tenant lists it; admission counts it),
//     egress `{internet: true}`, shape from `Job.Limits` (default 2 vCPU, 2
//     GiB, 4 GiB disk, at least the base's `MinDiskMiB`), lease = the build's
//     time left. Steps run as root through `Guest.Exec` with the output
//     streamed line by line to the log (`stdout`/`stderr`, lines cut at 16
//     KiB); a non-zero exit fails the build with `step N/M <instruction>: exit
//     code X`. Copies go in with `Guest.Unarchive` as root, then `chown`. What
//     a later stage copies `--from` a stage is read out of that stage's sandbox
//     (`Guest.Archive`/`ReadFile`) when it ends, re-checked and staged on the
//     host like a context copy. Sandboxes are deleted when their stage ends;
//     the whole build is bounded by `Job.Timeout` (default 30 min).
//   - Cache: key₀ = sha256(base image digest); keyₙ = sha256(keyₙ₋₁, step text,
//     its env, cwd and user, the digests of the archives it copies). Every
//     input is hashed by the server (an imported base's digest is its verified
//     key; archives are hashed as they are packed), so no uploader's claim
//     names a cached step. After each step that ran, the guest `sync`s and the
//     sandbox's disk is captured as a disk snapshot (owner `system:build`,
//     retention 365 days) recorded in `build_cache` (migration 12: key,
//     snapshot, created, used; `store/buildcache.go`). A build starts from the
//     longest cached prefix (`CreateSpec.SnapshotID`), so a fully cached build
//     starts no VM at all; entries past `Config.CacheEntries` (default 50) are
//     evicted least recently used first, their snapshots deleted; an entry
//     whose snapshot expired is forgotten. Cached snapshots are overlays of
//     their base image's disk and record its id (`snapshots.image_id`);
//     `Builder.ForgetImage(ctx, id)` drops them, for the catalog to call before
//     it deletes an image. Build sandboxes carry their base's image id too, so
//     a `Preparer` that runs an image's start command must skip owner
//     `system:build`. With `Job.Cache` off, nothing is looked up or recorded,
//     and the build's own snapshots are deleted when it ends.
//   - Export: the last step's snapshot becomes the image's disk through
//     `Manager.ExportDisk` and the optional driver interface `vmm.DiskExporter`
//     (QEMU: `qemu-img convert -O raw` of the snapshot's `disk.qcow2`, which is
//     flattened onto its base, so the result stands alone; sparse where zero),
//     written as `WorkDir/rootfs.img` mode 0644. Its size is the build disk's
//     (`MinDiskMiB`; the guest grew its ext4 to it at boot), `SizeBytes` what
//     it takes on the host, refused past `MaxImageMiB`. Digest = `sha256:` +
//     the last key. Env = base's, the stage's `ENV`/recipe env, then `Job.Env`;
//     `Job.Start` overrides the Dockerfile's start, `NoStart` drops it.
//   - Imports: `SourceImage`/`SourceArchive` jobs and `FROM` a reference no
//     image of ours has go to `Config.Import` (`recipebuild.Importer`), which
//     returns an `catalog.Result` (a kind image/archive job's answer as is; for
//     `FROM`, the base the build sandboxes boot, which must outlive the build
//     because cache snapshots are overlays of it); without one they are refused
//     with `invalid_request`.
//   - Restart: `Builder.Recover` (at start, before builds run) deletes the
//     build sandboxes a cut build left and the `system:build` snapshots no
//     cache entry names; a build's own snapshots (cache off) have a one-day
//     retention in case it is never called.
//   - Wiring: `recipebuild.New(recipebuild.Config{Manager: mgr, Cache: st,
//     Import: importer, Logger: log, DefaultDigest: …})`, then `Recover`.
package recipebuild
