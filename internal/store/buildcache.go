package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/emberbox/emberbox/internal/errdefs"
)

// buildCacheRows are the store's methods on the build cache (a build's cache key to the snapshot it made).
type buildCacheRows struct{ *backend }

// The image builder's step cache: which disk snapshot holds a build
// sandbox's disk after the steps a key names. imagebuild.Cache.

// GetBuildCache returns the snapshot recorded under key and marks it used
// at now; errdefs.ErrNotFound when there is none.
func (s *buildCacheRows) GetBuildCache(ctx context.Context, key string, now time.Time) (string, error) {
	var id string
	// A write that returns a row runs in a transaction, which holds the
	// write lock on either engine (see dbHandle.ExecContext).
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return "", fmt.Errorf("reading the build cache: %w", err)
	}
	defer tx.Rollback()
	err = tx.QueryRowContext(ctx, `UPDATE build_cache SET used_at = ? WHERE key = ? RETURNING snapshot_id`,
		formatTime(now), key).Scan(&id)
	if err == nil {
		err = tx.Commit()
	}
	if errors.Is(err, sql.ErrNoRows) {
		return "", errdefs.New(errdefs.ErrNotFound, "not_found", "no cached build step %s", key)
	}
	if err != nil {
		return "", fmt.Errorf("reading the build cache: %w", err)
	}
	return id, nil
}

// PutBuildCache records snapshotID under key, replacing what was there,
// and returns the snapshot it replaced ("" for none) for the caller to
// delete.
func (s *buildCacheRows) PutBuildCache(ctx context.Context, key, snapshotID string, now time.Time) (string, error) {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return "", fmt.Errorf("recording a build step: %w", err)
	}
	defer tx.Rollback()
	var old string
	err = tx.QueryRowContext(ctx, `SELECT snapshot_id FROM build_cache WHERE key = ?`, key).Scan(&old)
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		return "", fmt.Errorf("recording a build step: %w", err)
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO build_cache (key, snapshot_id, created_at, used_at) VALUES (?, ?, ?, ?)
		ON CONFLICT (key) DO UPDATE SET snapshot_id = excluded.snapshot_id, created_at = excluded.created_at, used_at = excluded.used_at`,
		key, snapshotID, formatTime(now), formatTime(now)); err != nil {
		return "", fmt.Errorf("recording a build step: %w", err)
	}
	if err := tx.Commit(); err != nil {
		return "", fmt.Errorf("recording a build step: %w", err)
	}
	if old == snapshotID {
		old = ""
	}
	return old, nil
}

// DeleteBuildCache forgets key.
func (s *buildCacheRows) DeleteBuildCache(ctx context.Context, key string) error {
	if _, err := s.db.ExecContext(ctx, `DELETE FROM build_cache WHERE key = ?`, key); err != nil {
		return fmt.Errorf("deleting a build step: %w", err)
	}
	return nil
}

// EvictBuildCache keeps the keep most recently used entries, deletes the
// others and returns their snapshots, for the caller to delete.
func (s *buildCacheRows) EvictBuildCache(ctx context.Context, keep int) ([]string, error) {
	if keep < 0 {
		keep = 0
	}
	tx, err := s.db.BeginTx(ctx, nil) // see GetBuildCache
	if err != nil {
		return nil, fmt.Errorf("evicting build steps: %w", err)
	}
	defer tx.Rollback()
	// queryRows has closed its rows by the time it returns, before the commit.
	ids, err := queryRows(ctx, tx, scanString, `DELETE FROM build_cache WHERE key NOT IN
		(SELECT key FROM build_cache ORDER BY used_at DESC, key LIMIT ?) RETURNING snapshot_id`, keep)
	if err != nil {
		return nil, fmt.Errorf("evicting build steps: %w", err)
	}
	if err := tx.Commit(); err != nil {
		return nil, fmt.Errorf("evicting build steps: %w", err)
	}
	return ids, nil
}

// BuildCacheSnapshots lists the whole cache: key → snapshot. It is small
// (bounded by the builder's eviction).
func (s *buildCacheRows) BuildCacheSnapshots(ctx context.Context) (map[string]string, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT key, snapshot_id FROM build_cache`)
	if err != nil {
		return nil, fmt.Errorf("listing build steps: %w", err)
	}
	defer rows.Close()
	out := map[string]string{}
	for rows.Next() {
		var k, id string
		if err := rows.Scan(&k, &id); err != nil {
			return nil, fmt.Errorf("listing build steps: %w", err)
		}
		out[k] = id
	}
	return out, rows.Err()
}
