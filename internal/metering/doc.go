// Package metering turns a sandbox's cumulative counters, read on the host at
// two moments, into the usage of each clock hour between them. It is pure
// arithmetic: the store applies the result in the same transaction as the
// cursor it advances, so a crash or a restart never counts an interval twice
// and never loses one whose counters still exist.
//
// Pure arithmetic of usage. `Delta(cursor, reading, shape)` splits what two
// readings of one VM's cumulative counters span into clock-hour `Bucket`s
// (running ms split exactly at hour boundaries, CPU and traffic in proportion;
// the guest's claim capped at vCPUs × interval); `Storage` does the same for
// kept bytes; `Summarize` adds `Row`s up into a `pricing.Usage` with the CPU
// floor applied per row and prices it; `Decimal` writes exact decimal strings.
//
// # How a sandbox is metered
//
// What a sandbox uses is measured on the host (DESIGN D8) and kept by the hour.
//
//   - Reading. `vmm.Machine.Usage` answers the VMM's CPU so far (its cgroup's
//     `cpuacct.usage` or `cpu.stat` `usage_usec`; `/proc/PID/stat` unconfined)
//     and its RSS; after the VMM exits, the final count read before its cgroup
//     is removed (own child without a cgroup: its rusage). The manager adds the
//     guest's busy time (agent `info`, `cpuBusyMs`) and the egress gate's
//     bytes. A reading names its VM by a hash of the VM record.
//   - Interval. `watch` opens the sandbox's interval when it runs (ready, a
//     wake, a pause that failed, a reattach): `Store.BeginMeter` keeps an open
//     interval of the same VM (a restart), else starts one at the counters now
//     and counts a run. Boot and restore CPU are before it and never charged.
//   - Settling. Every `--meter-interval` (15 s) `RunMeter` settles each running
//     sandbox; `endVM` (stop, delete), `finishPause` and `watch` (the VM
//     exited) settle the final counters and close the interval.
//     `Store.SettleMeter` reads the open interval, adds `metering.Delta` to the
//     `usage` rows of the hours it spans, records a `meter_points` row (kept 24
//     h, for metrics) and moves or closes the interval, in one transaction; a
//     reading of another VM, or not newer, changes nothing. A VM found dead at
//     start loses its last interval (`DropMeter`).
//   - Kept disks. Every 5 minutes the allocated bytes of paused and stopped
//     sandboxes' directories and each ready snapshot's size accrue, from when
//     they were kept (`storage_meters` remembers until when).
//   - Reading it back. `GET /v1/usage` (this month by default, `groupBy`
//     sandbox, key or day; `owner=all` for admins), `/v1/usage/export` (CSV
//     pages of rows by hour and resource, `finalThrough` = the hour before
//     which no row changes: the oldest open interval, or two intervals ago),
//     `/v1/usage/compare` (the last `days` priced here and at a rival's rates,
//     or the product page's example when there is no usage),
//     `/v1/sandboxes/{id}/metrics` (points per step from `meter_points`, or the
//     hourly rows for 7d and 30d), `/v1/limits`, and `usage`/`chargedMicros` on
//     a sandbox read or listing. Money is priced when read, at the current
//     `--price-*` flags.
package metering
