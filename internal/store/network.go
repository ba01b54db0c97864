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

// networkRows are the store's methods on the sandbox_network table.
type networkRows struct{ *backend }

// GetNetwork returns a sandbox's egress policy. A sandbox without one
// (created before policies existed) is an error of class errdefs.ErrNotFound.
func (s *networkRows) GetNetwork(ctx context.Context, sandboxID string) (*sandbox.Network, error) {
	var pol, updated string
	var n sandbox.Network
	err := s.db.QueryRowContext(ctx, `SELECT policy, version, updated_at FROM sandbox_network WHERE sandbox_id = ?`, sandboxID).
		Scan(&pol, &n.Version, &updated)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, errdefs.New(errdefs.ErrNotFound, "network_not_found", "sandbox %s has no network policy", sandboxID)
	}
	if err != nil {
		return nil, fmt.Errorf("reading network policy of %s: %w", sandboxID, err)
	}
	if err := json.Unmarshal([]byte(pol), &n.Policy); err != nil {
		return nil, fmt.Errorf("decoding network policy of %s: %w", sandboxID, err)
	}
	if n.UpdatedAt, err = parseTime(updated); err != nil {
		return nil, err
	}
	return &n, nil
}

// PutNetwork stores a sandbox's egress policy, replacing any. If
// n.UpdatedAt is zero it is set to the current time.
func (s *networkRows) PutNetwork(ctx context.Context, sandboxID string, n *sandbox.Network) error {
	if n.UpdatedAt.IsZero() {
		n.UpdatedAt = s.now()
	}
	pol, err := json.Marshal(n.Policy)
	if err != nil {
		return fmt.Errorf("encoding network policy of %s: %w", sandboxID, err)
	}
	_, err = s.db.execScoped(ctx, []string{sandboxScope(sandboxID)}, `INSERT INTO sandbox_network (sandbox_id, policy, version, updated_at) VALUES (?, ?, ?, ?)
		ON CONFLICT (sandbox_id) DO UPDATE SET policy = excluded.policy, version = excluded.version, updated_at = excluded.updated_at`,
		sandboxID, string(pol), n.Version, formatTime(n.UpdatedAt))
	if isForeignKeyViolation(err) {
		return fmt.Errorf("storing network policy: %w", sandboxNotFound(sandboxID))
	}
	if err != nil {
		return fmt.Errorf("storing network policy of %s: %w", sandboxID, err)
	}
	return nil
}
