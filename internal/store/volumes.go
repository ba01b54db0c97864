package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"

	"github.com/emberbox/emberbox/internal/errdefs"
	"github.com/emberbox/emberbox/internal/volumes"
)

// volumeRows are the store's methods on the volumes and their attachments.
type volumeRows struct{ *backend }

var _ volumes.Store = (*Store)(nil)

const volumeColumns = `id, owner_key_id, name, labels, size_mib, state, sandbox_id, attachment_id, created_at, updated_at`

const attachmentColumns = `id, volume_id, sandbox_id, owner_key_id, path, mode, state, error, created_at, attached_at, detached_at`

// InsertVolume records a new volume.
func (s *volumeRows) InsertVolume(ctx context.Context, v *volumes.Volume) error {
	labels, err := json.Marshal(orEmpty(v.Labels))
	if err != nil {
		return fmt.Errorf("encoding labels: %w", err)
	}
	_, err = s.db.ExecContext(ctx, `INSERT INTO volumes (`+volumeColumns+`) VALUES (?, ?, ?, ?, ?, ?, NULL, NULL, ?, ?)`,
		v.ID, v.OwnerKeyID, v.Name, string(labels), v.SizeMiB, v.State, formatTime(v.CreatedAt), formatTime(v.UpdatedAt))
	if err != nil {
		return fmt.Errorf("storing volume %s: %w", v.ID, err)
	}
	return nil
}

func orEmpty(m map[string]string) map[string]string {
	if m == nil {
		return map[string]string{}
	}
	return m
}

// GetVolume returns a volume of any owner.
func (s *volumeRows) GetVolume(ctx context.Context, id string) (*volumes.Volume, error) {
	return volumeTable.read(ctx, s.db, id)
}

type queryer interface {
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// volumeTable reads volumes by id.
var volumeTable = newTable("volume", "volumes", volumeColumns, scanVolume, volumeNotFound)

func volumeNotFound(id string) error {
	return errdefs.New(errdefs.ErrNotFound, "volume_not_found", "no volume %s", id)
}

// ListVolumes returns a page of an owner's volumes (deleted ones only when
// asked for by state), newest first.
func (s *volumeRows) ListVolumes(ctx context.Context, o volumes.ListOptions) ([]*volumes.Volume, string, error) {
	pg := newOwnerPage(o.OwnerKeyID, o.State, "name", o.Name, o.Cursor, o.Limit)
	out, err := queryRows(ctx, s.db, scanVolume, `SELECT `+volumeColumns+` FROM volumes WHERE `+pg.where+
		` ORDER BY id DESC LIMIT ?`, pg.args...)
	if err != nil {
		return nil, "", fmt.Errorf("listing volumes: %w", err)
	}
	out, next := cutPage(out, pg.limit, func(v *volumes.Volume) string { return v.ID })
	return out, next, nil
}

// LiveVolumes lists every owner's volumes not deleted.
func (s *volumeRows) LiveVolumes(ctx context.Context) ([]*volumes.Volume, error) {
	out, err := queryRows(ctx, s.db, scanVolume, `SELECT `+volumeColumns+` FROM volumes WHERE state != 'deleted' ORDER BY id`)
	if err != nil {
		return nil, fmt.Errorf("listing live volumes: %w", err)
	}
	return out, nil
}

// UpdateVolume sets the size and state of a volume in state from.
func (s *volumeRows) UpdateVolume(ctx context.Context, id, from string, sizeMiB int, state string) (*volumes.Volume, error) {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return nil, err
	}
	defer tx.Rollback()
	v, err := volumeTable.read(ctx, tx, id)
	if err != nil {
		return nil, err
	}
	if v.State != from {
		return nil, volumeStateConflict(v)
	}
	if _, err := tx.ExecContext(ctx, `UPDATE volumes SET size_mib = ?, state = ?, updated_at = ? WHERE id = ?`,
		sizeMiB, state, formatTime(s.now()), id); err != nil {
		return nil, fmt.Errorf("updating volume %s: %w", id, err)
	}
	if err := tx.Commit(); err != nil {
		return nil, err
	}
	v.SizeMiB, v.State = sizeMiB, state
	return v, nil
}

func volumeStateConflict(v *volumes.Volume) error {
	switch v.State {
	case volumes.StateAttached:
		return errdefs.New(errdefs.ErrConflict, "volume_attached", "volume %s is attached to sandbox %s", v.ID, v.SandboxID).
			WithHint("detach it first; one sandbox holds a volume at a time")
	case volumes.StateDeleted:
		return volumeNotFound(v.ID)
	}
	return errdefs.New(errdefs.ErrConflict, "volume_busy", "volume %s is %s", v.ID, v.State)
}

