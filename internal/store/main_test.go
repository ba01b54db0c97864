package store

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/emberbox/emberbox/internal/pgtest"
)

// testEngine is the engine the suite runs on: TestMain runs every test
// once on SQLite and once on PostgreSQL.
var testEngine = sqliteEngine

// pgServer serves the PostgreSQL run, one server for the test binary.
var pgServer *pgtest.Server

func TestMain(m *testing.M) {
	code := m.Run()
	if code != 0 {
		os.Exit(code)
	}
	os.Exit(runOnPostgres(m))
}

// runOnPostgres runs the suite again on a PostgreSQL server, each test on
// a database of its own. Without PostgreSQL it is skipped, unless $CI is
// set: CI must cover both engines.
func runOnPostgres(m *testing.M) int {
	if err := pgtest.Available(); err != nil {
		if os.Getenv("CI") != "" {
			fmt.Fprintln(os.Stderr, "store: PostgreSQL run:", err)
			return 1
		}
		fmt.Fprintln(os.Stderr, "store: skipping the PostgreSQL run:", err)
		return 0
	}
	srv, err := pgtest.New()
	if err != nil {
		fmt.Fprintln(os.Stderr, "store: PostgreSQL run:", err)
		return 1
	}
	defer func() {
		if err := srv.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, "store:", err)
		}
	}()
	pgServer, testEngine = srv, postgresEngine
	fmt.Fprintln(os.Stderr, "store: running the suite on PostgreSQL")
	return m.Run()
}

// newDSN names a fresh, empty store on the engine under test.
func newDSN(t testing.TB) string {
	t.Helper()
	if testEngine == postgresEngine {
		return pgServer.NewDatabase(t)
	}
	return filepath.Join(t.TempDir(), "emberbox.db")
}

// sqliteOnly skips a test of what only SQLite has (a file, its pragmas).
func sqliteOnly(t *testing.T, why string) {
	t.Helper()
	if testEngine != sqliteEngine {
		t.Skip("SQLite only: " + why)
	}
}
