// Package volumes keeps disks that outlive sandboxes. A volume is a sparse raw
// file on the host, formatted ext4 there when it is made (an empty filesystem
// the host made itself; host tools never touch a disk a guest has written).
// Attached to a running sandbox, it reaches the guest as a network block device
// over the host-guest stream: the agent connects /dev/nbdN and relays its
// requests on a volume.nbd stream, which this package answers from the file
// (nbd.go). One sandbox holds a volume at a time.
//
// Volumes, attachments and backups (`service.go`, `backups.go`), the host's NBD
// transmission phase (`nbd.go`); the manager's `sandbox.Volumes` and a
// `sandbox.Preparer`. `volumestest` is an in-memory store for tests.
//
// A volume is a disk of its own that outlives sandboxes, attached to one
// running sandbox at a time.
//
//   - On the host: a sparse raw file `<data>/volumes/<id>/disk.raw`, made at
//     create (`sizeMiB` 64 MiB to 1 TiB, default 1024) and formatted there with
//     `mkfs.ext4 -F -q -m 0 -E root_owner=1000:1000` (its root belongs to the
//     sandbox user). That is the only time a host tool reads the file: never
//     after a guest has written it. Records: `volumes` (state `ready`,
//     `attached` with the holding sandbox and attachment, `deleted`) and
//     `volume_attachments` (`attaching` → `attached` → `detached`, with times
//     and the error of a failed attach) and `volume_backups`, migration 13. A
//     second attach, or a create naming a held volume, is 409 `volume_attached`
//     naming the holder; delete of a held volume is 409; a key sees only its
//     own volumes (404).
//   - Reaching the guest: microvm has no device hotplug, so a volume rides the
//     host-guest stream as NBD. `volume.attach` makes the agent pick a free
//     `/dev/nbdN` (module `nbd`, loaded by the initramfs), hand the kernel one
//     end of a socketpair with the ioctls (`NBD_SET_BLKSIZE` 4096,
//     `NBD_SET_SIZE_BLOCKS`, `NBD_SET_FLAGS` FLUSH|TRIM, `NBD_SET_SOCK`,
//     `NBD_DO_IT` on its own goroutine; no NBD timeout, so the kernel waits out
//     a lost host), open a guest-initiated `volume.nbd` stream naming the
//     attachment, and relay the kernel's requests on it. The host answers only
//     if the store says this sandbox holds that attachment, then serves the
//     transmission phase from the file (`nbd.go`: READ, WRITE, FLUSH →
//     fdatasync, TRIM → punched hole, DISC; each offset and length checked
//     against the size, a request over 4 MiB or a bad magic ends the stream;
//     one stream is served per attachment, a newer one ending the older, so a
//     guest holds at most 4 MiB of the host's memory per volume). No Go NBD
//     module is on the proxy; this phase is small. The agent mounts the device
//     (ext4, `nosuid,nodev`) at the path (absolute, clean, not `/` nor under
//     `/proc`, `/sys`, `/dev`, `/run`, `/etc`, `/usr`, `/bin`, `/sbin`,
//     `/lib*`, `/boot`) and, if the volume was grown while detached, grows the
//     filesystem online (`EXT4_IOC_RESIZE_FS`).
//   - Surviving the host: the agent keeps every request read from the kernel
//     until its reply came back. When the stream ends (server `kill -9`, a
//     dropped session) it waits for the next session, opens a new `volume.nbd`
//     stream and resends them in order (whole-block reads and writes are
//     idempotent); the restarted server serves it again from the store. So I/O
//     in the guest stalls while the server is down and completes after.
//   - Detach (`…/attachments/{aid}:detach`): the agent unmounts (a mount in use
//     — a process's cwd or open file — is 409 `volume_busy`, and stays
//     attached), then `NBD_DISCONNECT`. The host does not take the guest's word
//     for it: once the attachment is recorded detached it closes the stream
//     from its side and waits until its last request has left the file
//     (`endAttachment`; a failed attach ends the stream the same way), and a
//     stream opened later for that attachment is refused (checked again after
//     it is registered, so one racing the detach is closed too). A root guest
//     cannot go on reading or writing a volume that is then resized, backed up
//     or attached elsewhere. Before the host ends a VM holding volumes (stop,
//     delete) it asks the agent to flush them (`volume.sync`: syncfs each, 20 s
//     at most), so a stop loses nothing written; then the sandbox releases its
//     volumes, which ends their streams the same way. A restart of a stopped
//     sandbox does not reattach them. A VM that dies by itself loses what its
//     page cache held, as a power cut would; ext4's journal keeps the
//     filesystem whole.
//   - Create-time volumes (`volumes: [{volumeId, path, mode:"rw"}]`, at most
//     4): recorded (claimed) before the sandbox is stored, attached by the
//     service as a `sandbox.Preparer` before the sandbox is `running`; a failed
//     attach stops it (`start_failed`, event `prepare_failed`).
//   - Pause and wake keep the attachment: the host ends the session before
//     saving the guest, and the woken agent reopens the stream as after a
//     restart (tested: `TestVolumesPauseWake`).
//   - Resize: grow only, detached only (the file is truncated longer).
//   - Quotas: a volume's size is an admission claim (see Admission control)
//     against the host's free disk beside sandboxes' disks (409 `no_capacity`),
//     the key's `--quota-disk-mib`, `--quota-volumes` and `--quota-volume-mib`
//     (429); a refused grow keeps the old size. Backups (creating or ready,
//     summed by the store) are bounded per key in count and in their volumes'
//     sizes and per volume (429 `volumeBackups`, `volumeBackupMiB`,
//     `backupsPerVolume`; one key's checks are serialized); a backup or restore
//     copies only if the data dir keeps `--disk-reserve-mib` free after the
//     source's allocated bytes (409).
//   - Backups (`:backup {name, retentionDays}`, default 7 days, at most 365;
//     `GET /v1/volume-backups[/{id}]`, `…:delete`; restore with `POST
//     /v1/volumes {fromBackup}`, the backup's size): a copy of the file under
//     `<data>/volume-backups/<id>/disk.raw`, a copy-on-write clone (`FICLONE`)
//     where the data dir's filesystem has them (btrfs, XFS), else a sparse copy
//     of the data extents (`SEEK_DATA`/`SEEK_HOLE`; ext4, as on the test
//     machine: `method: "sparse-copy"`). An attached volume is frozen in its
//     guest for the copy (`volume.freeze`: `FIFREEZE`, which flushes the
//     filesystem first; `volume.thaw` after; the agent thaws by itself after
//     120 s if no thaw comes), so a backup is a clean filesystem (`consistent:
//     "frozen"`, or `"detached"`). Backups outlive their volume; they stay on
//     this server (not off it, unlike Runtime's); expired ones are removed by a
//     sweep every 10 minutes. One lock per volume orders attach, detach,
//     backup, resize and delete.
//   - Refused: snapshots and forks of a sandbox holding volumes (409
//     `volumes_attached`: their data is not part of the snapshot); mode
//     `snapshot` (read-only copies) and `shared`. Not built (501): backup
//     policies (`:backup-policy`, schedules). Volumes and backups are not
//     metered.
package volumes