// BeginAttach makes a ready volume held by a.SandboxID and records a.
func (s *volumeRows) BeginAttach(ctx context.Context, a *volumes.Attachment) error {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	v, err := volumeTable.read(ctx, tx, a.VolumeID)
	if err != nil {
		return err
	}
	if v.OwnerKeyID != a.OwnerKeyID {
		return volumeNotFound(a.VolumeID)
	}
	if v.State != volumes.StateReady {
		return volumeStateConflict(v)
	}
	now := formatTime(s.now())
	if _, err := tx.ExecContext(ctx, `UPDATE volumes SET state = ?, sandbox_id = ?, attachment_id = ?, updated_at = ? WHERE id = ?`,
		volumes.StateAttached, a.SandboxID, a.ID, now, v.ID); err != nil {
		return fmt.Errorf("attaching volume %s: %w", v.ID, err)
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO volume_attachments (`+attachmentColumns+`) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, NULL, NULL)`,
		a.ID, a.VolumeID, a.SandboxID, a.OwnerKeyID, a.Path, a.Mode, a.State, a.Error, formatTime(a.CreatedAt)); err != nil {
		return fmt.Errorf("recording attachment of %s: %w", v.ID, err)
	}
	return tx.Commit()
}

// SetAttachment moves an attachment to state; at detached its volume is
// ready again.
func (s *volumeRows) SetAttachment(ctx context.Context, id, state, errText string) (*volumes.Attachment, error) {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return nil, err
	}
	defer tx.Rollback()
	a, err := attachmentTable.read(ctx, tx, id)
	if err != nil {
		return nil, err
	}
	if a.State == volumes.AttachDetached {
		return a, nil // final
	}
	now := s.now()
	set, args := `state = ?, error = ?`, []any{state, errText}
	switch state {
	case volumes.AttachAttached:
		set, args = set+`, attached_at = ?`, append(args, formatTime(now))
		a.AttachedAt = &now
	case volumes.AttachDetached:
		set, args = set+`, detached_at = ?`, append(args, formatTime(now))
		a.DetachedAt = &now
		if _, err := tx.ExecContext(ctx, `UPDATE volumes SET state = ?, sandbox_id = NULL, attachment_id = NULL, updated_at = ?
			WHERE id = ? AND attachment_id = ?`, volumes.StateReady, formatTime(now), a.VolumeID, a.ID); err != nil {
			return nil, fmt.Errorf("freeing volume %s: %w", a.VolumeID, err)
		}
	}
	if _, err := tx.ExecContext(ctx, `UPDATE volume_attachments SET `+set+` WHERE id = ?`, append(args, id)...); err != nil {
		return nil, fmt.Errorf("updating attachment %s: %w", id, err)
	}
	if err := tx.Commit(); err != nil {
		return nil, err
	}
	a.State, a.Error = state, errText
	return a, nil
}

// GetAttachment returns an attachment.
func (s *volumeRows) GetAttachment(ctx context.Context, id string) (*volumes.Attachment, error) {
	return attachmentTable.read(ctx, s.db, id)
}

// attachmentTable reads volume attachments by id.
var attachmentTable = newTable("attachment", "volume_attachments", attachmentColumns, scanAttachment, attachmentNotFound)

func attachmentNotFound(id string) error {
	return errdefs.New(errdefs.ErrNotFound, "attachment_not_found", "no attachment %s", id)
}

// HeldAttachments lists a sandbox's attachments not yet detached, oldest
// first.
func (s *volumeRows) HeldAttachments(ctx context.Context, sandboxID string) ([]*volumes.Attachment, error) {
	out, err := queryRows(ctx, s.db, scanAttachment, `SELECT `+attachmentColumns+` FROM volume_attachments
		WHERE sandbox_id = ? AND state != ? ORDER BY created_at, id`, sandboxID, volumes.AttachDetached)
	if err != nil {
		return nil, fmt.Errorf("listing attachments of %s: %w", sandboxID, err)
	}
	return out, nil
}

func scanVolume(row interface{ Scan(...any) error }) (*volumes.Volume, error) {
	var v volumes.Volume
	var labels, created, updated string
	var sb, att sql.NullString
	if err := row.Scan(&v.ID, &v.OwnerKeyID, &v.Name, &labels, &v.SizeMiB, &v.State, &sb, &att, &created, &updated); err != nil {
		return nil, err
	}
	v.SandboxID, v.AttachmentID = sb.String, att.String
	if err := json.Unmarshal([]byte(labels), &v.Labels); err != nil {
		return nil, fmt.Errorf("decoding labels of volume %s: %w", v.ID, err)
	}
	var err error
	if v.CreatedAt, err = parseTime(created); err != nil {
		return nil, err
	}
	if v.UpdatedAt, err = parseTime(updated); err != nil {
		return nil, err
	}
	return &v, nil
}

func scanAttachment(row interface{ Scan(...any) error }) (*volumes.Attachment, error) {
	var a volumes.Attachment
	var created string
	var attached, detached sql.NullString
	if err := row.Scan(&a.ID, &a.VolumeID, &a.SandboxID, &a.OwnerKeyID, &a.Path, &a.Mode, &a.State, &a.Error,
		&created, &attached, &detached); err != nil {
		return nil, err
	}
	var err error
	if a.CreatedAt, err = parseTime(created); err != nil {
		return nil, err
	}
	if a.AttachedAt, err = parseTimePtr(attached); err != nil {
		return nil, err
	}
	if a.DetachedAt, err = parseTimePtr(detached); err != nil {
		return nil, err
	}
	return &a, nil
}
