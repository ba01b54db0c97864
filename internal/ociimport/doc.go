// Package ociimport imports OCI and Docker images as sandbox root file systems.
// Open reads an image from a registry, an OCI layout directory or a tar archive
// on the host (an OCI layout packed as tar, or `docker save` output) with
// github.com/google/go-containerregistry; Flatten turns its layers into one tar
// of the final file system with whiteouts applied and every path checked;
// BuildRootfs unpacks that tar as root inside a build VM, adds the sandbox user
// and makes the ext4 image there, so nothing from an image is ever unpacked on
// the host.
//
// Turns an OCI or Docker image into a sandbox rootfs, with
// `github.com/google/go-containerregistry`; the image builder calls it for an
// image source (`POST /v1/images {image: "<reference>"}`), an uploaded archive
// (`{archive: {sha256, size, chunks}}`: an OCI layout or `docker save` tar sent
// in chunks through the context routes, at most 8 GiB, assembled by the catalog
// into the build's work directory) and a Dockerfile's `FROM` of a registry
// image. Registry requests go through `GuardedTransport`: the registry's name
// is resolved and every address it has, and every address dialled, must pass
// the egress rules' refusal of loopback, private, link-local and the host's own
// addresses (`registry_forbidden`), so a tenant cannot make the server fetch
// from its own network; the operator's proxy is dialled as configured, and
// `serve --registry-allow-private` lifts the rule for in-house registries,
// never for the cloud metadata and host-agent addresses (`egress.Metadata`,
// also in their IPv6 forms), which stay refused.
//
//   - `Open(ctx, Source)`: exactly one of a registry reference (`remote`,
//     platform linux/amd64 picked from an index; anonymous pulls; http for
//     loopback, localhost and RFC 1918 registries, https otherwise), an OCI
//     layout directory (read through `os.Root`: no symlink leads out), or a tar
//     file on the host, detected by its members: an OCI layout packed as tar
//     (`oci-layout` + `index.json`, read in place by offsets, layers checked
//     against their digests) or `docker save` output (`manifest.json`,
//     `tarball.ImageFromPath`); gzip-compressed archives are refused. Bounds
//     (`Limits`, defaults): 128 layers, 8 GiB compressed (the manifest's layer
//     sizes, or the archive's size), 8 GiB of file content and 2 M entries
//     (checked while flattening). Refusals are `ErrInvalidArgument` with codes
//     `image_invalid`, `image_not_found` (404, and 401/403, which Docker Hub
//     answers for unknown repositories), `image_too_large`, `image_platform`,
//     `image_unsupported`, `image_unsafe_entry`; a registry that cannot be read
//     is `ErrUnavailable` `image_pull_failed`. `Digest()` is the manifest's
//     digest (a docker save archive has no manifest: its config's), for logs
//     only; `Config()` keeps Env, WorkingDir, User, Cmd, Entrypoint,
//     ExposedPorts and Labels. The config's bytes are hashed here and its
//     `rootfs.diff_ids` must be sha256 and as many as the layers.
//   - `Flatten(ctx)`: one tar of the final tree. `mutate.Extract` applies the
//     layers top layer first (whiteouts, opaque directories, `..` names
//     refused, relative links that climb out dropped); its failures arrive
//     after its tar's end marker, so the stream is read to the end. Each
//     layer's uncompressed stream is hashed as the library reads it
//     (`verify.go`; the rest after the layer tar's end marker is read into the
//     hash on close, in the same pass) and checked against
//     `rootfs.diff_ids[i]`: a mismatch fails the flatten with
//     `ErrInvalidArgument` `image_layer_mismatch` naming the layer index and
//     both digests (`details.layer`, `expected`, `actual`), before the tar's
//     end, and explains any other failure of that layer. A filter then makes
//     every name relative and clean, keeps the first (topmost) version of a
//     path, drops entries under a path that is a file or symlink in the final
//     tree and files over a directory, makes hard-link targets relative and
//     holds a link back until its target has been written (top-first order puts
//     lower-layer targets later; a link to a whited-out file goes), keeps
//     files, dirs, symlinks, hard links, device nodes and fifos only, modes'
//     permission bits, numeric owners and, of PAX records, only
//     `SCHILY.xattr.*` (file capabilities). Known limit: a hard link of a lower
//     layer whose target an upper layer replaced gets the new content.
//   - `BuildRootfs(ctx, vm, img, dir, log)` (`Stage`, then `BuildStaged`):
//     stages the flattened tar in `dir`, gzipped at the fastest level (the `VM`
//     interface takes sized writes; the guest stream is the slow part), writes
//     it into a build VM (`VM`: `Run` a script as root, `WriteFile`,
//     `ReadFile`; `GuestVM` adapts a guest handle), where a script unpacks it
//     as root (`tar -xzp --numeric-owner --same-owner --xattrs`), adds the
//     sandbox user like the default image's customize hook (uid/gid 1000
//     `user`, home `/workspace` from `/etc/skel`, shell bash or sh; an account
//     the image has at uid or gid 1000 gives way), `/etc/sudoers.d/user` if
//     sudo exists, hostname and hosts, an empty machine-id, no `resolv.conf`,
//     the mount points, and runs `mkfs.ext4 -d -m 0 -L emberbox-root` sized
//     like `makeExt4`. The tree is hostile: each path the script writes is made
//     a real directory or file first, and accounts are edited as text, not with
//     the image's tools. The image comes out as a sparse tar (`tar --sparse`:
//     its unused blocks never cross the guest stream; the host takes exactly
//     one bounded entry) into `dir/rootfs.img`, sparse again and mode 0644.
//     Nothing of the image is unpacked on the host. The build VM needs about
//     three times the image's size free on its disk (tar, tree, ext4 image).
//   - `Importer` implements `recipebuild.Importer`: `Open`, `Stage` (so a
//     refused image starts no VM), a build sandbox of the default image through
//     the manager (owner `system:build`, disk 4 GiB + 8× the compressed layers
//   - 1 GiB, at most 64 GiB; deleted after), `BuildStaged`, and a `Result`
//     whose digest is `VerifiedRootfsKey()`: sha256 (format 2) over the
//     config's bytes as hashed here, the layers' hashes as the flatten computed
//     them and the setup script (a new setup is a new image). Identity never
//     comes from a digest the uploader states: a tenant packing a popular
//     image's config with other layers is refused, and could not land under the
//     genuine key anyway; keys of format 1 (over the uploader's digest, before
//     layers were checked) never match a new import. `RootfsKey()`, the same
//     over the config's claimed diff_ids, only looks up a base stored before.
//     The `Result` carries the image's Env (the job's on top), WorkingDir,
//     User, Labels, and its ENTRYPOINT + CMD as start command unless the job
//     names one, says `no_start`, or it is a lone shell (`bash`, as base images
//     have). An image of its own lands in the job's directory; a Dockerfile's
//     `FROM` of an OCI reference lands in `BaseDir/<key>/` (it must outlive the
//     build: cached steps are overlays of it) and is reused by later builds.
//   - What an imported image needs to work fully: `bash` (the agent runs
//     commands with it), `nft` and `ip` for egress capture (without them the
//     proxy still works and raw connections fail at once), `resize2fs` to grow
//     its root to the disk size. Debian and Ubuntu minimal images have bash and
//     resize2fs.
package ociimport
