package store

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"database/sql"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"github.com/emberbox/emberbox/internal/errdefs"
)

// Key is an API key as the store shows it; its secret is never stored.
type Key struct {
	ID        string
	Name      string
	CreatedAt time.Time
}

// CreateKey creates an API key and returns it with its secret, which is
// shown this once: the store keeps only its SHA-256.
func (s *Store) CreateKey(ctx context.Context, name string) (Key, string, error) {
	k, secret, err := s.NewKey(name)
	if err != nil {
		return Key{}, "", err
	}
	if err := s.InsertKey(ctx, k, secret); err != nil {
		return Key{}, "", err
	}
	return k, secret, nil
}

// NewKey makes a new key and its secret without recording it, for a caller
// that must keep the secret somewhere first (see InsertKey).
func (s *Store) NewKey(name string) (Key, string, error) {
	var idb [8]byte
	var secb [32]byte
	if _, err := rand.Read(idb[:]); err != nil {
		return Key{}, "", fmt.Errorf("creating key: %w", err)
	}
	if _, err := rand.Read(secb[:]); err != nil {
		return Key{}, "", fmt.Errorf("creating key: %w", err)
	}
	k := Key{ID: "key_" + hex.EncodeToString(idb[:]), Name: name, CreatedAt: s.now().UTC()}
	return k, "ebx_" + base64.RawURLEncoding.EncodeToString(secb[:]), nil
}

// InsertKey records a key made by NewKey.
func (s *Store) InsertKey(ctx context.Context, k Key, secret string) error {
	_, err := s.db.ExecContext(ctx,
		`INSERT INTO api_keys (id, name, secret_hash, created_at) VALUES (?, ?, ?, ?)`,
		k.ID, k.Name, hashSecret(secret), formatTime(k.CreatedAt))
	if err != nil {
		return fmt.Errorf("creating key %q: %w", k.Name, err)
	}
	return nil
}

// hashSecret returns the hex SHA-256 of secret. A plain hash suffices: the
// secrets are 256 random bits, not passwords, so there is nothing to stretch.
func hashSecret(secret string) string {
	sum := sha256.Sum256([]byte(secret))
	return hex.EncodeToString(sum[:])
}

// AuthenticateKey returns the key whose secret is secret. An unknown secret
// is an error of class errdefs.ErrNotFound.
func (s *Store) AuthenticateKey(ctx context.Context, secret string) (Key, error) {
	// Looking up by hash leaks no timing about the secret itself.
	row := s.db.QueryRowContext(ctx,
		`SELECT id, name, created_at FROM api_keys WHERE secret_hash = ?`, hashSecret(secret))
	k, err := scanKey(row)
	if errors.Is(err, sql.ErrNoRows) {
		return Key{}, fmt.Errorf("authenticating key: unknown secret: %w", errdefs.ErrNotFound)
	}
	if err != nil {
		return Key{}, fmt.Errorf("authenticating key: %w", err)
	}
	return k, nil
}

// ListKeys returns all API keys, oldest first.
func (s *Store) ListKeys(ctx context.Context) ([]Key, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT id, name, created_at FROM api_keys ORDER BY created_at, id`)
	if err != nil {
		return nil, fmt.Errorf("listing keys: %w", err)
	}
	defer rows.Close()
	var keys []Key
	for rows.Next() {
		k, err := scanKey(rows)
		if err != nil {
			return nil, fmt.Errorf("listing keys: %w", err)
		}
		keys = append(keys, k)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("listing keys: %w", err)
	}
	return keys, nil
}

// CountKeys returns the number of API keys.
func (s *Store) CountKeys(ctx context.Context) (int, error) {
	var n int
	if err := s.db.QueryRowContext(ctx, `SELECT count(*) FROM api_keys`).Scan(&n); err != nil {
		return 0, fmt.Errorf("counting keys: %w", err)
	}
	return n, nil
}

func scanKey(row interface{ Scan(...any) error }) (Key, error) {
	var (
		k       Key
		created string
	)
	if err := row.Scan(&k.ID, &k.Name, &created); err != nil {
		return Key{}, err
	}
	t, err := parseTime(created)
	if err != nil {
		return Key{}, fmt.Errorf("key %s: %w", k.ID, err)
	}
	k.CreatedAt = t
	return k, nil
}
