package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/emberbox/emberbox/internal/errdefs"
)

// idempotencyRows are the store's methods on the idempotency records.
type idempotencyRows struct{ *backend }

// IdempotencyTTL is how long an Idempotency-Key is remembered.
const IdempotencyTTL = 24 * time.Hour

// Bounds of the idempotency records. The SDKs send a fresh key with every
// call that is not a GET and retry within minutes, so keeping the newest
// records of each API key is enough; the oldest completed ones beyond
// either bound are deleted as new ones come.
const (
	// MaxIdempotencyBody is the largest answer kept for replay. A larger
	// one (an exec's output) is recorded without its body: a retry learns
	// that the request ran but gets no answer, and it does not run twice.
	MaxIdempotencyBody = 64 << 10
	// MaxIdempotencyPerKey is the most records one API key has.
	MaxIdempotencyPerKey = 10000
	// MaxIdempotencyBytesPerKey bounds the answers one API key has kept.
	MaxIdempotencyBytesPerKey = 64 << 20
)

// maxIdempotencyPerKey is MaxIdempotencyPerKey; short tests lower it.
var maxIdempotencyPerKey = MaxIdempotencyPerKey

// Idempotency is the remembered outcome of a request made with an
// Idempotency-Key, per API key.
type Idempotency struct {
	KeyID       string // the API key that made the request
	Key         string // the Idempotency-Key header
	Fingerprint string // identifies the request (method, path, body hash)
	Status      int    // HTTP status; 0 while the first request is still running
	ContentType string
	Body        []byte
	CreatedAt   time.Time
	// SandboxID is the sandbox a create with this key recorded. A record
	// with a SandboxID, a Status and no Body is an answer to render anew
	// from that sandbox: its request was cut short by a crash after the
	// sandbox was recorded (see ResolvePendingIdempotency).
	SandboxID string
	// Omitted is the size of an answer over MaxIdempotencyBody, which was
	// not kept: the request ran, and its answer cannot be replayed.
	Omitted int64
}

// idempotencyScope is the lock scope of API key keyID's idempotency
// records (engine.go's beginScoped): a transaction that reads them and
// writes on what it read (a reserve, a completion and its prune, a create
// that links its sandbox) takes it.
func idempotencyScope(keyID string) string { return "idempotency:" + keyID }

// ReserveIdempotency claims (keyID, key) for a request with the given
// fingerprint. If no record exists, or only one older than IdempotencyTTL, it
// records a pending one and returns reserved == true: the caller runs the
// request and then calls CompleteIdempotency or ReleaseIdempotency. Otherwise
// it returns the existing record, pending or complete, for the caller to
// replay or refuse (comparing fingerprints is the caller's job).
func (s *idempotencyRows) ReserveIdempotency(ctx context.Context, keyID, key, fingerprint string) (existing *Idempotency, reserved bool, err error) {
	// The read and the write are one step; scoped to the API key, whose
	// records alone it reads, writes and prunes.
	tx, err := s.db.beginScoped(ctx, idempotencyScope(keyID))
	if err != nil {
		return nil, false, fmt.Errorf("reserving idempotency key %q: %w", key, err)
	}
	defer tx.Rollback()

	now := s.now().UTC()
	var (
		rec       = Idempotency{KeyID: keyID, Key: key}
		created   string
		sandboxID sql.NullString
		omitted   sql.NullInt64
	)
	err = tx.QueryRowContext(ctx, `SELECT fingerprint, status, content_type, body, created_at, sandbox_id, omitted
		FROM idempotency WHERE key_id = ? AND key = ?`, keyID, key).
		Scan(&rec.Fingerprint, &rec.Status, &rec.ContentType, &rec.Body, &created, &sandboxID, &omitted)
	rec.SandboxID, rec.Omitted = sandboxID.String, omitted.Int64
	switch {
	case err == nil:
		if rec.CreatedAt, err = parseTime(created); err != nil {
			return nil, false, fmt.Errorf("reserving idempotency key %q: %w", key, err)
		}
		if now.Sub(rec.CreatedAt) < IdempotencyTTL {
			return &rec, false, nil
		}
		// Expired but not yet pruned: take it over below.
	case !errors.Is(err, sql.ErrNoRows):
		return nil, false, fmt.Errorf("reserving idempotency key %q: %w", key, err)
	}

	// An upsert, not INSERT OR REPLACE: the replaced row's delete would
	// not fire the trigger that counts the key's usage.
	_, err = tx.ExecContext(ctx, `INSERT INTO idempotency
		(key_id, key, fingerprint, status, content_type, body, created_at, sandbox_id, omitted)
		VALUES (?, ?, ?, 0, '', NULL, ?, NULL, NULL)
		ON CONFLICT (key_id, key) DO UPDATE SET fingerprint = excluded.fingerprint, status = 0,
			content_type = '', body = NULL, created_at = excluded.created_at, sandbox_id = NULL, omitted = NULL`,
		keyID, key, fingerprint, formatTime(now))
	if err != nil {
		return nil, false, fmt.Errorf("reserving idempotency key %q: %w", key, err)
	}
	if err := pruneIdempotencyKey(ctx, tx, keyID); err != nil {
		return nil, false, fmt.Errorf("reserving idempotency key %q: %w", key, err)
	}
	if err := tx.Commit(); err != nil {
		return nil, false, fmt.Errorf("reserving idempotency key %q: %w", key, err)
	}
	return nil, true, nil
}

