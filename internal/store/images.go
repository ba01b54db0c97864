package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/emberbox/emberbox/internal/catalog"
	"github.com/emberbox/emberbox/internal/errdefs"
	"github.com/emberbox/emberbox/internal/webhook"
)

// imageRows are the store's methods on the image catalog: images, their tags and build logs.
type imageRows struct{ *backend }

var _ = catalog.Store{ImageRecords: (*Store)(nil), ImageTags: (*Store)(nil), ImageHolders: (*Store)(nil), BuildLogs: (*Store)(nil)}

// "user" is quoted: a reserved word in PostgreSQL (a bare user is the
// session's user name).
const imageColumns = `id, owner_key_id, name, version, state, kind, source, error, digest, rootfs, size_bytes,
	disk_mib, env, workdir, "user", start, labels, public, created_at, ready_at, build_seconds`

func imageNotFound() error {
	return errdefs.New(errdefs.ErrNotFound, "image_not_found", "no such image")
}

// CreateImage implements catalog.Store.
func (s *imageRows) CreateImage(ctx context.Context, img *catalog.Image) error {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("recording image: %w", err)
	}
	defer tx.Rollback()
	img.Version = 0
	if img.Name != "" {
		if err := tx.QueryRowContext(ctx, `SELECT coalesce(max(version), 0) + 1 FROM images WHERE owner_key_id = ? AND name = ?`,
			img.Owner, img.Name).Scan(&img.Version); err != nil {
			return fmt.Errorf("recording image: next version: %w", err)
		}
	}
	args, err := imageArgs(img)
	if err != nil {
		return err
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO images (`+imageColumns+`) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
		args...); err != nil {
		return fmt.Errorf("recording image %s: %w", img.ID, err)
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("recording image %s: %w", img.ID, err)
	}
	return nil
}

func imageArgs(img *catalog.Image) ([]any, error) {
	env, err := jsonOrNull(img.Env, img.Env == nil)
	if err != nil {
		return nil, err
	}
	start, err := jsonOrNull(img.Start, img.Start == nil)
	if err != nil {
		return nil, err
	}
	labels, err := jsonOrNull(img.Labels, img.Labels == nil)
	if err != nil {
		return nil, err
	}
	source := string(img.Source)
	if source == "" {
		source = "{}"
	}
	return []any{img.ID, img.Owner, img.Name, img.Version, img.State, img.Kind, source, img.Error, img.Digest, img.Rootfs,
		img.SizeBytes, img.DiskMiB, env, img.Workdir, img.User, start, labels, img.Public, formatTime(img.CreatedAt),
		formatTimePtr(img.ReadyAt), img.BuildSeconds}, nil
}

// UpdateImage implements catalog.Store. An image being deleted or deleted
// is not found, unless the update deletes it.
func (s *imageRows) UpdateImage(ctx context.Context, img *catalog.Image) error {
	return updateImage(ctx, s.db, img)
}

// FinishImage implements catalog.Store: the outcome and the tags in one
// transaction, so no reader sees the image ready and its name not yet
// resolving to it, and a crash between the two cannot leave it so.
func (s *imageRows) FinishImage(ctx context.Context, img *catalog.Image, tags []string) error {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("finishing image %s: %w", img.ID, err)
	}
	defer tx.Rollback()
	if err := updateImage(ctx, tx, img); err != nil {
		return err
	}
	if err := publishImage(ctx, tx, img, s.now()); err != nil {
		return err
	}
	for _, t := range tags {
		if err := setTag(ctx, tx, img.Owner, img.Name, t, img.ID); err != nil {
			return err
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("finishing image %s: %w", img.ID, err)
	}
	return nil
}

