// Command emberbox is the Emberbox server and its administration tool:
// `emberbox serve` runs the API and the sandboxes' VMs, `emberbox keys create`
// makes API keys, `emberbox image build` builds the guest image.
//
// # Commands
//
// The server binary uses cobra. `serve` opens the store, writes `admin.key` on
// a fresh data dir (the file, atomically, before the key's row), settles
// idempotency keys a crash left pending, ensures image + initramfs, measures
// the TSC, builds the QEMU driver, sizes admission control from the host and
// the limit flags (`limits.go`), runs `Manager.Recover`, then the lease clock
// (`Manager.Run`), an hourly idempotency prune followed by `Store.Compact`, the
// stopped-disk retention (`Manager.RunDiskRetention`), the meter
// (`Manager.RunMeter`) and the upload sweep as goroutines it waits for, and the
// HTTP server, whose `/metrics` (admin keys) is the telemetry registry (also on
// `--metrics-listen` without a key). On SIGINT/SIGTERM it drains HTTP, stops
// and waits for those loops, closes the manager (VMs keep running), and only
// then the store. The store is the data dir's `emberbox.db`, or the PostgreSQL
// database `--store postgres://…` (or `$EMBERBOX_STORE`, which keeps a password
// off the command line) names; `keys` and `images` take `--store` too. `keys
// create|list|revoke|rotate`, `image build`, `images import|publish` (the image
// catalog's operator tools, see internal/catalog), `cost` (a month of runs
// priced at every provider's rates, `internal/pricing`), `usage` (a server's
// `GET /v1/usage` as a table or `--json`), `doctor` (the acceleration and why,
// and the confinement VMs get, from the driver's `Confinement`; `--json`);
// `keyStore`/`idempotencyStore` adapt the store. Confinement flags of `serve`
// (and `doctor`): `--unconfined`, `--vm-uid-base`, `--vm-uid-count`,
// `--cgroup-parent`. `sandbox
// ls|create|exec|shell|cp|events|stop|rm|pause|wake` (`sandbox*.go`) are the
// API for people, built on `sdk/go` only: `exec` streams and exits with the
// command's status (124 timed out, 137 killed; `exitCodeError`, which `main`
// turns into the exit status); `shell` puts the local terminal in raw mode
// (`x/term`), follows SIGWINCH with resize frames and exits with the shell's
// status; `cp` sends files through the content routes (chunked uploads past 1
// MiB) and directories as tar.gz batches of at most 1 MiB unpacked one after
// another (a file over 512 KiB goes alone), and unpacks downloaded archives
// through an `os.Root`, so a hostile archive cannot write outside the target.
// `usage` and `sandbox` share one resolver of server and key (`connect.go`):
// flags, `EMBERBOX_URL`/`EMBERBOX_API_KEY` (or `RUNTIME_API_*`),
// `~/.config/emberbox/config.json` (`EMBERBOX_CONFIG`), the local admin key.
package main