// CompleteIdempotency stores the response of the request that reserved
// (keyID, key), for replay. status must be positive. A body over
// MaxIdempotencyBody is not kept, only its size (Idempotency.Omitted). The
// key's oldest records beyond MaxIdempotencyPerKey and
// MaxIdempotencyBytesPerKey are deleted in the same transaction. A missing
// record is an error of class errdefs.ErrNotFound.
func (s *idempotencyRows) CompleteIdempotency(ctx context.Context, keyID, key string, status int, contentType string, body []byte) error {
	if status <= 0 {
		return fmt.Errorf("completing idempotency key %q: status %d: %w", key, status, errdefs.ErrInvalidArgument)
	}
	var omitted any
	if len(body) > MaxIdempotencyBody {
		body, omitted = nil, int64(len(body))
	}
	tx, err := s.db.beginScoped(ctx, idempotencyScope(keyID))
	if err != nil {
		return fmt.Errorf("completing idempotency key %q: %w", key, err)
	}
	defer tx.Rollback()
	res, err := tx.ExecContext(ctx, `UPDATE idempotency SET status = ?, content_type = ?, body = ?, omitted = ?
		WHERE key_id = ? AND key = ?`, status, contentType, body, omitted, keyID, key)
	if err != nil {
		return fmt.Errorf("completing idempotency key %q: %w", key, err)
	}
	if n, err := res.RowsAffected(); err != nil {
		return fmt.Errorf("completing idempotency key %q: %w", key, err)
	} else if n == 0 {
		return fmt.Errorf("completing idempotency key %q: %w", key, errdefs.ErrNotFound)
	}
	if err := pruneIdempotencyKey(ctx, tx, keyID); err != nil {
		return fmt.Errorf("completing idempotency key %q: %w", key, err)
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("completing idempotency key %q: %w", key, err)
	}
	return nil
}

// pruneIdempotencyKey deletes the oldest completed records of keyID while
// it has more than MaxIdempotencyPerKey records or more than
// MaxIdempotencyBytesPerKey bytes of answers. Pending records count but
// stay: their requests are running. The usage row, kept by triggers, makes
// the common case (within bounds) one read.
func pruneIdempotencyKey(ctx context.Context, tx *txHandle, keyID string) error {
	for { // each round deletes at least one record or returns
		var records, bytes int64
		err := tx.QueryRowContext(ctx, `SELECT records, bytes FROM idempotency_usage WHERE key_id = ?`, keyID).
			Scan(&records, &bytes)
		if errors.Is(err, sql.ErrNoRows) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("reading the key's usage: %w", err)
		}
		n := records - int64(maxIdempotencyPerKey)
		if bytes > MaxIdempotencyBytesPerKey {
			n = max(n, 16)
		}
		if n <= 0 {
			return nil
		}
		res, err := tx.ExecContext(ctx, `DELETE FROM idempotency WHERE key_id = ?1 AND key IN (
			SELECT key FROM idempotency WHERE key_id = ?1 AND status <> 0 ORDER BY created_at LIMIT ?2)`, keyID, n)
		if err != nil {
			return fmt.Errorf("pruning the key's oldest records: %w", err)
		}
		if d, err := res.RowsAffected(); err != nil || d == 0 {
			return err // only pending records left
		}
	}
}

// ReleaseIdempotency drops a pending reservation so that a retry runs the
// request again (after a server error, say). Completed records are kept;
// releasing an unknown key is not an error.
func (s *idempotencyRows) ReleaseIdempotency(ctx context.Context, keyID, key string) error {
	_, err := s.db.execScoped(ctx, []string{idempotencyScope(keyID)}, `DELETE FROM idempotency WHERE key_id = ? AND key = ? AND status = 0`, keyID, key)
	if err != nil {
		return fmt.Errorf("releasing idempotency key %q: %w", key, err)
	}
	return nil
}

// PruneIdempotency deletes the records created before olderThan, pending or
// not, and returns how many it deleted.
func (s *idempotencyRows) PruneIdempotency(ctx context.Context, olderThan time.Time) (int64, error) {
	res, err := s.db.ExecContext(ctx, `DELETE FROM idempotency WHERE created_at < ?`, formatTime(olderThan))
	if err != nil {
		return 0, fmt.Errorf("pruning idempotency records: %w", err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return 0, fmt.Errorf("pruning idempotency records: %w", err)
	}
	return n, nil
}

// ResolvePendingIdempotency settles every pending record (status 0) at
// startup, when each was left by a process that died mid-request and would
// otherwise block its key until it expired: a record whose request had
// already recorded a sandbox (a create) becomes a completed answer with
// status 200 and no body, which the API renders from that sandbox, so the
// client's retry gets the same sandbox; every other one is deleted, so a
// retry runs again. It returns how many it resolved and released. No
// request of the running process may be in flight.
func (s *idempotencyRows) ResolvePendingIdempotency(ctx context.Context) (resolved, released int64, err error) {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return 0, 0, fmt.Errorf("resolving pending idempotency records: %w", err)
	}
	defer tx.Rollback()
	res, err := tx.ExecContext(ctx, `UPDATE idempotency SET status = 200, content_type = '', body = NULL
		WHERE status = 0 AND sandbox_id IS NOT NULL`)
	if err == nil {
		resolved, err = res.RowsAffected()
	}
	if err != nil {
		return 0, 0, fmt.Errorf("resolving pending idempotency records: %w", err)
	}
	res, err = tx.ExecContext(ctx, `DELETE FROM idempotency WHERE status = 0`)
	if err == nil {
		released, err = res.RowsAffected()
	}
	if err != nil {
		return 0, 0, fmt.Errorf("releasing pending idempotency records: %w", err)
	}
	if err := tx.Commit(); err != nil {
		return 0, 0, fmt.Errorf("resolving pending idempotency records: %w", err)
	}
	return resolved, released, nil
}
