package store

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/emberbox/emberbox/internal/errdefs"
	"github.com/emberbox/emberbox/internal/volumes"
)

// backupRows are the store's methods on the volume_backups table.
type backupRows struct{ *backend }

var _ volumes.BackupStore = (*Store)(nil)

const backupColumns = `id, volume_id, owner_key_id, name, size_mib, state, method, consistent, error, created_at, ready_at, expires_at`

// PutBackup inserts or replaces a backup.
func (s *backupRows) PutBackup(ctx context.Context, b *volumes.Backup) error {
	_, err := s.db.ExecContext(ctx, `INSERT INTO volume_backups (`+backupColumns+`) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
		ON CONFLICT (id) DO UPDATE SET volume_id = excluded.volume_id, owner_key_id = excluded.owner_key_id,
			name = excluded.name, size_mib = excluded.size_mib, state = excluded.state, method = excluded.method,
			consistent = excluded.consistent, error = excluded.error, created_at = excluded.created_at,
			ready_at = excluded.ready_at, expires_at = excluded.expires_at`,
		b.ID, b.VolumeID, b.OwnerKeyID, b.Name, b.SizeMiB, b.State, b.Method, b.Consistent, b.Error,
		formatTime(b.CreatedAt), formatTimePtr(b.ReadyAt), formatTime(b.ExpiresAt))
	if err != nil {
		return fmt.Errorf("storing backup %s: %w", b.ID, err)
	}
	return nil
}

// GetBackup returns a backup of any owner.
func (s *backupRows) GetBackup(ctx context.Context, id string) (*volumes.Backup, error) {
	return backupTable.read(ctx, s.db, id)
}

// backupTable reads volume backups by id.
var backupTable = newTable("backup", "volume_backups", backupColumns, scanBackup, backupNotFound)

func backupNotFound(id string) error {
	return errdefs.New(errdefs.ErrNotFound, "backup_not_found", "no backup %s", id)
}

// ListBackups returns a page of an owner's backups (not deleted unless
// asked for), newest first.
func (s *backupRows) ListBackups(ctx context.Context, o volumes.BackupListOptions) ([]*volumes.Backup, string, error) {
	pg := newOwnerPage(o.OwnerKeyID, o.State, "volume_id", o.VolumeID, o.Cursor, o.Limit)
	out, err := s.backups(ctx, `WHERE `+pg.where+` ORDER BY id DESC LIMIT ?`, pg.args...)
	if err != nil {
		return nil, "", err
	}
	out, next := cutPage(out, pg.limit, func(b *volumes.Backup) string { return b.ID })
	return out, next, nil
}

// ExpiredBackups lists backups not deleted whose expiry is before t.
func (s *backupRows) ExpiredBackups(ctx context.Context, t time.Time) ([]*volumes.Backup, error) {
	return s.backups(ctx, `WHERE state != 'deleted' AND expires_at < ? ORDER BY id LIMIT 1000`, formatTime(t))
}

// BackupUsage sums owner's backups creating or ready, of one volume if
// volumeID is given.
func (s *backupRows) BackupUsage(ctx context.Context, owner, volumeID string) (volumes.BackupUsage, error) {
	q, args := `SELECT COUNT(*), CAST(COALESCE(SUM(size_mib), 0) AS BIGINT) FROM volume_backups WHERE owner_key_id = ? AND state IN ('creating', 'ready')`,
		[]any{owner}
	if volumeID != "" {
		q, args = q+` AND volume_id = ?`, append(args, volumeID)
	}
	var u volumes.BackupUsage
	if err := s.db.QueryRowContext(ctx, q, args...).Scan(&u.Count, &u.SizeMiB); err != nil {
		return u, fmt.Errorf("summing backups of %s: %w", owner, err)
	}
	return u, nil
}

func (s *backupRows) backups(ctx context.Context, rest string, args ...any) ([]*volumes.Backup, error) {
	out, err := queryRows(ctx, s.db, scanBackup, `SELECT `+backupColumns+` FROM volume_backups `+rest, args...)
	if err != nil {
		return nil, fmt.Errorf("listing backups: %w", err)
	}
	return out, nil
}

func scanBackup(row interface{ Scan(...any) error }) (*volumes.Backup, error) {
	var b volumes.Backup
	var created, expires string
	var ready sql.NullString
	if err := row.Scan(&b.ID, &b.VolumeID, &b.OwnerKeyID, &b.Name, &b.SizeMiB, &b.State, &b.Method, &b.Consistent, &b.Error,
		&created, &ready, &expires); err != nil {
		return nil, err
	}
	var err error
	if b.CreatedAt, err = parseTime(created); err != nil {
		return nil, err
	}
	if b.ReadyAt, err = parseTimePtr(ready); err != nil {
		return nil, err
	}
	if b.ExpiresAt, err = parseTime(expires); err != nil {
		return nil, err
	}
	return &b, nil
}
