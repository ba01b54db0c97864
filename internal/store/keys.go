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

// keyRows are the store's methods on the api_keys table.
type keyRows struct{ *backend }

// Roles of API keys.
const (
	// RoleTenant keys see and manage only their own sandboxes.
	RoleTenant = "tenant"
	// RoleAdmin keys are the operator's: besides their own sandboxes, they
	// may list every key and every key's sandboxes.
	RoleAdmin = "admin"
)

// Key is an API key as the store shows it; its secret is never stored.
type Key struct {
	ID        string
	Name      string
	Role      string // RoleTenant or RoleAdmin
	CreatedAt time.Time
	ExpiresAt *time.Time // nil: never
	RevokedAt *time.Time // nil: not revoked
}

// Active reports whether k may authenticate at now.
func (k Key) Active(now time.Time) bool {
	return k.RevokedAt == nil && (k.ExpiresAt == nil || now.Before(*k.ExpiresAt))
}

// CreateKey creates a tenant API key and returns it with its secret, which
// is shown this once: the store keeps only its SHA-256.
func (s *keyRows) CreateKey(ctx context.Context, name string) (Key, string, error) {
	k, secret, err := s.NewKey(name)
	if err != nil {
		return Key{}, "", err
	}
	if err := s.InsertKey(ctx, k, secret); err != nil {
		return Key{}, "", err
	}
	return k, secret, nil
}

// NewKey makes a new tenant key and its secret without recording it, for a
// caller that sets its role or expiry, or must keep the secret somewhere
// first (see InsertKey).
func (s *keyRows) NewKey(name string) (Key, string, error) {
	var idb [8]byte
	if _, err := rand.Read(idb[:]); err != nil {
		return Key{}, "", fmt.Errorf("creating key: %w", err)
	}
	secret, err := newSecret()
	if err != nil {
		return Key{}, "", fmt.Errorf("creating key: %w", err)
	}
	k := Key{ID: "key_" + hex.EncodeToString(idb[:]), Name: name, Role: RoleTenant, CreatedAt: s.now().UTC()}
	return k, secret, nil
}

func newSecret() (string, error) {
	var secb [32]byte
	if _, err := rand.Read(secb[:]); err != nil {
		return "", err
	}
	return "ebx_" + base64.RawURLEncoding.EncodeToString(secb[:]), nil
}

// InsertKey records a key made by NewKey.
func (s *keyRows) InsertKey(ctx context.Context, k Key, secret string) error {
	if k.Role != RoleTenant && k.Role != RoleAdmin {
		return errdefs.New(errdefs.ErrInvalidArgument, "invalid_role", "role must be %q or %q, not %q", RoleTenant, RoleAdmin, k.Role)
	}
	_, err := s.db.ExecContext(ctx,
		`INSERT INTO api_keys (id, name, secret_hash, created_at, role, expires_at) VALUES (?, ?, ?, ?, ?, ?)`,
		k.ID, k.Name, hashSecret(secret), formatTime(k.CreatedAt), k.Role, formatTimePtr(k.ExpiresAt))
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

const keyColumns = `id, name, role, created_at, expires_at, revoked_at`

// AuthenticateKey returns the active key whose secret is secret: its
// current one, or the one before a rotation during the rotation's grace
// period. An unknown secret, or that of a revoked or expired key, is an
// error of class errdefs.ErrNotFound (a CodedError saying which).
func (s *keyRows) AuthenticateKey(ctx context.Context, secret string) (Key, error) {
	// Looking up by hash leaks no timing about the secret itself.
	h := hashSecret(secret)
	now := s.now()
	k, err := scanKey(s.db.QueryRowContext(ctx, `SELECT `+keyColumns+` FROM api_keys WHERE secret_hash = ?`, h))
	if errors.Is(err, sql.ErrNoRows) {
		k, err = scanKey(s.db.QueryRowContext(ctx, `SELECT `+keyColumns+` FROM api_keys
			WHERE old_secret_hash = ? AND old_secret_expires_at > ?`, h, formatTime(now)))
	}
	if errors.Is(err, sql.ErrNoRows) {
		return Key{}, fmt.Errorf("authenticating key: unknown secret: %w", errdefs.ErrNotFound)
	}
	if err != nil {
		return Key{}, fmt.Errorf("authenticating key: %w", err)
	}
	switch {
	case k.RevokedAt != nil:
		return Key{}, errdefs.New(errdefs.ErrNotFound, "key_revoked", "This API key was revoked.")
	case !k.Active(now):
		return Key{}, errdefs.New(errdefs.ErrNotFound, "key_expired", "This API key has expired.")
	}
	return k, nil
}

// GetKey returns the key with id. A missing key is an error of class
// errdefs.ErrNotFound.
func (s *keyRows) GetKey(ctx context.Context, id string) (Key, error) {
	return keyTable.read(ctx, s.db, id)
}

// keyTable reads API keys by id.
var keyTable = newTable("key", "api_keys", keyColumns, scanKey, keyNotFound)

func keyNotFound(id string) error {
	return errdefs.New(errdefs.ErrNotFound, "key_not_found", "no key %q", id)
}

// ListKeys returns all API keys, revoked and expired ones included, oldest
// first.
func (s *keyRows) ListKeys(ctx context.Context) ([]Key, error) {
	keys, err := queryRows(ctx, s.db, scanKey, `SELECT `+keyColumns+` FROM api_keys ORDER BY created_at, id`)
	if err != nil {
		return nil, fmt.Errorf("listing keys: %w", err)
	}
	return keys, nil
}

// RevokeKey revokes key id at once, its secret and any secret a rotation
// left in grace. Revoking a revoked key changes nothing. A missing key is
// an error of class errdefs.ErrNotFound.
func (s *keyRows) RevokeKey(ctx context.Context, id string) (Key, error) {
	_, err := s.db.ExecContext(ctx, `UPDATE api_keys SET revoked_at = coalesce(revoked_at, ?),
		old_secret_hash = NULL, old_secret_expires_at = NULL WHERE id = ?`, formatTime(s.now()), id)
	if err != nil {
		return Key{}, fmt.Errorf("revoking key %s: %w", id, err)
	}
	return s.GetKey(ctx, id)
}

// SecretGeneration names the generation of a key's secret: what a token
// issued to a caller of that secret is bound to (see KeyGenerations). It is
// the secret's stored hash, so it changes with every rotation; it never
// leaves the server.
func SecretGeneration(secret string) string { return hashSecret(secret) }

// KeyGenerations returns the generations (SecretGeneration) of key id's
// secrets that authenticate at this moment: its current secret's and,
// during a rotation's grace, the one before's. A revoked, expired or
// unknown key has none, so whatever is bound to its secrets ends with it.
func (s *keyRows) KeyGenerations(ctx context.Context, id string) ([]string, error) {
	var (
		cur                             string
		old, oldUntil, expires, revoked sql.NullString
	)
	err := s.db.QueryRowContext(ctx, `SELECT secret_hash, old_secret_hash, old_secret_expires_at, expires_at, revoked_at
		FROM api_keys WHERE id = ?`, id).Scan(&cur, &old, &oldUntil, &expires, &revoked)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading the secrets of key %s: %w", id, err)
	}
	k := Key{ID: id}
	if k.ExpiresAt, err = parseTimePtr(expires); err != nil {
		return nil, fmt.Errorf("key %s: %w", id, err)
	}
	if k.RevokedAt, err = parseTimePtr(revoked); err != nil {
		return nil, fmt.Errorf("key %s: %w", id, err)
	}
	now := s.now()
	if !k.Active(now) {
		return nil, nil
	}
	gens := []string{cur}
	until, err := parseTimePtr(oldUntil)
	if err != nil {
		return nil, fmt.Errorf("key %s: %w", id, err)
	}
	if old.Valid && until != nil && now.Before(*until) {
		gens = append(gens, old.String)
	}
	return gens, nil
}

