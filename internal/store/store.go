package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"net/url"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"

	_ "modernc.org/sqlite" // the "sqlite" database/sql driver
	sqlite3 "modernc.org/sqlite/lib"
)

// Store is the server's durable state. It is safe for concurrent use.
//
// Its methods are declared per area, on the xxxRows types it embeds (one
// in the file of each table); they all work through the one backend.
type Store struct {
	*backend
	keyRows
	sandboxRows
	diskRows
	snapshotRows
	eventRows
	idempotencyRows
	networkRows
	previewRows
	linkRows
	imageRows
	buildCacheRows
	volumeRows
	backupRows
	meterRows
	nodeRows
	webhookRows
	secretRows
}

// backend is what every area of the store shares: the database, the node
// the store is scoped to, and the clock.
type backend struct {
	db *dbHandle
	// node scopes the store to one node of a cluster (SetNode): what it
	// inserts is that node's, its housekeeping lists see that node's
	// alone, and its writes to sandboxes are fenced (nodes.go).
	node atomic.Pointer[nodeScope]
	// now is the clock; tests replace it to move time forward.
	now func() time.Time
}

// newStore returns a store on db whose areas share one backend.
func newStore(db *dbHandle) *Store {
	b := &backend{db: db, now: time.Now}
	return &Store{
		backend:         b,
		keyRows:         keyRows{b},
		sandboxRows:     sandboxRows{b},
		diskRows:        diskRows{b},
		snapshotRows:    snapshotRows{b},
		eventRows:       eventRows{b},
		idempotencyRows: idempotencyRows{b},
		networkRows:     networkRows{b},
		previewRows:     previewRows{b},
		linkRows:        linkRows{b},
		imageRows:       imageRows{b},
		buildCacheRows:  buildCacheRows{b},
		volumeRows:      volumeRows{b},
		backupRows:      backupRows{b},
		meterRows:       meterRows{b},
		nodeRows:        nodeRows{b},
		webhookRows:     webhookRows{b},
		secretRows:      secretRows{b},
	}
}

// Open opens or creates the store named by dsn and brings its schema up to
// date: a postgres:// or postgresql:// URL is a PostgreSQL database, shared
// by every server given it; anything else is the path of a SQLite file. It
// fails if the schema was written by a newer version of the server.
func Open(ctx context.Context, dsn string) (*Store, error) {
	if isPostgresDSN(dsn) {
		return openPostgres(ctx, dsn)
	}
	return openSQLite(ctx, dsn)
}

func openSQLite(ctx context.Context, path string) (*Store, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, fmt.Errorf("opening store %s: %w", path, err)
	}
	// The pragmas are applied by the driver to every pooled connection.
	// synchronous=NORMAL in WAL mode loses no committed transaction when the
	// process dies, only (possibly) the last ones on power loss. IMMEDIATE
	// transactions take the write lock up front, so busy_timeout covers them
	// and a read-then-write transaction cannot fail with SQLITE_BUSY midway.
	q := url.Values{}
	q.Add("_pragma", fmt.Sprintf("busy_timeout(%d)", busyTimeout.Milliseconds()))
	q.Add("_pragma", "synchronous(NORMAL)")
	q.Add("_pragma", "foreign_keys(ON)")
	// The log is cut back to this after a checkpoint, so a burst of writes
	// does not leave a large -wal file behind.
	q.Add("_pragma", "journal_size_limit(67108864)")
	q.Set("_txlock", "immediate")
	dsn := (&url.URL{Scheme: "file", Path: filepath.ToSlash(abs), RawQuery: q.Encode()}).String()

	db, err := sql.Open("sqlite", dsn)
	if err != nil {
		return nil, fmt.Errorf("opening store %s: %w", path, err)
	}
	s := newStore(&dbHandle{DB: db, engine: sqliteEngine})
	if err := s.init(ctx); err != nil {
		db.Close()
		return nil, fmt.Errorf("opening store %s: %w", path, err)
	}
	return s, nil
}

// Engine names the database behind the store: "sqlite" or "postgres".
func (s *Store) Engine() string { return s.db.engine.String() }

// Close closes the database.
func (s *Store) Close() error {
	return s.db.Close()
}

