// Command emberbox is the Emberbox server and its administration tool:
// `emberbox serve` runs the API and the sandboxes' VMs, `emberbox keys create`
// makes API keys, `emberbox image build` builds the guest image.
//
// # Commands
//
// The server binary uses cobra. `serve` (serve.go) is wiring as data: a table
// of steps, one per subsystem (store, guest image and VM driver, egress,
// admission, metrics, volumes, image catalog, cluster, sandbox manager,
// recovery, builds, background loops, uploads, links, API, E2B front and
// console, cluster routing), each a method of server in a serve_*.go file
// named for its area (cluster.go for the cluster's), which builds its
// subsystem from those before it and pushes what takes it down on one cleanup
// stack. On a fresh data dir it writes `admin.key` (the file, atomically,
// before the key's row) and settles idempotency keys a crash left pending;
// admission is sized from the host and the limit flags (`limits.go`); the
// background loops are the lease clock and memory pressure (the manager's
// Reaper), an hourly idempotency prune followed by `Store.Compact`, the
// stopped-disk retention, the meter and the upload sweep; `/metrics` (admin
// keys) is the telemetry registry (also on `--metrics-listen` without a
// key). An error part way, or SIGINT/SIGTERM after HTTP drains, runs the
// stack in reverse: the background loops are stopped and waited for, then
// the manager lets go (its VMs keep running), then the store is closed.
//
// The store is the data dir's `emberbox.db`, or the PostgreSQL
// database `--store postgres://…` (or `$EMBERBOX_STORE`, which keeps a password
// off the command line) names; `keys` and `images` take `--store` too. `keys
// create|list|revoke|rotate`, `image build`, `images import|publish` (the image
// catalog's operator tools, see internal/catalog), `cost` (a month of runs
// priced at every provider's rates, `internal/pricing`), `usage` (a server's
// `GET /v1/usage` as a table or `--json`), `doctor` (the acceleration and why,
// and the confinement VMs get, from the driver's `Confinement`; `--json`);
// internal/apistore adapts the store to the API's keys, idempotency and
// events. Confinement flags of `serve`
// (and `doctor`): `--unconfined`, `--vm-uid-base`, `--vm-uid-count`,
// `--cgroup-parent`. `sandbox
// ls|create|exec|shell|cp|events|stop|rm|pause|wake` and the checkpoint
// commands `checkpoint|checkpoints|rollback|branch|checkpoint-rm`
// (`sandbox*.go`) are the API for people, built on `sdk/go` only: `exec`
// streams and exits with the command's status (124 timed out, 137 killed;
// `exitCodeError`, which `main` turns into the exit status); `shell` puts the
// local terminal in raw mode (`x/term`), follows SIGWINCH with resize frames
// and exits with the shell's status; `cp` sends files through the content routes (chunked uploads past 1
// MiB) and directories as tar.gz batches of at most 1 MiB unpacked one after
// another (a file over 512 KiB goes alone), and unpacks downloaded archives
// through an `os.Root`, so a hostile archive cannot write outside the target.
// `webhook create|list|get|update|rotate|rm|test|deliveries|retry`, `events`
// (the key's feed) and `secret set|list|scope|narrow|rm` (`webhook.go`,
// `events.go`, `secret.go`) are built on `sdk/go` too, each with `--json`;
// `secret set` reads the value from stdin only, so that it stays out of shell
// history and `ps`, and prints nothing of it.
// `usage`, `sandbox` and these share one resolver of server and key (`connect.go`):
// flags, `EMBERBOX_URL`/`EMBERBOX_API_KEY` (or `RUNTIME_API_*`),
// `~/.config/emberbox/config.json` (`EMBERBOX_CONFIG`), the local admin key.
package main