// SetKeyExpiry sets when key id stops working (nil: never).
func (s *keyRows) SetKeyExpiry(ctx context.Context, id string, expires *time.Time) (Key, error) {
	if _, err := s.db.ExecContext(ctx, `UPDATE api_keys SET expires_at = ? WHERE id = ?`, formatTimePtr(expires), id); err != nil {
		return Key{}, fmt.Errorf("setting the expiry of key %s: %w", id, err)
	}
	return s.GetKey(ctx, id)
}

// RotateKey gives key id a new secret and returns it. The key keeps its
// id, so its sandboxes stay its own; the old secret keeps working for
// grace (0: not at all). A revoked key cannot be rotated.
func (s *keyRows) RotateKey(ctx context.Context, id string, grace time.Duration) (Key, string, error) {
	secret, err := newSecret()
	if err != nil {
		return Key{}, "", fmt.Errorf("rotating key %s: %w", id, err)
	}
	var oldHash, oldUntil any
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return Key{}, "", fmt.Errorf("rotating key %s: %w", id, err)
	}
	defer tx.Rollback()
	var cur string
	var revoked sql.NullString
	err = tx.QueryRowContext(ctx, `SELECT secret_hash, revoked_at FROM api_keys WHERE id = ?`, id).Scan(&cur, &revoked)
	if errors.Is(err, sql.ErrNoRows) {
		return Key{}, "", errdefs.New(errdefs.ErrNotFound, "key_not_found", "no key %q", id)
	}
	if err != nil {
		return Key{}, "", fmt.Errorf("rotating key %s: %w", id, err)
	}
	if revoked.Valid {
		return Key{}, "", errdefs.New(errdefs.ErrConflict, "key_revoked", "key %s is revoked", id)
	}
	if grace > 0 {
		oldHash, oldUntil = cur, formatTime(s.now().Add(grace))
	}
	if _, err := tx.ExecContext(ctx, `UPDATE api_keys SET secret_hash = ?, old_secret_hash = ?, old_secret_expires_at = ?
		WHERE id = ?`, hashSecret(secret), oldHash, oldUntil, id); err != nil {
		return Key{}, "", fmt.Errorf("rotating key %s: %w", id, err)
	}
	if err := tx.Commit(); err != nil {
		return Key{}, "", fmt.Errorf("rotating key %s: %w", id, err)
	}
	k, err := s.GetKey(ctx, id)
	return k, secret, err
}

// CountKeys returns the number of API keys.
func (s *keyRows) CountKeys(ctx context.Context) (int, error) {
	var n int
	if err := s.db.QueryRowContext(ctx, `SELECT count(*) FROM api_keys`).Scan(&n); err != nil {
		return 0, fmt.Errorf("counting keys: %w", err)
	}
	return n, nil
}

func scanKey(row interface{ Scan(...any) error }) (Key, error) {
	var (
		k                Key
		created          string
		expires, revoked sql.NullString
	)
	if err := row.Scan(&k.ID, &k.Name, &k.Role, &created, &expires, &revoked); err != nil {
		return Key{}, err
	}
	var err error
	if k.CreatedAt, err = parseTime(created); err != nil {
		return Key{}, fmt.Errorf("key %s: %w", k.ID, err)
	}
	if k.ExpiresAt, err = parseTimePtr(expires); err != nil {
		return Key{}, fmt.Errorf("key %s: %w", k.ID, err)
	}
	if k.RevokedAt, err = parseTimePtr(revoked); err != nil {
		return Key{}, fmt.Errorf("key %s: %w", k.ID, err)
	}
	return k, nil
}