func (s *Store) init(ctx context.Context) error {
	mode, err := s.walMode(ctx)
	if err != nil {
		return fmt.Errorf("setting journal_mode: %w", err)
	}
	// SQLite silently keeps the old mode where WAL is impossible (some
	// network file systems); without WAL the crash-safety story changes.
	if !strings.EqualFold(mode, "wal") {
		return fmt.Errorf("journal_mode is %q, want wal", mode)
	}
	if err := s.incrementalVacuum(ctx); err != nil {
		return err
	}
	if err := s.migrate(ctx); err != nil {
		return fmt.Errorf("migrating: %w", err)
	}
	return nil
}

// busyTimeout is how long a statement waits for another connection's
// lock before it fails with SQLITE_BUSY.
const busyTimeout = 5 * time.Second

// walMode switches the database to write-ahead logging, which the file
// keeps from then on, and returns the mode it is in. It is set once here,
// not as a pragma on every pooled connection: while another process opens
// the same new file and converts it, SQLite answers SQLITE_BUSY at once
// without calling the busy handler, so the switch is retried for as long
// as busy_timeout would have waited.
func (s *Store) walMode(ctx context.Context) (string, error) {
	deadline := time.Now().Add(busyTimeout)
	for wait := time.Millisecond; ; wait = min(2*wait, 100*time.Millisecond) {
		var mode string
		err := s.db.QueryRowContext(ctx, "PRAGMA journal_mode = WAL").Scan(&mode)
		if err == nil || sqliteCode(err)&0xff != sqlite3.SQLITE_BUSY || time.Now().After(deadline) {
			return mode, err
		}
		select {
		case <-ctx.Done():
			return "", ctx.Err()
		case <-time.After(wait):
		}
	}
}

