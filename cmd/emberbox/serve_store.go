package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/emberbox/emberbox/internal/faultpoint"
	"github.com/emberbox/emberbox/internal/store"
)

// openStore opens the store --store names (by default the SQLite file in
// the data dir, which it makes).
func (s *server) openStore(ctx context.Context) error {
	if err := os.MkdirAll(s.o.dataDir, 0o700); err != nil {
		return fmt.Errorf("creating data dir: %w", err)
	}
	dsn := storeDSN(s.o.storeURL, s.o.dataDir)
	s.isNode = clustered(dsn)
	st, err := store.Open(ctx, dsn)
	if err != nil {
		return err
	}
	s.st = st
	s.cleanup.push(func() { st.Close() })
	return nil
}

// settleStore makes the first admin key of a fresh data dir and settles
// what the previous run left pending.
func (s *server) settleStore(ctx context.Context) error {
	if err := ensureAdminKey(ctx, s.st, s.o.dataDir, s.log); err != nil {
		return err
	}
	// A pending idempotency record now was left by a server that died
	// mid-request (no request of this one has started): a create that had
	// recorded its sandbox answers its retry with that sandbox, any other
	// key is freed for the retry to run.
	// In a cluster other nodes' requests are pending too: their records
	// are left to the hourly prune.
	if s.isNode {
	} else if resolved, released, err := s.st.ResolvePendingIdempotency(ctx); err != nil {
		return err
	} else if resolved+released > 0 {
		s.log.Info("settled idempotency keys left pending by the previous run", "creates_resolved", resolved, "released", released)
	}
	return nil
}

// ensureAdminKey creates the first key on a fresh data dir and writes it to
// admin.key (0600), the only place its secret is kept.
func ensureAdminKey(ctx context.Context, st *store.Store, dataDir string, log *slog.Logger) error {
	n, err := st.CountKeys(ctx)
	if err != nil || n > 0 {
		return err
	}
	// The file is written, whole, before the key is recorded: a crash in
	// between leaves no keys, and the next start makes a new one; the other
	// order could leave a key whose secret nobody has.
	k, secret, err := st.NewKey("admin")
	if err != nil {
		return err
	}
	k.Role = store.RoleAdmin
	path := filepath.Join(dataDir, adminKeyFile)
	if err := writeFileAtomic(path, []byte(secret+"\n"), 0o600); err != nil {
		return fmt.Errorf("writing admin key: %w", err)
	}
	faultpoint.Hit("admin_key.written")
	if err := st.InsertKey(ctx, k, secret); err != nil {
		return err
	}
	log.Info("created admin API key", "key_id", k.ID, "path", path)
	fmt.Fprintf(os.Stderr, "\nAdmin API key written to %s\n\n", path)
	return nil
}

// writeFileAtomic replaces path with data: a temporary file beside it is
// written and synced, then renamed over it, so that path holds either the
// old content or all of the new.
func writeFileAtomic(path string, data []byte, perm os.FileMode) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	defer os.Remove(tmp) // fails harmlessly once renamed
	if err := f.Chmod(perm); err != nil {
		f.Close()
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		return err
	}
	// Make the rename itself durable.
	if d, err := os.Open(filepath.Dir(path)); err == nil {
		_ = d.Sync()
		d.Close()
	}
	return nil
}

func pruneIdempotency(ctx context.Context, st *store.Store, log *slog.Logger) {
	t := time.NewTicker(time.Hour)
	defer t.Stop()
	for {
		if n, err := st.PruneIdempotency(ctx, time.Now().Add(-store.IdempotencyTTL)); err != nil && ctx.Err() == nil {
			log.Warn("pruning idempotency records", "err", err)
		} else if n > 0 {
			log.Debug("pruned idempotency records", "count", n)
		}
		// Give what the prunes and the rings freed back to the disk.
		if err := st.Compact(ctx); err != nil && ctx.Err() == nil {
			log.Warn("compacting the store", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
