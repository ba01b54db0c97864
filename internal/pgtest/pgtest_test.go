package pgtest

import (
	"context"
	"os"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
)

func TestServer(t *testing.T) {
	s := Start(t)
	ctx := t.Context()
	a, b := s.NewDatabase(t), s.NewDatabase(t)
	if a == b {
		t.Fatalf("two databases share the DSN %s", a)
	}
	// A table made in one database is not in the other.
	ca, err := pgconn.Connect(ctx, a)
	if err != nil {
		t.Fatal(err)
	}
	defer ca.Close(context.Background())
	if _, err := ca.Exec(ctx, "CREATE TABLE x (v text); INSERT INTO x VALUES ('b'), ('B'), ('a')").ReadAll(); err != nil {
		t.Fatal(err)
	}
	// The C locale orders text by bytes.
	res, err := ca.Exec(ctx, "SELECT string_agg(v, '' ORDER BY v) FROM x").ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	if got := string(res[0].Rows[0][0]); got != "Bab" {
		t.Errorf("ordered %q, want byte order Bab", got)
	}
	cb, err := pgconn.Connect(ctx, b)
	if err != nil {
		t.Fatal(err)
	}
	defer cb.Close(context.Background())
	if _, err := cb.Exec(ctx, "SELECT * FROM x").ReadAll(); err == nil {
		t.Error("table x visible in another database")
	}

	if err := s.Stop(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(s.SocketDir()); !os.IsNotExist(err) {
		t.Errorf("server dir left behind: %v", err)
	}
	if err := s.Stop(); err != nil {
		t.Errorf("second Stop: %v", err)
	}
}

func TestShared(t *testing.T) {
	if err := Available(); err != nil && os.Getenv("CI") == "" {
		t.Skip(err)
	}
	a, err := Shared()
	if err != nil {
		t.Fatal(err)
	}
	b, err := Shared()
	if err != nil || a != b {
		t.Fatalf("second Shared = %p, %v; want the first server %p", b, err, a)
	}
	dsn := a.NewDatabase(t)
	c, err := pgconn.Connect(t.Context(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	c.Close(context.Background())
	t.Cleanup(func() {
		if err := StopShared(); err != nil {
			t.Error(err)
		}
	})
}
