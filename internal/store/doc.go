// Package store keeps the server's durable state — API keys, sandbox records,
// idempotency records and sandbox events — in one embedded SQLite database, or
// in a PostgreSQL database that the servers of a cluster share.
//
// The server may be killed at any moment, so every write is a single
// transaction, and on SQLite the database runs in WAL mode: after a crash it
// holds exactly the writes that committed. Queries are written once, in the SQL
// both engines take, with ? placeholders (engine.go); the schema is one list of
// SQLite migrations that PostgreSQL's is translated from (pgschema.go). Errors
// are classified with the internal/errdefs classes.
//
// `*Store` has every method by promotion, but declares few itself (opening,
// migrating, compacting, closing): each table's methods are declared on a
// small type in that table's file (`keyRows` in keys.go, `sandboxRows` in
// sandboxes.go, `nodeRows` in nodes.go, ...) that Store embeds, and all of
// them work through one shared `backend` (the database, the node the store
// is scoped to, the clock), which also holds the node fence checks.
//
// # Engines
//
// Two engines behind one `*Store` (`Engine()` says which): `Open(ctx, dsn)`
// takes a SQLite file path or a `postgres://` / `postgresql://` URL.
//
//   - SQLite: one file (pure-Go `modernc.org/sqlite`), WAL (checked), IMMEDIATE
//     transactions, append-only migrations by `user_version`. Opened with
//     `auto_vacuum=INCREMENTAL` (an older file is vacuumed once to switch) and
//     `journal_size_limit` 64 MiB; `Compact` runs `incremental_vacuum` and a
//     truncating checkpoint.
//   - PostgreSQL (pgx v5 through `database/sql`, `engine.go`, `postgres.go`):
//     queries are written once with `?` placeholders; the handles `dbHandle` /
//     `txHandle` rebind them to `$n` (SQLite's `?NNN` numbering, literals and
//     comments left alone) and pass a Go bool as 0/1 (flags are INTEGER
//     columns) and text with NUL or invalid UTF-8 with U+FFFD in their place
//     (PostgreSQL's text refuses it; SQLite keeps it). The SQL is the dialect
//     both take: upserts with qualified target columns instead of `INSERT OR
//     REPLACE` and scalar `max()`, no `LIMIT -1`, aliased subqueries, `"user"`
//     quoted; labels are matched with `json_each` on SQLite and as
//     `json.Marshal`'s text on PostgreSQL (jsonb refuses `\u0000`).
//   - One migration list (`store.go`): PostgreSQL's text is translated from
//     SQLite's (`pgschema.go`: `STRICT`/`WITHOUT ROWID` dropped, `INTEGER` →
//     `BIGINT`, `INTEGER PRIMARY KEY` → identity, `BLOB` → `BYTEA`, `REAL` →
//     `DOUBLE PRECISION`, `TEXT` → `TEXT COLLATE "C"` so that timestamps and
//     ids sort by bytes as in SQLite, reserved words quoted), except where
//     given outright (migration 5: its triggers are plpgsql functions). The
//     version is the one row of `schema_version`; a newer one is refused on
//     both.
//   - Atomicity: code relies on one writer at a time (read, decide, write in
//     one transaction). On PostgreSQL every transaction `BeginTx` opens first
//     takes `pg_advisory_xact_lock` on one key, and a write run on its own
//     (`ExecContext`) runs in such a transaction; writes that return rows are
//     explicit transactions. So those writes, on every node that shares the
//     database, queue behind one another as on SQLite (reads never wait), and
//     migrations run once when nodes start together. The hot writes (a
//     sandbox's transitions, insert and events, meters, a key's idempotency
//     records) are scoped instead (`beginScoped`): the key shared, then one
//     advisory lock per row they touch, so writes of different sandboxes run
//     in parallel while every exclusive transaction still holds them all off;
//     the webhook fan-out reads the feed under the exclusive lock, so seqs that
//     scoped appends commit out of order never make it skip one (feed.go). A
//     lock wait fails after `lock_timeout` (30 s unless the DSN sets one), as
//     `busy_timeout` bounds SQLite's; connections are not capped (a transaction
//     may read on a second one while others queue for the lock). Constraint
//     errors are told apart by SQLSTATE (a primary key's 23505 by its `_pkey`
//     constraint). `Compact` and the journal checks are SQLite only.
//   - Tests run the whole suite twice (`main_test.go`): on SQLite, then on a
//     PostgreSQL server `internal/pgtest` starts (a fresh database per test);
//     file and pragma tests skip on PostgreSQL. Without PostgreSQL the second
//     run is skipped, unless `$CI` is set.
//
// # Tables
//
// Tables `api_keys` (sha256 of secrets; migration 4: `role` tenant|admin,
// `expires_at`, `revoked_at`, the previous secret's hash and its grace end
// after a rotation), `sandboxes` (live names unique per owner), `idempotency`
// (24 h TTL; migration 3: the `sandbox_id` a create made), `sandbox_events`
// (served by `GET /v1/sandboxes/{id}/events`; a ring of `MaxEventsPerSandbox`
// per sandbox), migration 5: `idempotency.omitted` and `idempotency_usage`
// (records and bytes per key, kept by triggers), migration 6:
// `sandboxes.disk_removed_at`, migration 7: `sandboxes.paused_at`, `auto_wake`,
// `idle_pause_seconds`, `persistent`, `snapshot_id` (the snapshot it was copied
// from) and the `snapshots` table (`snapshots.go`: `UnusedDeletedSnapshots`
// lists deleted snapshots no sandbox with a disk was copied from),
// `sandbox_network` (migration 2: policy JSON and version per sandbox),
// `previews` (migration 9), `link_generations` (migration 10), and the metering
// tables `meters`, `usage`, `meter_points`, `storage_meters` (migration 8).
// `UpdateSandbox(id, fn)` is the one way a record changes: read, `fn`, write,
// in one transaction. `InsertSandbox(sb, key)` links the create's
// Idempotency-Key to the new id in the transaction that inserts it.
package store
