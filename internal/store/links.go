package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
)

// linkRows are the store's methods on the link_generations table.
type linkRows struct{ *backend }

// LinkGeneration returns the generation of sandboxID's signed file links:
// 0 until they are first revoked.
func (s *linkRows) LinkGeneration(ctx context.Context, sandboxID string) (int64, error) {
	var g int64
	err := s.db.QueryRowContext(ctx, `SELECT generation FROM link_generations WHERE sandbox_id = ?`, sandboxID).Scan(&g)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("reading the link generation of %s: %w", sandboxID, err)
	}
	return g, nil
}

// RevokeLinks bumps sandboxID's link generation, ending every link signed
// before, and returns the new one.
func (s *linkRows) RevokeLinks(ctx context.Context, sandboxID string) (int64, error) {
	var g int64
	// A write that returns a row runs in a transaction, which holds the
	// write lock on either engine (see dbHandle.ExecContext).
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return 0, fmt.Errorf("revoking the links of %s: %w", sandboxID, err)
	}
	defer tx.Rollback()
	err = tx.QueryRowContext(ctx, `INSERT INTO link_generations AS g (sandbox_id, generation) VALUES (?, 1)
		ON CONFLICT (sandbox_id) DO UPDATE SET generation = g.generation + 1 RETURNING generation`, sandboxID).Scan(&g)
	if err == nil {
		err = tx.Commit()
	}
	if err != nil {
		return 0, fmt.Errorf("revoking the links of %s: %w", sandboxID, err)
	}
	return g, nil
}
