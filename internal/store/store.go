// Package store keeps the server's durable state — API keys, sandbox records,
// idempotency records and sandbox events — in one embedded SQLite database.
//
// The server may be killed at any moment, so every write is a single SQLite
// transaction and the database runs in WAL mode: after a crash the file holds
// exactly the writes that committed. Errors are classified with the
// internal/errdefs classes.
package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"path/filepath"
	"strings"
	"time"

	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"
)

// Store is the server's durable state. It is safe for concurrent use.
type Store struct {
	db *sql.DB
	// now is the clock; tests replace it to move time forward.
	now func() time.Time
}

// Open opens or creates the database at path and brings its schema up to
// date. It fails if the database was written by a newer version of the server.
func Open(ctx context.Context, path string) (*Store, error) {
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
	q.Add("_pragma", "busy_timeout(5000)")
	q.Add("_pragma", "journal_mode(WAL)")
	q.Add("_pragma", "synchronous(NORMAL)")
	q.Add("_pragma", "foreign_keys(ON)")
	q.Set("_txlock", "immediate")
	dsn := (&url.URL{Scheme: "file", Path: filepath.ToSlash(abs), RawQuery: q.Encode()}).String()

	db, err := sql.Open("sqlite", dsn)
	if err != nil {
		return nil, fmt.Errorf("opening store %s: %w", path, err)
	}
	s := &Store{db: db, now: time.Now}
	if err := s.init(ctx); err != nil {
		db.Close()
		return nil, fmt.Errorf("opening store %s: %w", path, err)
	}
	return s, nil
}

// Close closes the database.
func (s *Store) Close() error {
	return s.db.Close()
}

func (s *Store) init(ctx context.Context) error {
	var mode string
	if err := s.db.QueryRowContext(ctx, "PRAGMA journal_mode").Scan(&mode); err != nil {
		return err
	}
	// SQLite silently keeps the old mode where WAL is impossible (some
	// network file systems); without WAL the crash-safety story changes.
	if !strings.EqualFold(mode, "wal") {
		return fmt.Errorf("journal_mode is %q, want wal", mode)
	}
	return s.migrate(ctx)
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
}

// migrate applies the pending migrations, each in its own transaction
// together with its user_version bump, so a crash leaves the schema at a
// version the code knows.
func (s *Store) migrate(ctx context.Context) error {
	for {
		done, err := s.migrateOne(ctx)
		if err != nil || done {
			return err
		}
	}
}

func (s *Store) migrateOne(ctx context.Context) (done bool, err error) {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return false, err
	}
	defer tx.Rollback()
	// Read the version inside the (immediate) transaction so two processes
	// opening the same file cannot both apply a migration.
	var v int
	if err := tx.QueryRowContext(ctx, "PRAGMA user_version").Scan(&v); err != nil {
		return false, fmt.Errorf("reading schema version: %w", err)
	}
	switch {
	case v > len(migrations):
		return false, fmt.Errorf("schema version %d is newer than this server supports (%d)", v, len(migrations))
	case v == len(migrations):
		return true, nil
	}
	if _, err := tx.ExecContext(ctx, migrations[v]); err != nil {
		return false, fmt.Errorf("applying migration %d: %w", v+1, err)
	}
	if _, err := tx.ExecContext(ctx, fmt.Sprintf("PRAGMA user_version = %d", v+1)); err != nil {
		return false, fmt.Errorf("applying migration %d: %w", v+1, err)
	}
	if err := tx.Commit(); err != nil {
		return false, fmt.Errorf("applying migration %d: %w", v+1, err)
	}
	return v+1 == len(migrations), nil
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

// sqliteCode returns the extended SQLite result code of err, or 0.
func sqliteCode(err error) int {
	var se *sqlite.Error
	if errors.As(err, &se) {
		return se.Code()
	}
	return 0
}

func isUniqueViolation(err error) bool {
	return sqliteCode(err) == sqlite3.SQLITE_CONSTRAINT_UNIQUE
}

func isPrimaryKeyViolation(err error) bool {
	return sqliteCode(err) == sqlite3.SQLITE_CONSTRAINT_PRIMARYKEY
}

func isForeignKeyViolation(err error) bool {
	return sqliteCode(err) == sqlite3.SQLITE_CONSTRAINT_FOREIGNKEY
}
