package store

import (
	"context"
	"fmt"
	"time"
)

// diskRows are the store's methods on the disks stopped sandboxes keep.
type diskRows struct{ *backend }

// StoppedWithDisks returns the ids of the stopped sandboxes that ended
// before endedBefore and whose files are still on disk, oldest first.
func (s *diskRows) StoppedWithDisks(ctx context.Context, endedBefore time.Time) ([]string, error) {
	cond, args := s.localOnly()
	ids, err := queryRows(ctx, s.db, scanString, `SELECT id FROM sandboxes
		WHERE state = 'stopped' AND disk_removed_at IS NULL AND ended_at < ?`+cond+` ORDER BY ended_at`,
		append([]any{formatTime(endedBefore)}, args...)...)
	if err != nil {
		return nil, fmt.Errorf("listing stopped sandboxes' disks: %w", err)
	}
	return ids, nil
}

// MarkDiskRemoved records that a stopped sandbox's files are gone. It
// reports false if the sandbox is not stopped or was marked already.
func (s *diskRows) MarkDiskRemoved(ctx context.Context, id string, at time.Time) (bool, error) {
	res, err := s.db.ExecContext(ctx, `UPDATE sandboxes SET disk_removed_at = ?
		WHERE id = ? AND state = 'stopped' AND disk_removed_at IS NULL`, formatTime(at), id)
	if err != nil {
		return false, fmt.Errorf("recording the disk of sandbox %s removed: %w", id, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return false, fmt.Errorf("recording the disk of sandbox %s removed: %w", id, err)
	}
	return n == 1, nil
}

// KeptDisks counts the stopped sandboxes of owner ("" for every owner)
// whose disks are still kept, and the MiB those disks may hold.
func (s *diskRows) KeptDisks(ctx context.Context, owner string) (count int, diskMiB int64, err error) {
	err = s.db.QueryRowContext(ctx, `SELECT count(*), coalesce(sum(disk_mib), 0) FROM sandboxes
		WHERE state = 'stopped' AND disk_removed_at IS NULL AND (?1 = '' OR owner_key_id = ?1)`, owner).Scan(&count, &diskMiB)
	if err != nil {
		return 0, 0, fmt.Errorf("counting kept disks: %w", err)
	}
	return count, diskMiB, nil
}
