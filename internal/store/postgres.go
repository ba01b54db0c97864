package store

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/stdlib"
	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"
)

// isPostgresDSN reports whether dsn names a PostgreSQL database.
func isPostgresDSN(dsn string) bool {
	scheme, _, ok := strings.Cut(dsn, "://")
	return ok && (strings.EqualFold(scheme, "postgres") || strings.EqualFold(scheme, "postgresql"))
}

// redactDSN is dsn without its password, for errors and logs.
func redactDSN(dsn string) string {
	u, err := url.Parse(dsn)
	if err != nil {
		return "postgres://…"
	}
	return u.Redacted()
}

func openPostgres(ctx context.Context, dsn string) (*Store, error) {
	name := redactDSN(dsn)
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("opening store %s: %w", name, err)
	}
	// A wait for a lock (the write lock above all) fails after a while
	// instead of hanging, as SQLite's busy_timeout does; generous, as the
	// writers of every node queue for it. The DSN may set its own.
	if _, ok := cfg.RuntimeParams["lock_timeout"]; !ok {
		cfg.RuntimeParams["lock_timeout"] = "30s"
	}
	db := stdlib.OpenDB(*cfg)
	// Idle connections are kept for the bursts of a busy server and let go
	// of after a while, so that many nodes do not pin the server's
	// connections. Open connections are not capped: a transaction that
	// holds the write lock may read on a second connection, and a cap
	// reached by transactions queued on that lock would deadlock it.
	db.SetMaxIdleConns(8)
	db.SetConnMaxIdleTime(5 * time.Minute)
	s := newStore(&dbHandle{DB: db, engine: postgresEngine})
	if err := db.PingContext(ctx); err != nil {
		db.Close()
		return nil, fmt.Errorf("opening store %s: %w", name, err)
	}
	if err := s.migrate(ctx); err != nil {
		db.Close()
		return nil, fmt.Errorf("opening store %s: %w", name, err)
	}
	return s, nil
}

// Constraint violations, told apart on either engine. PostgreSQL reports
// a primary key's violation as a unique one (23505); its constraint is
// named <table>_pkey.

// sqliteCode returns the extended SQLite result code of err, or 0.
func sqliteCode(err error) int {
	var se *sqlite.Error
	if errors.As(err, &se) {
		return se.Code()
	}
	return 0
}

// pgError returns err's PostgreSQL error, or nil.
func pgError(err error) *pgconn.PgError {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe
	}
	return nil
}

const (
	pgUniqueViolation     = "23505"
	pgForeignKeyViolation = "23503"
)

func isUniqueViolation(err error) bool {
	if pe := pgError(err); pe != nil {
		return pe.Code == pgUniqueViolation && !strings.HasSuffix(pe.ConstraintName, "_pkey")
	}
	return sqliteCode(err) == sqlite3.SQLITE_CONSTRAINT_UNIQUE
}

func isPrimaryKeyViolation(err error) bool {
	if pe := pgError(err); pe != nil {
		return pe.Code == pgUniqueViolation && strings.HasSuffix(pe.ConstraintName, "_pkey")
	}
	return sqliteCode(err) == sqlite3.SQLITE_CONSTRAINT_PRIMARYKEY
}

func isForeignKeyViolation(err error) bool {
	if pe := pgError(err); pe != nil {
		return pe.Code == pgForeignKeyViolation
	}
	return sqliteCode(err) == sqlite3.SQLITE_CONSTRAINT_FOREIGNKEY
}
