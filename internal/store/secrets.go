package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/emberbox/emberbox/internal/errdefs"
	"github.com/emberbox/emberbox/internal/secrets"
)

// secretRows are the store's methods on egress secrets. Values are kept
// sealed (secrets.Sealer): the store never sees one in clear.
type secretRows struct{ *backend }

var _ secrets.Store = (*Store)(nil)

const secretColumns = `owner_key_id, name, env, placeholder, sealed, hosts, header, format, rules, scope, api, created_at, updated_at`

func scanSecret(row rowScanner) (*secrets.Secret, error) {
	var (
		sc               secrets.Secret
		hosts            string
		rules, only, api sql.NullString
		created, updated string
	)
	if err := row.Scan(&sc.Owner, &sc.Name, &sc.Env, &sc.Placeholder, &sc.Sealed, &hosts, &sc.Header, &sc.Format,
		&rules, &only, &api, &created, &updated); err != nil {
		return nil, err
	}
	if err := unmarshalNullable(sql.NullString{String: hosts, Valid: true}, &sc.Hosts); err != nil {
		return nil, fmt.Errorf("secret %s: hosts: %w", sc.Name, err)
	}
	if err := unmarshalNullable(rules, &sc.Rules); err != nil {
		return nil, fmt.Errorf("secret %s: rules: %w", sc.Name, err)
	}
	if err := unmarshalNullable(only, &sc.Only); err != nil {
		return nil, fmt.Errorf("secret %s: scope: %w", sc.Name, err)
	}
	if err := unmarshalNullable(api, &sc.API); err != nil {
		return nil, fmt.Errorf("secret %s: api: %w", sc.Name, err)
	}
	var err error
	if sc.CreatedAt, err = parseTime(created); err != nil {
		return nil, err
	}
	if sc.UpdatedAt, err = parseTime(updated); err != nil {
		return nil, err
	}
	return &sc, nil
}

func secretNotFound(name string) error {
	return errdefs.New(errdefs.ErrNotFound, "secret_not_found", "no egress secret named %s", name)
}

// PutSecret implements secrets.Store: it inserts sc or, when fn is not
// nil and owner has a secret of that name, replaces it with what fn makes
// of the record it reads, in one transaction.
func (s *secretRows) PutSecret(ctx context.Context, owner, name string, fn func(old *secrets.Secret) (*secrets.Secret, error)) (*secrets.Secret, error) {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return nil, fmt.Errorf("storing secret %s: %w", name, err)
	}
	defer tx.Rollback()
	old, err := scanSecret(tx.QueryRowContext(ctx, `SELECT `+secretColumns+` FROM egress_secrets WHERE owner_key_id = ? AND name = ?`, owner, name))
	if errors.Is(err, sql.ErrNoRows) {
		old, err = nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("storing secret %s: %w", name, err)
	}
	sc, err := fn(old)
	if err != nil {
		return nil, err
	}
	args, err := secretArgs(sc)
	if err != nil {
		return nil, err
	}
	if old != nil {
		_, err = tx.ExecContext(ctx, `DELETE FROM egress_secrets WHERE owner_key_id = ? AND name = ?`, owner, name)
	}
	if err == nil {
		_, err = tx.ExecContext(ctx, `INSERT INTO egress_secrets (`+secretColumns+`) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`, args...)
	}
	if err != nil {
		return nil, fmt.Errorf("storing secret %s: %w", name, err)
	}
	if err := tx.Commit(); err != nil {
		return nil, fmt.Errorf("storing secret %s: %w", name, err)
	}
	return sc, nil
}

func secretArgs(sc *secrets.Secret) ([]any, error) {
	hosts, err := jsonOrNull(sc.Hosts, false)
	if err != nil {
		return nil, err
	}
	rules, err := jsonOrNull(sc.Rules, len(sc.Rules) == 0)
	if err != nil {
		return nil, err
	}
	only, err := jsonOrNull(sc.Only, sc.Only == nil)
	if err != nil {
		return nil, err
	}
	api, err := jsonOrNull(sc.API, sc.API == nil)
	if err != nil {
		return nil, err
	}
	return []any{sc.Owner, sc.Name, sc.Env, sc.Placeholder, sc.Sealed, hosts, sc.Header, sc.Format, rules, only, api,
		formatTime(sc.CreatedAt), formatTime(sc.UpdatedAt)}, nil
}

// DeleteSecret implements secrets.Store.
func (s *secretRows) DeleteSecret(ctx context.Context, owner, name string) (*secrets.Secret, error) {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return nil, fmt.Errorf("deleting secret %s: %w", name, err)
	}
	defer tx.Rollback()
	sc, err := scanSecret(tx.QueryRowContext(ctx, `SELECT `+secretColumns+` FROM egress_secrets WHERE owner_key_id = ? AND name = ?`, owner, name))
	if errors.Is(err, sql.ErrNoRows) {
		return nil, secretNotFound(name)
	}
	if err != nil {
		return nil, fmt.Errorf("deleting secret %s: %w", name, err)
	}
	if _, err := tx.ExecContext(ctx, `DELETE FROM egress_secrets WHERE owner_key_id = ? AND name = ?`, owner, name); err != nil {
		return nil, fmt.Errorf("deleting secret %s: %w", name, err)
	}
	if err := tx.Commit(); err != nil {
		return nil, fmt.Errorf("deleting secret %s: %w", name, err)
	}
	return sc, nil
}

// ListSecrets implements secrets.Store: every key's secrets when owner is
// "", by owner and name.
func (s *secretRows) ListSecrets(ctx context.Context, owner string) ([]*secrets.Secret, error) {
	q, args := `SELECT `+secretColumns+` FROM egress_secrets ORDER BY owner_key_id, name`, []any(nil)
	if owner != "" {
		q, args = `SELECT `+secretColumns+` FROM egress_secrets WHERE owner_key_id = ? ORDER BY name`, []any{owner}
	}
	list, err := queryRows(ctx, s.db, scanSecret, q, args...)
	if err != nil {
		return nil, fmt.Errorf("listing secrets: %w", err)
	}
	return list, nil
}

// SecretsStamp implements secrets.Store: it changes whenever a secret is
// stored or deleted, for other processes on the store to reload.
func (s *secretRows) SecretsStamp(ctx context.Context) (string, error) {
	var n int64
	var newest sql.NullString
	if err := s.db.QueryRowContext(ctx, `SELECT count(*), max(updated_at) FROM egress_secrets`).Scan(&n, &newest); err != nil {
		return "", fmt.Errorf("reading the secrets' stamp: %w", err)
	}
	return fmt.Sprintf("%d/%s", n, newest.String), nil
}
