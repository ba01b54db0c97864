package store

import (
	"context"
	"fmt"
)

// migrate applies the pending migrations, each in its own transaction
// together with its version bump, so a crash leaves the schema at a
// version the code knows.
func (s *Store) migrate(ctx context.Context) error {
	for {
		done, err := s.migrateOne(ctx)
		if err != nil || done {
			return err
		}
	}
}

// The schema version is SQLite's user_version; PostgreSQL has none, so it
// keeps the version in a one-row table.
const pgSchemaVersionTable = `CREATE TABLE IF NOT EXISTS schema_version (version BIGINT NOT NULL);
INSERT INTO schema_version SELECT 0 WHERE NOT EXISTS (SELECT 1 FROM schema_version);`

func (s *Store) migrateOne(ctx context.Context) (done bool, err error) {
	// The transaction holds the write lock from its start (IMMEDIATE on
	// SQLite, the advisory lock on PostgreSQL), and the version is read
	// inside it, so two processes opening the same database at once cannot
	// both apply a migration.
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return false, err
	}
	defer tx.Rollback()
	pg := s.db.engine == postgresEngine
	if pg {
		if _, err := tx.ExecContext(ctx, pgSchemaVersionTable); err != nil {
			return false, fmt.Errorf("making the schema_version table: %w", err)
		}
	}
	var v int
	readVersion := "PRAGMA user_version"
	if pg {
		readVersion = "SELECT version FROM schema_version"
	}
	if err := tx.QueryRowContext(ctx, readVersion).Scan(&v); err != nil {
		return false, fmt.Errorf("reading schema version: %w", err)
	}
	switch {
	case v > len(migrations):
		return false, fmt.Errorf("schema version %d is newer than this server supports (%d)", v, len(migrations))
	case v == len(migrations):
		return true, tx.Commit()
	}
	text, bump := migrations[v], fmt.Sprintf("PRAGMA user_version = %d", v+1)
	if pg {
		text, bump = pgMigration(v), fmt.Sprintf("UPDATE schema_version SET version = %d", v+1)
	}
	if _, err := tx.ExecContext(ctx, text); err != nil {
		return false, fmt.Errorf("applying migration %d: %w", v+1, err)
	}
	if _, err := tx.ExecContext(ctx, bump); err != nil {
		return false, fmt.Errorf("applying migration %d: %w", v+1, err)
	}
	if err := tx.Commit(); err != nil {
		return false, fmt.Errorf("applying migration %d: %w", v+1, err)
	}
	return v+1 == len(migrations), nil
}

// schemaVersion reads the version the schema is at.
func (s *Store) schemaVersion(ctx context.Context) (int, error) {
	q := "PRAGMA user_version"
	if s.db.engine == postgresEngine {
		q = "SELECT version FROM schema_version"
	}
	var v int
	if err := s.db.QueryRowContext(ctx, q).Scan(&v); err != nil {
		return 0, fmt.Errorf("reading schema version: %w", err)
	}
	return v, nil
}
