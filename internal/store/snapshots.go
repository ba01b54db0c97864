package store

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"time"

	"github.com/emberbox/emberbox/internal/errdefs"
	"github.com/emberbox/emberbox/internal/sandbox"
	"github.com/emberbox/emberbox/internal/webhook"
)

// snapshotRows are the store's methods on the snapshots table.
type snapshotRows struct{ *backend }

const snapshotColumns = `id, owner_key_id, name, labels, source_sandbox_id, mode, state, error,
	size_bytes, vcpu, memory_mib, disk_mib, retention_days,
	created_at, ready_at, expires_at, deleted_at, files_removed_at, image_id, rootfs, checkpoint_of, base_id`

func snapshotNotFound(id string) error {
	return errdefs.New(errdefs.ErrNotFound, "snapshot_not_found", "snapshot %s not found", id)
}

// InsertSnapshot records a new snapshot.
func (s *snapshotRows) InsertSnapshot(ctx context.Context, sn *sandbox.Snapshot) error {
	if sn.ID == "" {
		return errdefs.New(errdefs.ErrInvalidArgument, "invalid_snapshot", "inserting snapshot: empty id")
	}
	labels, err := jsonOrNull(sn.Labels, sn.Labels == nil)
	if err != nil {
		return fmt.Errorf("inserting snapshot %s: encoding labels: %w", sn.ID, err)
	}
	node := ""
	if n := s.node.Load(); n != nil {
		node = n.id // its files are on this node
	}
	_, err = s.db.ExecContext(ctx, `INSERT INTO snapshots (`+snapshotColumns+`, node_id)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
		sn.ID, sn.OwnerKeyID, sn.Name, labels, sn.SourceSandboxID, sn.Mode, sn.State, sn.Error,
		sn.SizeBytes, sn.VCPU, sn.MemoryMiB, sn.DiskMiB, sn.RetentionDays,
		formatTime(sn.CreatedAt), formatTimePtr(sn.ReadyAt), formatTimePtr(sn.ExpiresAt),
		formatTimePtr(sn.DeletedAt), formatTimePtr(sn.FilesRemovedAt), sn.ImageID, sn.Rootfs, sn.CheckpointOf, sn.BaseID, node)
	if err != nil {
		return fmt.Errorf("inserting snapshot %s: %w", sn.ID, err)
	}
	return nil
}

// GetSnapshot returns a snapshot of any owner, deleted ones included.
func (s *snapshotRows) GetSnapshot(ctx context.Context, id string) (*sandbox.Snapshot, error) {
	return snapshotTable.get(ctx, s.db, "getting", id)
}

// snapshotTable reads snapshots by id.
var snapshotTable = newTable("snapshot", "snapshots", snapshotColumns, scanSnapshot, snapshotNotFound)

// UpdateSnapshot changes a snapshot's record in one transaction, as
// UpdateSandbox does a sandbox's: fn sees the committed record and nothing
// is written if it returns false. ID, owner, source, mode, shape and
// creation time never change.
func (s *snapshotRows) UpdateSnapshot(ctx context.Context, id string, fn func(sn *sandbox.Snapshot) bool) (*sandbox.Snapshot, error) {
	var was string // the state before fn, for the feed
	change := func(sn *sandbox.Snapshot) bool {
		was = sn.State
		return fn(sn)
	}
	return snapshotTable.update(ctx, s.db, id, nil, change, func(tx *txHandle, sn *sandbox.Snapshot) error {
		if err := publishSnapshot(ctx, tx, sn, was, s.now()); err != nil {
			return err
		}
		labels, err := jsonOrNull(sn.Labels, sn.Labels == nil)
		if err != nil {
			return fmt.Errorf("updating snapshot %s: encoding labels: %w", id, err)
		}
		if _, err := tx.ExecContext(ctx, `UPDATE snapshots SET name = ?, labels = ?, state = ?, error = ?,
			size_bytes = ?, retention_days = ?, ready_at = ?, expires_at = ?, deleted_at = ?, files_removed_at = ?,
			base_id = ?
			WHERE id = ?`,
			sn.Name, labels, sn.State, sn.Error, sn.SizeBytes, sn.RetentionDays, formatTimePtr(sn.ReadyAt),
			formatTimePtr(sn.ExpiresAt), formatTimePtr(sn.DeletedAt), formatTimePtr(sn.FilesRemovedAt), sn.BaseID, id); err != nil {
			return fmt.Errorf("updating snapshot %s: %w", id, err)
		}
		return nil
	})
}

// ListSnapshots returns one page of the snapshots matching opts that are
// not deleted, newest first, and the cursor of the next page.
func (s *snapshotRows) ListSnapshots(ctx context.Context, opts sandbox.SnapshotListOptions) ([]*sandbox.Snapshot, string, error) {
	limit, err := pageLimit(opts.Limit)
	if err != nil {
		return nil, "", err
	}
	where := []string{"state <> 'deleted'"}
	var args []any
	add := func(cond string, v any) {
		where = append(where, cond)
		args = append(args, v)
	}
	if opts.OwnerKeyID != "" {
		add("owner_key_id = ?", opts.OwnerKeyID)
	}
	if opts.SourceSandboxID != "" {
		add("source_sandbox_id = ?", opts.SourceSandboxID)
	}
	// A sandbox's checkpoints are listed under it alone.
	if !opts.AllKinds || opts.CheckpointOf != "" {
		add("checkpoint_of = ?", opts.CheckpointOf)
	}
	if opts.Name != "" {
		add("name = ?", opts.Name)
	}
	if opts.State != "" {
		add("state = ?", opts.State)
	}
	if opts.Cursor != "" {
		created, id, err := decodeCursor(opts.Cursor)
		if err != nil {
			return nil, "", err
		}
		where = append(where, "(created_at < ? OR (created_at = ? AND id < ?))")
		args = append(args, created, created, id)
	}
	args = append(args, limit+1)
	list, err := queryRows(ctx, s.db, scanSnapshot, `SELECT `+snapshotColumns+` FROM snapshots WHERE `+
		strings.Join(where, " AND ")+` ORDER BY created_at DESC, id DESC LIMIT ?`, args...)
	if err != nil {
		return nil, "", fmt.Errorf("listing snapshots: %w", err)
	}
	list, next := cutPage(list, limit, func(sn *sandbox.Snapshot) string { return encodeCursor(formatTime(sn.CreatedAt), sn.ID) })
	return list, next, nil
}

// CheckpointBytes is the disk space the checkpoints of owner's sandboxes
// take, deleted ones whose files are still there included: what the
// key's checkpoint quota counts.
func (s *snapshotRows) CheckpointBytes(ctx context.Context, owner string) (int64, error) {
	var n int64
	err := s.db.QueryRowContext(ctx, `SELECT CAST(coalesce(sum(size_bytes), 0) AS BIGINT) FROM snapshots
		WHERE owner_key_id = ? AND checkpoint_of != '' AND files_removed_at IS NULL`, owner).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("summing checkpoints of %s: %w", owner, err)
	}
	return n, nil
}

// CapturingSnapshots lists the snapshots of this node still capturing.
func (s *snapshotRows) CapturingSnapshots(ctx context.Context) ([]string, error) {
	cond, args := s.localOnly()
	ids, err := queryRows(ctx, s.db, scanString, `SELECT id FROM snapshots WHERE state = 'capturing'`+cond, args...)
	if err != nil {
		return nil, fmt.Errorf("listing capturing snapshots: %w", err)
	}
	return ids, nil
}

// ExpiredSnapshots returns the snapshots, not deleted, whose retention
// ended before now.
func (s *snapshotRows) ExpiredSnapshots(ctx context.Context, now time.Time) ([]*sandbox.Snapshot, error) {
	cond, args := s.localOnly()
	list, err := queryRows(ctx, s.db, scanSnapshot, `SELECT `+snapshotColumns+` FROM snapshots
		WHERE state <> 'deleted' AND expires_at IS NOT NULL AND expires_at <= ?`+cond+` ORDER BY expires_at`,
		append([]any{formatTime(now)}, args...)...)
	if err != nil {
		return nil, fmt.Errorf("listing expired snapshots: %w", err)
	}
	return list, nil
}

// UnusedDeletedSnapshots returns the deleted snapshots whose files are
// still there, that no sandbox with a disk was made from (deleted, or
// stopped with its files removed, a copy needs them no longer) and that
// no snapshot with files is a difference over (base_id): their files can
// go.
func (s *snapshotRows) UnusedDeletedSnapshots(ctx context.Context) ([]string, error) {
	cond, args := s.localOnly()
	ids, err := queryRows(ctx, s.db, scanString, `SELECT id FROM snapshots AS sn
		WHERE state = 'deleted' AND files_removed_at IS NULL
		AND NOT EXISTS (SELECT 1 FROM sandboxes
			WHERE snapshot_id = sn.id AND state <> 'deleted' AND disk_removed_at IS NULL)
		AND NOT EXISTS (SELECT 1 FROM snapshots AS d
			WHERE d.base_id = sn.id AND d.files_removed_at IS NULL)`+cond+`
		ORDER BY deleted_at`, args...)
	if err != nil {
		return nil, fmt.Errorf("listing unused deleted snapshots: %w", err)
	}
	return ids, nil
}

func scanSnapshot(row interface{ Scan(...any) error }) (*sandbox.Snapshot, error) {
	var (
		sn                                 sandbox.Snapshot
		labels                             sql.NullString
		created                            string
		ready, expires, deleted, filesGone sql.NullString
	)
	err := row.Scan(&sn.ID, &sn.OwnerKeyID, &sn.Name, &labels, &sn.SourceSandboxID, &sn.Mode, &sn.State, &sn.Error,
		&sn.SizeBytes, &sn.VCPU, &sn.MemoryMiB, &sn.DiskMiB, &sn.RetentionDays,
		&created, &ready, &expires, &deleted, &filesGone, &sn.ImageID, &sn.Rootfs, &sn.CheckpointOf, &sn.BaseID)
	if err != nil {
		return nil, err
	}
	if err := unmarshalNullable(labels, &sn.Labels); err != nil {
		return nil, fmt.Errorf("snapshot %s: decoding labels: %w", sn.ID, err)
	}
	if sn.CreatedAt, err = parseTime(created); err != nil {
		return nil, fmt.Errorf("snapshot %s: %w", sn.ID, err)
	}
	for _, f := range []struct {
		dst **time.Time
		src sql.NullString
	}{{&sn.ReadyAt, ready}, {&sn.ExpiresAt, expires}, {&sn.DeletedAt, deleted}, {&sn.FilesRemovedAt, filesGone}} {
		if *f.dst, err = parseTimePtr(f.src); err != nil {
			return nil, fmt.Errorf("snapshot %s: %w", sn.ID, err)
		}
	}
	return &sn, nil
}

// The manager finds these by interface assertion; keep them implemented.
var (
	_ sandbox.SnapshotStore = (*Store)(nil)
	_ sandbox.DiskStore     = (*Store)(nil)
)

// snapshotEvents are the feed's types of a snapshot's states.
var snapshotEvents = map[string]string{
	sandbox.SnapshotReady:   webhook.SnapshotReady,
	sandbox.SnapshotFailed:  webhook.SnapshotFailed,
	sandbox.SnapshotDeleted: webhook.SnapshotDeleted,
}

// publishSnapshot publishes sn's move from state was to the feed, in tx.
// Checkpoints are a sandbox's own steps, not the key's snapshots: they
// have no events.
func publishSnapshot(ctx context.Context, tx *txHandle, sn *sandbox.Snapshot, was string, now time.Time) error {
	typ := snapshotEvents[sn.State]
	if sn.State == was || typ == "" || sn.CheckpointOf != "" {
		return nil
	}
	data := map[string]any{"name": sn.Name, "sourceSandboxId": sn.SourceSandboxID, "sizeBytes": sn.SizeBytes}
	if sn.Error != "" {
		data["error"] = sn.Error
	}
	return publish(ctx, tx, &webhook.Event{Owner: sn.OwnerKeyID, Type: typ, ResourceType: webhook.ResourceSnapshot,
		ResourceID: sn.ID, Data: data, At: now})
}