// incrementalVacuum switches the database to auto_vacuum=INCREMENTAL, so
// that pages freed by pruning can be given back to the file system
// (Compact). A database made before needs one VACUUM to switch; a new one
// switches before its first table.
func (s *Store) incrementalVacuum(ctx context.Context) error {
	var av int
	if err := s.db.QueryRowContext(ctx, "PRAGMA auto_vacuum").Scan(&av); err != nil {
		return fmt.Errorf("reading auto_vacuum: %w", err)
	}
	if av == 2 {
		return nil
	}
	// One connection, as the pragma and the VACUUM must meet.
	conn, err := s.db.Conn(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	if _, err := conn.ExecContext(ctx, "PRAGMA auto_vacuum = INCREMENTAL"); err != nil {
		return fmt.Errorf("setting auto_vacuum: %w", err)
	}
	if _, err := conn.ExecContext(ctx, "VACUUM"); err != nil {
		return fmt.Errorf("vacuuming to set auto_vacuum: %w", err)
	}
	return nil
}

// Compact gives the pages that deletes freed back to the file system and
// truncates the write-ahead log. The server runs it after the hourly prune.
// On PostgreSQL it does nothing: autovacuum does that work.
func (s *Store) Compact(ctx context.Context) error {
	if s.db.engine == postgresEngine {
		return nil
	}
	conn, err := s.db.Conn(ctx)
	if err != nil {
		return fmt.Errorf("compacting the store: %w", err)
	}
	defer conn.Close()
	// incremental_vacuum frees pages one row of its result at a time, so
	// the rows are read to the end.
	rows, err := conn.QueryContext(ctx, "PRAGMA incremental_vacuum")
	if err != nil {
		return fmt.Errorf("compacting the store: %w", err)
	}
	for rows.Next() {
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return fmt.Errorf("compacting the store: %w", err)
	}
	if _, err := conn.ExecContext(ctx, "PRAGMA wal_checkpoint(TRUNCATE)"); err != nil {
		return fmt.Errorf("compacting the store: checkpoint: %w", err)
	}
	return nil
}

// migrations are applied in order; migration i brings the schema to
// user_version i+1. Append only: never edit one that has shipped.
var migrations = []string{
	// 1: initial schema.
	`
CREATE TABLE api_keys (
	id          TEXT PRIMARY KEY,
	name        TEXT NOT NULL,
	secret_hash TEXT NOT NULL UNIQUE, -- hex sha256 of the secret
	created_at  TEXT NOT NULL
) STRICT;

CREATE TABLE sandboxes (
	id              TEXT PRIMARY KEY,
	owner_key_id    TEXT NOT NULL,
	name            TEXT NOT NULL,
	labels          TEXT,  -- JSON object, NULL for a nil map
	env_names       TEXT,  -- JSON array, NULL for a nil slice
	vcpu            INTEGER NOT NULL,
	memory_mib      INTEGER NOT NULL,
	disk_mib        INTEGER NOT NULL,
	timeout_seconds INTEGER NOT NULL,
	on_lease_end    TEXT NOT NULL,
	state           TEXT NOT NULL,
	stop_reason     TEXT NOT NULL,
	accel           TEXT NOT NULL,
	driver          TEXT NOT NULL,
	created_at      TEXT NOT NULL,
	ready_at        TEXT,
	expires_at      TEXT,
	ended_at        TEXT,
	deleted_at      TEXT,
	vm              BLOB
) STRICT;

-- Listing is newest first, per owner or across owners.
CREATE INDEX sandboxes_owner_created ON sandboxes (owner_key_id, created_at DESC, id DESC);
CREATE INDEX sandboxes_created ON sandboxes (created_at DESC, id DESC);
-- A name is unique per owner among sandboxes that are not stopped or deleted.
CREATE UNIQUE INDEX sandboxes_live_name ON sandboxes (owner_key_id, name)
	WHERE name <> '' AND state NOT IN ('stopped', 'deleted');
CREATE INDEX sandboxes_live ON sandboxes (state) WHERE state NOT IN ('stopped', 'deleted');

CREATE TABLE idempotency (
	key_id       TEXT NOT NULL,
	key          TEXT NOT NULL,
	fingerprint  TEXT NOT NULL,
	status       INTEGER NOT NULL, -- 0 while the first request runs
	content_type TEXT NOT NULL,
	body         BLOB,
	created_at   TEXT NOT NULL,
	PRIMARY KEY (key_id, key)
) STRICT, WITHOUT ROWID;
CREATE INDEX idempotency_created ON idempotency (created_at);

CREATE TABLE sandbox_events (
	id         INTEGER PRIMARY KEY,
	sandbox_id TEXT NOT NULL REFERENCES sandboxes (id) ON DELETE CASCADE,
	type       TEXT NOT NULL,
	message    TEXT NOT NULL,
	data       TEXT, -- JSON object or NULL
	at         TEXT NOT NULL
) STRICT;
CREATE INDEX sandbox_events_sandbox ON sandbox_events (sandbox_id, id);
`,
	// 2: egress policy per sandbox.
	`
CREATE TABLE sandbox_network (
	sandbox_id TEXT PRIMARY KEY REFERENCES sandboxes (id) ON DELETE CASCADE,
	policy     TEXT NOT NULL,    -- JSON egress.Policy
	version    INTEGER NOT NULL, -- 1 at create, +1 per change
	updated_at TEXT NOT NULL
) STRICT;
`,
	// 3: the sandbox a create made, stored with its Idempotency-Key in the
	// transaction that records the sandbox.
	`
ALTER TABLE idempotency ADD COLUMN sandbox_id TEXT;
`,
	// 4: key roles, expiry, revocation and rotation. The oldest key named
	// "admin" is the one the server made for its data dir.
	`
ALTER TABLE api_keys ADD COLUMN role TEXT NOT NULL DEFAULT 'tenant';
ALTER TABLE api_keys ADD COLUMN expires_at TEXT;
ALTER TABLE api_keys ADD COLUMN revoked_at TEXT;
ALTER TABLE api_keys ADD COLUMN old_secret_hash TEXT;       -- the secret before a rotation
ALTER TABLE api_keys ADD COLUMN old_secret_expires_at TEXT; -- until when it still works
CREATE INDEX api_keys_old_secret ON api_keys (old_secret_hash) WHERE old_secret_hash IS NOT NULL;
UPDATE api_keys SET role = 'admin'
	WHERE id = (SELECT id FROM api_keys WHERE name = 'admin' ORDER BY created_at, id LIMIT 1);
`,
	// 5: idempotency answers too large to keep, and what each key holds,
	// kept by triggers so the per-key bounds cost one row read.
	`
ALTER TABLE idempotency ADD COLUMN omitted INTEGER; -- bytes of an answer not kept
CREATE INDEX idempotency_key_created ON idempotency (key_id, created_at);
CREATE TABLE idempotency_usage (
	key_id  TEXT PRIMARY KEY,
	records INTEGER NOT NULL,
	bytes   INTEGER NOT NULL -- of kept answers
) STRICT, WITHOUT ROWID;
INSERT INTO idempotency_usage
	SELECT key_id, count(*), coalesce(sum(length(body)), 0) FROM idempotency GROUP BY key_id;
CREATE TRIGGER idempotency_usage_insert AFTER INSERT ON idempotency BEGIN
	INSERT INTO idempotency_usage VALUES (NEW.key_id, 1, coalesce(length(NEW.body), 0))
		ON CONFLICT (key_id) DO UPDATE SET records = records + 1, bytes = bytes + excluded.bytes;
END;
CREATE TRIGGER idempotency_usage_delete AFTER DELETE ON idempotency BEGIN
	UPDATE idempotency_usage SET records = records - 1, bytes = bytes - coalesce(length(OLD.body), 0)
		WHERE key_id = OLD.key_id;
END;
CREATE TRIGGER idempotency_usage_update AFTER UPDATE OF body ON idempotency BEGIN
	UPDATE idempotency_usage SET bytes = bytes - coalesce(length(OLD.body), 0) + coalesce(length(NEW.body), 0)
		WHERE key_id = NEW.key_id;
END;
`,
	// 6: stopped sandboxes whose files were removed after the retention.
	`
ALTER TABLE sandboxes ADD COLUMN disk_removed_at TEXT;
CREATE INDEX sandboxes_stopped_disk ON sandboxes (ended_at) WHERE state = 'stopped' AND disk_removed_at IS NULL;
`,
	// 7: pause and wake, idle pause, persistent sandboxes, and snapshots.
	`
ALTER TABLE sandboxes ADD COLUMN paused_at TEXT;
ALTER TABLE sandboxes ADD COLUMN auto_wake INTEGER NOT NULL DEFAULT 1;
ALTER TABLE sandboxes ADD COLUMN idle_pause_seconds INTEGER NOT NULL DEFAULT 0;
ALTER TABLE sandboxes ADD COLUMN persistent INTEGER NOT NULL DEFAULT 0;
ALTER TABLE sandboxes ADD COLUMN snapshot_id TEXT NOT NULL DEFAULT ''; -- the snapshot it was made from
CREATE INDEX sandboxes_snapshot ON sandboxes (snapshot_id) WHERE snapshot_id <> '';

CREATE TABLE snapshots (
	id                TEXT PRIMARY KEY,
	owner_key_id      TEXT NOT NULL,
	name              TEXT NOT NULL,
	labels            TEXT,             -- JSON object, NULL for a nil map
	source_sandbox_id TEXT NOT NULL,
	mode              TEXT NOT NULL,    -- memory | disk
	state             TEXT NOT NULL,    -- capturing | ready | failed | deleted
	error             TEXT NOT NULL,
	size_bytes        INTEGER NOT NULL,
	vcpu              INTEGER NOT NULL,
	memory_mib        INTEGER NOT NULL,
	disk_mib          INTEGER NOT NULL,
	retention_days    INTEGER NOT NULL,
	created_at        TEXT NOT NULL,
	ready_at          TEXT,
	expires_at        TEXT,
	deleted_at        TEXT,
	files_removed_at  TEXT              -- set once its directory is gone
) STRICT;
CREATE INDEX snapshots_owner_created ON snapshots (owner_key_id, created_at DESC, id DESC);
CREATE INDEX snapshots_expiring ON snapshots (expires_at) WHERE state <> 'deleted';
CREATE INDEX snapshots_files ON snapshots (deleted_at) WHERE state = 'deleted' AND files_removed_at IS NULL;
`,
	// 8: metering (usage.go). Times are unix milliseconds, hours unix
	// seconds of the hour's start, so that ranges and sums stay in SQL.
	`
CREATE TABLE meters (             -- the open metering interval of each sandbox whose VM runs
	sandbox_id     TEXT PRIMARY KEY,
	vm             TEXT NOT NULL,    -- the VM the cumulative counters belong to
	at_ms          INTEGER NOT NULL, -- when they were read
	cpu_ns         INTEGER NOT NULL,
	guest_cpu_ns   INTEGER NOT NULL,
	egress_bytes   INTEGER NOT NULL,
	ingress_bytes  INTEGER NOT NULL
) STRICT;
CREATE TABLE usage (              -- settled usage of one resource in one clock hour
	resource_id     TEXT NOT NULL,
	kind            TEXT NOT NULL,   -- sandbox | snapshot
	owner_key_id    TEXT NOT NULL,
	hour            INTEGER NOT NULL,
	running_ms      INTEGER NOT NULL DEFAULT 0,
	vcpu_ms         INTEGER NOT NULL DEFAULT 0,
	memory_mib_ms   INTEGER NOT NULL DEFAULT 0,
	cpu_ns          INTEGER NOT NULL DEFAULT 0,
	guest_cpu_ns    INTEGER NOT NULL DEFAULT 0,
	egress_bytes    INTEGER NOT NULL DEFAULT 0,
	ingress_bytes   INTEGER NOT NULL DEFAULT 0,
	rss_max_bytes   INTEGER NOT NULL DEFAULT 0,
	runs            INTEGER NOT NULL DEFAULT 0,
	storage_byte_ms INTEGER NOT NULL DEFAULT 0,
	settled_ms      INTEGER NOT NULL, -- when it last changed
	PRIMARY KEY (resource_id, hour)
) STRICT;
CREATE INDEX usage_owner_hour ON usage (owner_key_id, hour);
CREATE INDEX usage_hour ON usage (hour, resource_id);
CREATE TABLE meter_points (       -- each settled interval of a sandbox, for its metrics
	sandbox_id   TEXT NOT NULL,
	at_ms        INTEGER NOT NULL,  -- the interval's end
	span_ms      INTEGER NOT NULL,
	cpu_ns       INTEGER NOT NULL,
	guest_cpu_ns INTEGER NOT NULL,
	rss_bytes    INTEGER NOT NULL,
	PRIMARY KEY (sandbox_id, at_ms)
) STRICT;
CREATE INDEX meter_points_at ON meter_points (at_ms);
CREATE TABLE storage_meters (     -- until when each kept disk or snapshot has been charged
	resource_id TEXT PRIMARY KEY,
	at_ms       INTEGER NOT NULL
) STRICT;
`,
	// 9: previews (previews.go), one per sandbox and port.
	`
CREATE TABLE previews (
	id            TEXT PRIMARY KEY, -- names it in its URL
	sandbox_id    TEXT NOT NULL REFERENCES sandboxes (id) ON DELETE CASCADE,
	owner_key_id  TEXT NOT NULL,
	port          INTEGER NOT NULL,
	visibility    TEXT NOT NULL,    -- private | public
	secret        BLOB NOT NULL,    -- signs its tokens; replaced by a rotation
	embed_origins TEXT,             -- JSON array, NULL for none
	created_at    TEXT NOT NULL,
	updated_at    TEXT NOT NULL,
	expires_at    TEXT,
	UNIQUE (sandbox_id, port)
) STRICT;
`,
	// 10: the generation of a sandbox's signed file links; revoking them
	// bumps it, and a link signed with an older one is refused.
	`
CREATE TABLE link_generations (
	sandbox_id TEXT PRIMARY KEY,
	generation INTEGER NOT NULL
) STRICT;
`,
	// 11: the image a sandbox or snapshot boots from: its catalog id and
	// the read-only base disk its own disk is an overlay of ('' for the
	// server's default image).
	`
ALTER TABLE sandboxes ADD COLUMN image_id TEXT NOT NULL DEFAULT '';
ALTER TABLE sandboxes ADD COLUMN rootfs TEXT NOT NULL DEFAULT '';
ALTER TABLE snapshots ADD COLUMN image_id TEXT NOT NULL DEFAULT '';
ALTER TABLE snapshots ADD COLUMN rootfs TEXT NOT NULL DEFAULT '';
CREATE INDEX sandboxes_image ON sandboxes (image_id) WHERE image_id != '';
CREATE INDEX snapshots_image ON snapshots (image_id) WHERE image_id != '';
`,
	// 12: the image builder's step cache (buildcache.go): a disk snapshot
	// of a build sandbox after each step, by the step's content key.
	`
CREATE TABLE build_cache (
	key         TEXT PRIMARY KEY, -- sha256 of the steps up to this one
	snapshot_id TEXT NOT NULL,    -- a disk snapshot owned by system:build
	created_at  TEXT NOT NULL,
	used_at     TEXT NOT NULL
) STRICT;
CREATE INDEX build_cache_used ON build_cache (used_at);
`,
	// 13: volumes (volumes.go), their attachments, and their backups.
	`
CREATE TABLE volumes (
	id            TEXT PRIMARY KEY,
	owner_key_id  TEXT NOT NULL,
	name          TEXT NOT NULL,
	labels        TEXT NOT NULL,    -- JSON object
	size_mib      INTEGER NOT NULL,
	state         TEXT NOT NULL,    -- ready | attached | deleted
	sandbox_id    TEXT,             -- the holder while attached
	attachment_id TEXT,
	created_at    TEXT NOT NULL,
	updated_at    TEXT NOT NULL
) STRICT;
CREATE INDEX volumes_owner ON volumes (owner_key_id, id);
CREATE TABLE volume_attachments (
	id           TEXT PRIMARY KEY,
	volume_id    TEXT NOT NULL REFERENCES volumes (id),
	sandbox_id   TEXT NOT NULL,
	owner_key_id TEXT NOT NULL,
	path         TEXT NOT NULL,
	mode         TEXT NOT NULL,
	state        TEXT NOT NULL,     -- attaching | attached | detaching | detached
	error        TEXT NOT NULL,
	created_at   TEXT NOT NULL,
	attached_at  TEXT,
	detached_at  TEXT
) STRICT;
CREATE INDEX volume_attachments_sandbox ON volume_attachments (sandbox_id, state);
CREATE TABLE volume_backups (
	id           TEXT PRIMARY KEY,
	volume_id    TEXT NOT NULL,
	owner_key_id TEXT NOT NULL,
	name         TEXT NOT NULL,
	size_mib     INTEGER NOT NULL,
	state        TEXT NOT NULL,     -- creating | ready | failed | deleted
	method       TEXT NOT NULL,     -- clone | sparse-copy
	consistent   TEXT NOT NULL,     -- detached | frozen | crash (attached, freeze failed)
	error        TEXT NOT NULL,
	created_at   TEXT NOT NULL,
	ready_at     TEXT,
	expires_at   TEXT NOT NULL
) STRICT;
CREATE INDEX volume_backups_owner ON volume_backups (owner_key_id, id);
`,
	// 14: the image catalog (internal/catalog): images, their moving tags
	// and their build logs.
	`
CREATE TABLE images (
	id            TEXT PRIMARY KEY,   -- a UUID
	owner_key_id  TEXT NOT NULL,      -- or 'system' for the default image
	name          TEXT NOT NULL,      -- '' unnamed
	version       INTEGER NOT NULL,   -- 1, 2, 3… per owner and name; 0 unnamed
	state         TEXT NOT NULL,      -- queued|building|ready|failed|deleting|deleted
	kind          TEXT NOT NULL,      -- recipe|dockerfile|image|archive|default
	source        TEXT NOT NULL,      -- the build request, JSON
	error         TEXT NOT NULL,
	digest        TEXT NOT NULL,
	rootfs        TEXT NOT NULL,
	size_bytes    INTEGER NOT NULL,
	disk_mib      INTEGER NOT NULL,
	env           TEXT,               -- JSON object
	workdir       TEXT NOT NULL,
	user          TEXT NOT NULL,
	start         TEXT,               -- JSON StartSpec
	labels        TEXT,               -- JSON object
	public        INTEGER NOT NULL,
	created_at    TEXT NOT NULL,
	ready_at      TEXT,
	build_seconds REAL NOT NULL
) STRICT;
CREATE INDEX images_owner_created ON images (owner_key_id, created_at DESC, id DESC);
CREATE UNIQUE INDEX images_version ON images (owner_key_id, name, version) WHERE name <> '';
CREATE INDEX images_digest ON images (digest) WHERE digest <> '';
CREATE INDEX images_public ON images (name) WHERE public = 1;
CREATE TABLE image_tags (
	owner_key_id TEXT NOT NULL,
	name         TEXT NOT NULL,
	tag          TEXT NOT NULL,
	image_id     TEXT NOT NULL REFERENCES images (id) ON DELETE CASCADE,
	PRIMARY KEY (owner_key_id, name, tag)
) STRICT, WITHOUT ROWID;
CREATE INDEX image_tags_image ON image_tags (image_id);
CREATE TABLE image_logs (
	image_id TEXT NOT NULL REFERENCES images (id) ON DELETE CASCADE,
	seq      INTEGER NOT NULL,
	at       TEXT NOT NULL,
	stream   TEXT NOT NULL,
	text     TEXT NOT NULL,
	PRIMARY KEY (image_id, seq)
) STRICT, WITHOUT ROWID;
`,
	// 15: the nodes of a cluster (nodes.go), the node each sandbox and
	// snapshot lives on ('' on a server of its own), and the cluster's
	// shared settings (its CA).
	`
CREATE TABLE nodes (
	id           TEXT PRIMARY KEY,
	address      TEXT NOT NULL,    -- host:port of its node-to-node listener
	api_url      TEXT NOT NULL,
	state        TEXT NOT NULL,    -- up | draining | down
	epoch        INTEGER NOT NULL, -- the fencing token: +1 at each start and when declared down
	memory_mib   INTEGER NOT NULL, -- what it may promise in all
	overhead_mib INTEGER NOT NULL, -- what it charges each sandbox besides its memory
	vcpus        INTEGER NOT NULL,
	accel        TEXT NOT NULL,
	images       TEXT NOT NULL,    -- JSON array of the image digests it boots
	version      TEXT NOT NULL,
	started_at   TEXT NOT NULL,
	heartbeat_at TEXT NOT NULL,
	down_at      TEXT
) STRICT;
ALTER TABLE sandboxes ADD COLUMN node_id TEXT NOT NULL DEFAULT '';
ALTER TABLE snapshots ADD COLUMN node_id TEXT NOT NULL DEFAULT '';
CREATE INDEX sandboxes_node_live ON sandboxes (node_id, state) WHERE state NOT IN ('stopped', 'deleted');
CREATE TABLE cluster_settings (
	name  TEXT PRIMARY KEY,
	value TEXT NOT NULL
) STRICT;
`,
	// 16: checkpoints: snapshots that belong to a sandbox (checkpoint_of
	// names it) and are listed under it, not among the key's snapshots;
	// base_id names the snapshot whose files a checkpoint's memory is a
	// difference over.
	`
ALTER TABLE snapshots ADD COLUMN checkpoint_of TEXT NOT NULL DEFAULT '';
ALTER TABLE snapshots ADD COLUMN base_id TEXT NOT NULL DEFAULT '';
CREATE INDEX snapshots_base ON snapshots (base_id) WHERE base_id != '';
CREATE INDEX snapshots_checkpoints ON snapshots (checkpoint_of, created_at) WHERE checkpoint_of != '' AND state <> 'deleted';
`,
	// 17: the account's event feed (feed.go), webhooks and their
	// deliveries: the outbox the webhook dispatcher sends from
	// (webhooks.go).
	`
CREATE TABLE feed_events (
	seq           INTEGER PRIMARY KEY,
	owner_key_id  TEXT NOT NULL,
	type          TEXT NOT NULL,
	resource_type TEXT NOT NULL,
	resource_id   TEXT NOT NULL,
	data          TEXT, -- JSON object or NULL
	at            TEXT NOT NULL
) STRICT;
CREATE INDEX feed_events_owner ON feed_events (owner_key_id, seq);
CREATE INDEX feed_events_resource ON feed_events (owner_key_id, resource_id, seq);
CREATE INDEX feed_events_at ON feed_events (at);
CREATE TABLE webhooks (
	id              TEXT PRIMARY KEY,
	owner_key_id    TEXT NOT NULL,
	url             TEXT NOT NULL,
	description     TEXT NOT NULL,
	events          TEXT,             -- JSON array of types; NULL: every type
	enabled         INTEGER NOT NULL,
	secret          TEXT NOT NULL,
	previous_secret TEXT NOT NULL,
	previous_until  TEXT,
	cursor          INTEGER NOT NULL, -- the newest feed event given deliveries
	created_at      TEXT NOT NULL,
	updated_at      TEXT NOT NULL
) STRICT;
CREATE INDEX webhooks_owner ON webhooks (owner_key_id, created_at);
CREATE TABLE webhook_deliveries (
	seq              INTEGER PRIMARY KEY,
	id               TEXT NOT NULL UNIQUE,
	webhook_id       TEXT NOT NULL REFERENCES webhooks (id) ON DELETE CASCADE,
	owner_key_id     TEXT NOT NULL,
	event_seq        INTEGER NOT NULL,
	event_type       TEXT NOT NULL,
	resource_id      TEXT NOT NULL,
	body             TEXT NOT NULL,
	state            TEXT NOT NULL,    -- pending | delivered | failed
	attempts         INTEGER NOT NULL,
	next_attempt_at  TEXT NOT NULL,
	claimed_by       TEXT NOT NULL,
	claimed_until    TEXT NOT NULL,    -- '' when no attempt is under way
	last_status      INTEGER NOT NULL,
	last_error       TEXT NOT NULL,
	last_duration_ms INTEGER NOT NULL,
	last_attempt_at  TEXT,
	created_at       TEXT NOT NULL,
	delivered_at     TEXT
) STRICT;
CREATE INDEX webhook_deliveries_due ON webhook_deliveries (next_attempt_at) WHERE state = 'pending';
CREATE INDEX webhook_deliveries_line ON webhook_deliveries (webhook_id, resource_id, seq) WHERE state = 'pending';
CREATE INDEX webhook_deliveries_webhook ON webhook_deliveries (webhook_id, seq);
CREATE INDEX webhook_deliveries_finished ON webhook_deliveries (created_at) WHERE state <> 'pending';
`,
	// 18: egress secrets (secrets.go): values sealed by a key kept
	// outside the database.
	`
CREATE TABLE egress_secrets (
	owner_key_id TEXT NOT NULL,
	name         TEXT NOT NULL,
	env          TEXT NOT NULL,
	placeholder  TEXT NOT NULL UNIQUE,
	sealed       TEXT NOT NULL,
	hosts        TEXT NOT NULL, -- JSON array
	header       TEXT NOT NULL,
	format       TEXT NOT NULL,
	rules        TEXT,          -- JSON array, NULL: none
	scope        TEXT,          -- JSON object, NULL: every sandbox of the key
	api          TEXT,          -- JSON object, NULL: no policy
	created_at   TEXT NOT NULL,
	updated_at   TEXT NOT NULL,
	PRIMARY KEY (owner_key_id, name)
) STRICT;
`,
}

// timeLayout is fixed-width UTC with nanoseconds, so times round-trip exactly
// and compare correctly as text in SQL (ordering, cursors, pruning).
const timeLayout = "2006-01-02T15:04:05.000000000Z"

func formatTime(t time.Time) string { return t.UTC().Format(timeLayout) }

func formatTimePtr(t *time.Time) any {
	if t == nil {
		return nil
	}
	return formatTime(*t)
}

func parseTime(s string) (time.Time, error) {
	t, err := time.Parse(timeLayout, s)
	if err != nil {
		return time.Time{}, fmt.Errorf("parsing stored time %q: %w", s, err)
	}
	return t, nil
}

func parseTimePtr(ns sql.NullString) (*time.Time, error) {
	if !ns.Valid {
		return nil, nil
	}
	t, err := parseTime(ns.String)
	if err != nil {
		return nil, err
	}
	return &t, nil
}

// jsonOrNull encodes v as JSON text, or SQL NULL when isNil, so that nil and
// empty collections round-trip distinctly.
func jsonOrNull(v any, isNil bool) (any, error) {
	if isNil {
		return nil, nil
	}
	b, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	return string(b), nil
}

// unmarshalNullable decodes a JSON column into v, leaving v untouched (nil)
// for NULL.
func unmarshalNullable(ns sql.NullString, v any) error {
	if !ns.Valid {
		return nil
	}
	return json.Unmarshal([]byte(ns.String), v)
}
