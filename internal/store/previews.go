package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/emberbox/emberbox/internal/errdefs"
	"github.com/emberbox/emberbox/internal/sandbox"
)

// previewRows are the store's methods on the previews table.
type previewRows struct{ *backend }

const previewColumns = `id, sandbox_id, owner_key_id, port, visibility, secret, embed_origins, created_at, updated_at, expires_at`

// PutPreview inserts p, or replaces the preview of its sandbox and port.
func (s *previewRows) PutPreview(ctx context.Context, p *sandbox.Preview) error {
	var origins any
	if len(p.EmbedOrigins) > 0 {
		b, err := json.Marshal(p.EmbedOrigins)
		if err != nil {
			return fmt.Errorf("encoding embed origins: %w", err)
		}
		origins = string(b)
	}
	_, err := s.db.ExecContext(ctx, `INSERT INTO previews (`+previewColumns+`) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
		ON CONFLICT (sandbox_id, port) DO UPDATE SET visibility = excluded.visibility, secret = excluded.secret,
			embed_origins = excluded.embed_origins, updated_at = excluded.updated_at, expires_at = excluded.expires_at`,
		p.ID, p.SandboxID, p.OwnerKeyID, p.Port, p.Visibility, p.Secret, origins,
		formatTime(p.CreatedAt), formatTime(p.UpdatedAt), formatTimePtr(p.ExpiresAt))
	if isForeignKeyViolation(err) {
		return fmt.Errorf("storing preview: %w", sandboxNotFound(p.SandboxID))
	}
	if err != nil {
		return fmt.Errorf("storing preview of %s port %d: %w", p.SandboxID, p.Port, err)
	}
	return nil
}

// GetPreview returns the preview of a sandbox's port.
func (s *previewRows) GetPreview(ctx context.Context, sandboxID string, port int) (*sandbox.Preview, error) {
	return s.onePreview(ctx, `WHERE sandbox_id = ? AND port = ?`, sandboxID, port)
}

// PreviewByID returns the preview named id.
func (s *previewRows) PreviewByID(ctx context.Context, id string) (*sandbox.Preview, error) {
	return s.onePreview(ctx, `WHERE id = ?`, id)
}

func (s *previewRows) onePreview(ctx context.Context, where string, args ...any) (*sandbox.Preview, error) {
	p, err := scanPreview(s.db.QueryRowContext(ctx, `SELECT `+previewColumns+` FROM previews `+where, args...))
	if errors.Is(err, sql.ErrNoRows) {
		return nil, errdefs.New(errdefs.ErrNotFound, "preview_not_found", "no such preview")
	}
	if err != nil {
		return nil, fmt.Errorf("reading preview: %w", err)
	}
	return p, nil
}

// ListPreviews returns a sandbox's previews by port.
func (s *previewRows) ListPreviews(ctx context.Context, sandboxID string) ([]*sandbox.Preview, error) {
	out, err := queryRows(ctx, s.db, scanPreview, `SELECT `+previewColumns+` FROM previews WHERE sandbox_id = ? ORDER BY port`, sandboxID)
	if err != nil {
		return nil, fmt.Errorf("listing previews of %s: %w", sandboxID, err)
	}
	return out, nil
}

// DeletePreviews removes a sandbox's preview of port, or all of them when
// port is 0.
func (s *previewRows) DeletePreviews(ctx context.Context, sandboxID string, port int) error {
	q, args := `DELETE FROM previews WHERE sandbox_id = ?`, []any{sandboxID}
	if port != 0 {
		q, args = q+` AND port = ?`, append(args, port)
	}
	if _, err := s.db.ExecContext(ctx, q, args...); err != nil {
		return fmt.Errorf("deleting previews of %s: %w", sandboxID, err)
	}
	return nil
}

func scanPreview(row interface{ Scan(...any) error }) (*sandbox.Preview, error) {
	var p sandbox.Preview
	var origins, expires sql.NullString
	var created, updated string
	if err := row.Scan(&p.ID, &p.SandboxID, &p.OwnerKeyID, &p.Port, &p.Visibility, &p.Secret, &origins,
		&created, &updated, &expires); err != nil {
		return nil, err
	}
	if origins.Valid {
		if err := json.Unmarshal([]byte(origins.String), &p.EmbedOrigins); err != nil {
			return nil, fmt.Errorf("decoding embed origins of preview %s: %w", p.ID, err)
		}
	}
	var err error
	if p.CreatedAt, err = parseTime(created); err != nil {
		return nil, err
	}
	if p.UpdatedAt, err = parseTime(updated); err != nil {
		return nil, err
	}
	if p.ExpiresAt, err = parseTimePtr(expires); err != nil {
		return nil, err
	}
	return &p, nil
}

var _ sandbox.PreviewStore = (*Store)(nil)
