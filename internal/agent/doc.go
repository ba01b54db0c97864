// Package agent is the guest side of Emberbox: the service emberbox-agent runs
// as PID 1 inside every sandbox. It answers the host's calls (exec, processes,
// files) over one multiplexed stream, runs commands as the sandbox user, and
// reaps every process in the guest.
//
// Its parts: `Agent` (`ServePort` → `ServeConn` → `handle` → `dispatch` per
// stream); `process`/`processTable` (1 MiB output ring each, 256 ended kept);
// `procio.go` (pipes or a pty per process) and `stdin.go` (bounded input
// queues); `reaper` (the only `wait4`); accounts from `/etc/passwd`/`group` (no
// `os/user`); `files.go` under `asUser`; `glob.go` (`file.glob`: `path.Match`
// per segment, `**` any number of directories; the walk descends only where a
// match is still possible, never through a symlink, ≤ 32 levels and 200 000
// entries visited; dotfiles only with `hidden` or a pattern segment starting
// with a dot); `rename` in `files.go` (`renameat2(RENAME_NOREPLACE)` unless
// overwrite, so the refusal is atomic; `EXDEV` is `cross_device`, never a
// copy); `archive.go` (`file.archive`: a tar written from a walk under the
// user's fsuid, PAX headers, symlinks kept as links, modes and times kept,
// sockets and devices left out, ≤ 200 000 entries and 64 levels, a file that
// shrinks while read padded to its header's size; `file.unarchive`: gzip told
// by its magic, then every entry goes through an `os.Root` on the target, so no
// path, `..` or symlink, old or from the archive, can reach outside it;
// absolute names and `..` are refused up front, hard links must name an entry
// inside, devices and FIFOs are refused (`unsafe_archive`), ≤ 200 000 entries
// and 16 GiB unpacked, files replace files (never directories), directory modes
// applied last; a refusal stops the unpacking and what came before stays);
// `watch.go` (`file.watch.*`: fsnotify/inotify on a directory and, when
// recursive, on every directory below it; a new directory is watched before its
// create is told, then walked, what was already in it reported as created;
// `exclude` patterns (a segment or the relative path) are never watched or
// told, `include` keeps events of matching names; events
// `create|modify|delete|rename|chmod` with path and time, ≤ 4096 kept per
// watch, numbered from 0: a reader behind the oldest is told `overflow` with
// the count lost, and the kernel's own overflow too; ≤ 16 running watches, ≤
// 8192 directories each (`limit` notice); a watch ends when stopped, at its
// timeout (1 h by default, ≤ 1 day, 0 none), or when its root goes
// (`root-removed`), and stays readable 10 min; watches run as the agent (root),
// and all die with the VM, so a stopped sandbox has none); `system_linux.go`
// (`SetupSystem`, `growRoot`, `FindPort`, loopback). `renew.go` answers
// `renew`, which the host sends to a guest restored from saved memory (a wake
// after a pause: seed and clock; a copy of a snapshot: hostname, machine-id and
// boot id too). The seed (≤ 512 bytes) goes into the kernel first, before
// anything in the request can draw randomness and even if the rest is refused:
// `RNDADDENTROPY` crediting every bit, then `RNDRESEEDCRNG` (the kernel has no
// VMGENID driver). The rest is checked as a whole (clock not before 2020, an
// RFC 1123 hostname ≤ 64 bytes, 32 lower-case hex digits, a UUID; else
// `invalid_request`) and then applied: the clock is stepped when it is more
// than 100 ms off; `sethostname`, `/etc/hostname` and the first `127.0.1.1`
// line of `/etc/hosts` (other lines kept); `/etc/machine-id` (and a D-Bus copy
// that is a file, not a link); the boot id, which the kernel fixes at boot, as
// `/run/emberbox/boot_id` bound read-only over
// `/proc/sys/kernel/random/boot_id` after earlier binds are taken off. Files
// are replaced atomically, so renew can be repeated. What it changes outside
// the files is a `System` (`renew_linux.go`: the kernel's); an agent that is
// not PID 1 and was given none refuses renew, so in-process agents of tests
// never touch their host. The agent keeps no random state of its own
// (`crypto/rand` reads `getrandom`, fine once the pool is reseeded; process ids
// are counters); the Go runtime's internal seeds (map hashing, `math/rand`
// defaults, temporary file names) stay the parent's and cannot be renewed from
// outside the runtime, and nothing secret depends on them.
//
// # Start
//
// Agent: `agent.New` reads accounts (user `user`); `SetupSystem` mounts proc,
// sys, devtmpfs, devpts, /dev/shm, /run, cgroup2, adds /dev symlinks, sets
// hostname `emberbox`, brings `lo` up, links `/home/user` to the user's home
// (`/workspace`) unless the image has something there (E2B's layout,
// `linkHome`), and starts `resize2fs /dev/vda` in the background (online grow
// to `diskMiB`). `FindPort` finds the port by name in `/sys/class/virtio-ports`
// (≤ 30 s); `ServePort` opens it.
//
// # An exec
//
// Agent `handle` reads the Request; a goroutine reads the stream once more, so
// the host closing it cancels the call. `dispatch` → `a.exec` → `a.start`:
// `bash -c` command (or argv looked up in the command's PATH); env = base +
// sandbox env + request env; cwd against `/workspace`; `Setpgid`; uid 1000
// credentials unless `root`; pipes; `reaper.start` registers the pid under its
// lock.
//
// `supervise` reads both pipes into `process.emit`: each chunk gets a
// cumulative offset across stdout+stderr, goes into the ring and,
// synchronously, to the sink (backpressure). Timeout → SIGKILL the group; after
// exit the rest of the group is killed and pipes drained ≤ 2 s.
//
// Streamed: Events `start{processId}`, `stdout`/`stderr{data, offset}`,
// `exit{offset=next, exit}`. Not streamed: one `Reply{exit}` with the head of
// each stream and truncation flags (the command runs to its own timeout even if
// the host leaves).
package agent