func updateImage(ctx context.Context, db execer, img *catalog.Image) error {
	a, err := imageArgs(img)
	if err != nil {
		return err
	}
	// a: id 0, state 4, error 7, digest 8, rootfs 9, size 10, disk 11, env 12,
	// workdir 13, user 14, start 15, labels 16, public 17, ready 19, secs 20.
	// A delete is final: only another delete step writes over it, so a
	// build that ends as its image is deleted cannot bring it back.
	res, err := db.ExecContext(ctx, `UPDATE images SET state = ?, error = ?, digest = ?, rootfs = ?, size_bytes = ?,
		disk_mib = ?, env = ?, workdir = ?, "user" = ?, start = ?, labels = ?, public = ?, ready_at = ?, build_seconds = ?
		WHERE id = ? AND (state NOT IN ('deleting', 'deleted') OR ?1 IN ('deleting', 'deleted'))`,
		a[4], a[7], a[8], a[9], a[10], a[11], a[12], a[13], a[14], a[15], a[16], a[17], a[19], a[20], a[0])
	if err != nil {
		return fmt.Errorf("updating image %s: %w", img.ID, err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return imageNotFound()
	}
	return nil
}

// GetImage implements catalog.Store.
func (s *imageRows) GetImage(ctx context.Context, id string) (*catalog.Image, error) {
	return s.oneImage(ctx, `WHERE id = ?`, id)
}

// ImageByVersion implements catalog.Store.
func (s *imageRows) ImageByVersion(ctx context.Context, owner, name string, version int) (*catalog.Image, error) {
	return s.oneImage(ctx, `WHERE owner_key_id = ? AND name = ? AND version = ? AND state <> 'deleted'`, owner, name, version)
}

// ImageByTag implements catalog.Store.
func (s *imageRows) ImageByTag(ctx context.Context, owner, name, tag string) (*catalog.Image, error) {
	return s.oneImage(ctx, `WHERE id = (SELECT image_id FROM image_tags WHERE owner_key_id = ? AND name = ? AND tag = ?)`, owner, name, tag)
}

// PublicImage implements catalog.Store.
func (s *imageRows) PublicImage(ctx context.Context, name, tag string, version int) (*catalog.Image, error) {
	if version > 0 {
		return s.oneImage(ctx, `WHERE public = 1 AND name = ? AND version = ? AND state <> 'deleted'
			ORDER BY created_at DESC LIMIT 1`, name, version)
	}
	return s.oneImage(ctx, `WHERE public = 1 AND id IN (SELECT image_id FROM image_tags WHERE name = ? AND tag = ?)
		ORDER BY created_at DESC LIMIT 1`, name, tag)
}

func (s *imageRows) oneImage(ctx context.Context, where string, args ...any) (*catalog.Image, error) {
	img, err := scanImage(s.db.QueryRowContext(ctx, `SELECT `+imageColumns+` FROM images `+where, args...))
	if errors.Is(err, sql.ErrNoRows) {
		return nil, imageNotFound()
	}
	if err != nil {
		return nil, fmt.Errorf("reading image: %w", err)
	}
	if img.Tags, err = s.imageTags(ctx, img.ID); err != nil {
		return nil, err
	}
	return img, nil
}

func (s *imageRows) imageTags(ctx context.Context, id string) ([]string, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT tag FROM image_tags WHERE image_id = ? ORDER BY tag`, id)
	if err != nil {
		return nil, fmt.Errorf("reading tags of image %s: %w", id, err)
	}
	defer rows.Close()
	tags := []string{}
	for rows.Next() {
		var t string
		if err := rows.Scan(&t); err != nil {
			return nil, err
		}
		tags = append(tags, t)
	}
	return tags, rows.Err()
}

// ListImages implements catalog.Store.
func (s *imageRows) ListImages(ctx context.Context, opt catalog.ListOptions) ([]*catalog.Image, error) {
	var where []string
	var args []any
	where = append(where, `(owner_key_id = ? OR public = 1)`)
	args = append(args, opt.Owner)
	if opt.State != "" {
		where, args = append(where, `state = ?`), append(args, opt.State)
	} else {
		where = append(where, `state <> 'deleted'`)
	}
	if opt.Name != "" {
		where, args = append(where, `name = ?`), append(args, opt.Name)
	}
	if opt.Cursor != "" {
		where = append(where, `(created_at, id) < (SELECT created_at, id FROM images WHERE id = ?)`)
		args = append(args, opt.Cursor)
	}
	limit := opt.Limit
	if limit <= 0 {
		limit = 50
	}
	args = append(args, limit)
	return s.imageList(ctx, `WHERE `+strings.Join(where, " AND ")+` ORDER BY created_at DESC, id DESC LIMIT ?`, args...)
}

// ImagesInStates implements catalog.Store.
func (s *imageRows) ImagesInStates(ctx context.Context, states ...string) ([]*catalog.Image, error) {
	if len(states) == 0 {
		return nil, nil
	}
	args := make([]any, len(states))
	for i, st := range states {
		args[i] = st
	}
	return s.imageList(ctx, `WHERE state IN (?`+strings.Repeat(", ?", len(states)-1)+`) ORDER BY created_at, id`, args...)
}

func (s *imageRows) imageList(ctx context.Context, where string, args ...any) ([]*catalog.Image, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT `+imageColumns+` FROM images `+where, args...)
	if err != nil {
		return nil, fmt.Errorf("listing images: %w", err)
	}
	var out []*catalog.Image
	for rows.Next() {
		img, err := scanImage(rows)
		if err != nil {
			rows.Close()
			return nil, fmt.Errorf("listing images: %w", err)
		}
		out = append(out, img)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("listing images: %w", err)
	}
	for _, img := range out {
		if img.Tags, err = s.imageTags(ctx, img.ID); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// SetTag implements catalog.Store.
func (s *imageRows) SetTag(ctx context.Context, owner, name, tag, id string) error {
	return setTag(ctx, s.db, owner, name, tag, id)
}

func setTag(ctx context.Context, db execer, owner, name, tag, id string) error {
	_, err := db.ExecContext(ctx, `INSERT INTO image_tags (owner_key_id, name, tag, image_id) VALUES (?, ?, ?, ?)
		ON CONFLICT (owner_key_id, name, tag) DO UPDATE SET image_id = excluded.image_id`, owner, name, tag, id)
	if isForeignKeyViolation(err) {
		return imageNotFound()
	}
	if err != nil {
		return fmt.Errorf("tagging image %s %s:%s: %w", id, name, tag, err)
	}
	return nil
}

// RemoveTag implements catalog.Store.
func (s *imageRows) RemoveTag(ctx context.Context, owner, name, tag, id string) (bool, error) {
	res, err := s.db.ExecContext(ctx, `DELETE FROM image_tags WHERE owner_key_id = ? AND name = ? AND tag = ? AND image_id = ?`,
		owner, name, tag, id)
	if err != nil {
		return false, fmt.Errorf("untagging image %s: %w", id, err)
	}
	n, _ := res.RowsAffected()
	return n > 0, nil
}

// RemoveTags implements catalog.Store.
func (s *imageRows) RemoveTags(ctx context.Context, id string) error {
	if _, err := s.db.ExecContext(ctx, `DELETE FROM image_tags WHERE image_id = ?`, id); err != nil {
		return fmt.Errorf("untagging image %s: %w", id, err)
	}
	return nil
}

// ImageUsers implements catalog.Store.
func (s *imageRows) ImageUsers(ctx context.Context, id string) (sandboxes, snapshots, internal int, err error) {
	err = s.db.QueryRowContext(ctx, `SELECT
		(SELECT count(*) FROM sandboxes WHERE image_id = ?1 AND state <> 'deleted'),
		(SELECT count(*) FROM snapshots WHERE image_id = ?1 AND state <> 'deleted'),
		(SELECT count(*) FROM snapshots WHERE image_id = ?1 AND state <> 'deleted' AND owner_key_id LIKE 'system:%')`,
		id).Scan(&sandboxes, &snapshots, &internal)
	if err != nil {
		return 0, 0, 0, fmt.Errorf("counting users of image %s: %w", id, err)
	}
	return sandboxes, snapshots, internal, nil
}

// DigestUsers implements catalog.Store.
func (s *imageRows) DigestUsers(ctx context.Context, digest string) (int, error) {
	var n int
	if err := s.db.QueryRowContext(ctx, `SELECT count(*) FROM images WHERE digest = ? AND state NOT IN ('deleted', 'deleting')`,
		digest).Scan(&n); err != nil {
		return 0, fmt.Errorf("counting images of digest %s: %w", digest, err)
	}
	return n, nil
}

// AppendImageLog implements catalog.Store.
func (s *imageRows) AppendImageLog(ctx context.Context, id string, lines []catalog.LogLine) (int64, error) {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return 0, fmt.Errorf("appending to the log of image %s: %w", id, err)
	}
	defer tx.Rollback()
	var last int64
	if err := tx.QueryRowContext(ctx, `SELECT coalesce(max(seq), 0) FROM image_logs WHERE image_id = ?`, id).Scan(&last); err != nil {
		return 0, fmt.Errorf("appending to the log of image %s: %w", id, err)
	}
	for _, l := range lines {
		last++
		if _, err := tx.ExecContext(ctx, `INSERT INTO image_logs (image_id, seq, at, stream, text) VALUES (?, ?, ?, ?, ?)`,
			id, last, formatTime(l.At), l.Stream, l.Text); err != nil {
			if isForeignKeyViolation(err) {
				return 0, imageNotFound()
			}
			return 0, fmt.Errorf("appending to the log of image %s: %w", id, err)
		}
	}
	if err := tx.Commit(); err != nil {
		return 0, fmt.Errorf("appending to the log of image %s: %w", id, err)
	}
	return last, nil
}

// ImageLog implements catalog.Store.
func (s *imageRows) ImageLog(ctx context.Context, id string, after int64, limit int) ([]catalog.LogLine, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT seq, at, stream, text FROM image_logs WHERE image_id = ? AND seq > ?
		ORDER BY seq LIMIT ?`, id, after, limit)
	if err != nil {
		return nil, fmt.Errorf("reading the log of image %s: %w", id, err)
	}
	defer rows.Close()
	out := []catalog.LogLine{}
	for rows.Next() {
		var l catalog.LogLine
		var at string
		if err := rows.Scan(&l.Seq, &at, &l.Stream, &l.Text); err != nil {
			return nil, err
		}
		if l.At, err = parseTime(at); err != nil {
			return nil, err
		}
		out = append(out, l)
	}
	return out, rows.Err()
}

func scanImage(row interface{ Scan(...any) error }) (*catalog.Image, error) {
	var img catalog.Image
	var source, created string
	var env, start, labels, ready sql.NullString
	if err := row.Scan(&img.ID, &img.Owner, &img.Name, &img.Version, &img.State, &img.Kind, &source, &img.Error,
		&img.Digest, &img.Rootfs, &img.SizeBytes, &img.DiskMiB, &env, &img.Workdir, &img.User, &start, &labels,
		&img.Public, &created, &ready, &img.BuildSeconds); err != nil {
		return nil, err
	}
	img.Source = []byte(source)
	for _, f := range []struct {
		ns sql.NullString
		v  any
	}{{env, &img.Env}, {start, &img.Start}, {labels, &img.Labels}} {
		if err := unmarshalNullable(f.ns, f.v); err != nil {
			return nil, fmt.Errorf("decoding image %s: %w", img.ID, err)
		}
	}
	var err error
	if img.CreatedAt, err = parseTime(created); err != nil {
		return nil, err
	}
	if img.ReadyAt, err = parseTimePtr(ready); err != nil {
		return nil, err
	}
	return &img, nil
}

// publishImage publishes the outcome of img's build or import to the
// feed, in tx.
func publishImage(ctx context.Context, tx *txHandle, img *catalog.Image, now time.Time) error {
	typ := map[string]string{catalog.StateReady: webhook.ImageReady, catalog.StateFailed: webhook.ImageFailed}[img.State]
	if typ == "" {
		return nil
	}
	data := map[string]any{"name": img.Name, "version": img.Version, "kind": img.Kind}
	if img.Error != "" {
		data["error"] = img.Error
	}
	return publish(ctx, tx, &webhook.Event{Owner: img.Owner, Type: typ, ResourceType: webhook.ResourceImage,
		ResourceID: img.ID, Data: data, At: now})
}
