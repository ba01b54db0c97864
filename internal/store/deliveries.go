package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/emberbox/emberbox/internal/errdefs"
	"github.com/emberbox/emberbox/internal/webhook"
)

// The outbox: webhook_deliveries holds one row per webhook and event,
// written by FanOut (webhooks.go). A sender claims a row for a while
// (claimed_by, claimed_until) before it sends, so two senders never send
// one at once; a claim of a sender that died runs out, or is released at
// its next start.

const deliveryColumns = `d.seq, d.id, d.webhook_id, d.owner_key_id, d.event_seq, d.event_type, d.resource_id, d.body,
	d.state, d.attempts, d.next_attempt_at, d.last_status, d.last_error, d.last_duration_ms, d.last_attempt_at,
	d.created_at, d.delivered_at`

func scanDelivery(row rowScanner) (*webhook.Delivery, error) {
	var (
		d                     webhook.Delivery
		body, next, created   string
		lastAttempt, deliverd sql.NullString
	)
	if err := row.Scan(&d.Seq, &d.ID, &d.WebhookID, &d.Owner, &d.EventSeq, &d.EventType, &d.ResourceID, &body,
		&d.State, &d.Attempts, &next, &d.LastStatus, &d.LastError, &d.LastDurationMs, &lastAttempt,
		&created, &deliverd); err != nil {
		return nil, err
	}
	d.Body = []byte(body)
	var err error
	if d.NextAttemptAt, err = parseTime(next); err != nil {
		return nil, err
	}
	if d.LastAttemptAt, err = parseTimePtr(lastAttempt); err != nil {
		return nil, err
	}
	if d.CreatedAt, err = parseTime(created); err != nil {
		return nil, err
	}
	if d.DeliveredAt, err = parseTimePtr(deliverd); err != nil {
		return nil, err
	}
	return &d, nil
}

func deliveryNotFound(id string) error {
	return errdefs.New(errdefs.ErrNotFound, "delivery_not_found", "no webhook delivery %s", id)
}

// ClaimDeliveries implements webhook.Store. A delivery is first in line
// when no delivery of the same webhook and resource before it is pending:
// a resource's events reach a receiver in order, one at a time.
func (s *webhookRows) ClaimDeliveries(ctx context.Context, claimer string, lease time.Duration, limit int) ([]*webhook.Delivery, error) {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return nil, fmt.Errorf("claiming webhook deliveries: %w", err)
	}
	defer tx.Rollback()
	now := s.now()
	due, err := queryRows(ctx, tx, scanDelivery, `SELECT `+deliveryColumns+` FROM webhook_deliveries d
		WHERE d.state = 'pending' AND d.next_attempt_at <= ? AND d.claimed_until < ?
		AND NOT EXISTS (SELECT 1 FROM webhook_deliveries e WHERE e.webhook_id = d.webhook_id
			AND e.resource_id = d.resource_id AND e.state = 'pending' AND e.seq < d.seq)
		ORDER BY d.next_attempt_at, d.seq LIMIT ?`, formatTime(now), formatTime(now), limit)
	if err != nil {
		return nil, fmt.Errorf("claiming webhook deliveries: %w", err)
	}
	for _, d := range due {
		if err := claim(ctx, tx, d, claimer, now.Add(lease)); err != nil {
			return nil, err
		}
	}
	if err := tx.Commit(); err != nil {
		return nil, fmt.Errorf("claiming webhook deliveries: %w", err)
	}
	return due, nil
}

// claim marks d claimed by claimer until until, in tx, and fills in its
// webhook's URL and the secrets that sign it now.
func claim(ctx context.Context, tx *txHandle, d *webhook.Delivery, claimer string, until time.Time) error {
	w, err := webhookTable.read(ctx, tx, d.WebhookID)
	if err != nil {
		return fmt.Errorf("claiming webhook delivery %s: %w", d.ID, err)
	}
	if _, err := tx.ExecContext(ctx, `UPDATE webhook_deliveries SET claimed_by = ?, claimed_until = ? WHERE seq = ?`,
		claimer, formatTime(until), d.Seq); err != nil {
		return fmt.Errorf("claiming webhook delivery %s: %w", d.ID, err)
	}
	d.URL, d.Secrets = w.URL, w.Secrets(until)
	return nil
}

// ClaimDelivery implements webhook.Store.
func (s *webhookRows) ClaimDelivery(ctx context.Context, owner, id, claimer string, lease time.Duration) (*webhook.Delivery, error) {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return nil, fmt.Errorf("claiming webhook delivery %s: %w", id, err)
	}
	defer tx.Rollback()
	now := s.now()
	var until string
	d, err := scanDelivery(tx.QueryRowContext(ctx, `SELECT `+deliveryColumns+` FROM webhook_deliveries d WHERE d.id = ?`, id))
	if err == nil {
		err = tx.QueryRowContext(ctx, `SELECT claimed_until FROM webhook_deliveries WHERE seq = ?`, d.Seq).Scan(&until)
	}
	if errors.Is(err, sql.ErrNoRows) || (err == nil && d.Owner != owner) {
		return nil, deliveryNotFound(id)
	}
	if err != nil {
		return nil, fmt.Errorf("claiming webhook delivery %s: %w", id, err)
	}
	if until >= formatTime(now) {
		return nil, errdefs.New(errdefs.ErrConflict, "delivery_in_flight", "webhook delivery %s is being sent now", id)
	}
	if err := claim(ctx, tx, d, claimer, now.Add(lease)); err != nil {
		return nil, err
	}
	if err := tx.Commit(); err != nil {
		return nil, fmt.Errorf("claiming webhook delivery %s: %w", id, err)
	}
	return d, nil
}

// ReleaseClaims implements webhook.Store.
func (s *webhookRows) ReleaseClaims(ctx context.Context, claimer string) error {
	if _, err := s.db.ExecContext(ctx, `UPDATE webhook_deliveries SET claimed_until = '' WHERE claimed_by = ? AND claimed_until <> ''`,
		claimer); err != nil {
		return fmt.Errorf("releasing webhook delivery claims: %w", err)
	}
	return nil
}

// RecordAttempt implements webhook.Store.
func (s *webhookRows) RecordAttempt(ctx context.Context, d *webhook.Delivery, a webhook.Attempt) error {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("recording webhook delivery %s: %w", d.ID, err)
	}
	defer tx.Rollback()
	_, err = tx.ExecContext(ctx, `UPDATE webhook_deliveries SET state = ?, attempts = ?, next_attempt_at = ?,
		claimed_until = '', last_status = ?, last_error = ?, last_duration_ms = ?, last_attempt_at = ?, delivered_at = ?
		WHERE seq = ?`, d.State, d.Attempts, formatTime(d.NextAttemptAt), a.Status, Truncate(a.Error, 512), a.DurationMs,
		formatTime(a.At), formatTimePtr(d.DeliveredAt), d.Seq)
	if err != nil {
		return fmt.Errorf("recording webhook delivery %s: %w", d.ID, err)
	}
	if a.OK() {
		// The receiver is back: what waits for it goes now, not at the end
		// of its backoff.
		if _, err := tx.ExecContext(ctx, `UPDATE webhook_deliveries SET next_attempt_at = ?
			WHERE webhook_id = ? AND state = 'pending' AND next_attempt_at > ?`,
			formatTime(a.At), d.WebhookID, formatTime(a.At)); err != nil {
			return fmt.Errorf("recording webhook delivery %s: %w", d.ID, err)
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("recording webhook delivery %s: %w", d.ID, err)
	}
	return nil
}

// AddDelivery implements webhook.Store; it sets d.Seq.
func (s *webhookRows) AddDelivery(ctx context.Context, d *webhook.Delivery, claimer string, lease time.Duration) error {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("adding webhook delivery: %w", err)
	}
	defer tx.Rollback()
	now := s.now()
	d.ID, d.CreatedAt, d.NextAttemptAt = newDeliveryID(), now, now
	err = tx.QueryRowContext(ctx, `INSERT INTO webhook_deliveries (id, webhook_id, owner_key_id, event_seq, event_type,
		resource_id, body, state, attempts, next_attempt_at, claimed_by, claimed_until, last_status, last_error,
		last_duration_ms, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, 0, ?, ?, ?, 0, '', 0, ?) RETURNING seq`,
		d.ID, d.WebhookID, d.Owner, d.EventSeq, d.EventType, d.ResourceID, string(d.Body), d.State, formatTime(now),
		claimer, formatTime(now.Add(lease)), formatTime(now)).Scan(&d.Seq)
	if isForeignKeyViolation(err) {
		return webhookNotFound(d.WebhookID)
	}
	if err != nil {
		return fmt.Errorf("adding webhook delivery: %w", err)
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("adding webhook delivery: %w", err)
	}
	return nil
}

// GetDelivery implements webhook.Store.
func (s *webhookRows) GetDelivery(ctx context.Context, owner, id string) (*webhook.Delivery, error) {
	d, err := scanDelivery(s.db.QueryRowContext(ctx, `SELECT `+deliveryColumns+` FROM webhook_deliveries d WHERE d.id = ?`, id))
	if errors.Is(err, sql.ErrNoRows) || (err == nil && d.Owner != owner) {
		return nil, deliveryNotFound(id)
	}
	if err != nil {
		return nil, fmt.Errorf("reading webhook delivery %s: %w", id, err)
	}
	return d, nil
}

// ListDeliveries implements webhook.Store: newest first.
func (s *webhookRows) ListDeliveries(ctx context.Context, q webhook.DeliveryQuery) ([]*webhook.Delivery, error) {
	where, args := []string{"d.webhook_id = ?", "d.owner_key_id = ?"}, []any{q.WebhookID, q.Owner}
	if q.State != "" {
		where, args = append(where, "d.state = ?"), append(args, q.State)
	}
	if q.Before > 0 {
		where, args = append(where, "d.seq < ?"), append(args, q.Before)
	}
	limit := q.Limit
	if limit <= 0 {
		limit = DefaultListLimit
	}
	ds, err := queryRows(ctx, s.db, scanDelivery, `SELECT `+deliveryColumns+` FROM webhook_deliveries d
		WHERE `+strings.Join(where, " AND ")+` ORDER BY d.seq DESC LIMIT ?`, append(args, limit)...)
	if err != nil {
		return nil, fmt.Errorf("listing deliveries of webhook %s: %w", q.WebhookID, err)
	}
	return ds, nil
}

// PruneFeed implements webhook.Store. Pending deliveries stay whatever
// their age: the sender ends them.
func (s *webhookRows) PruneFeed(ctx context.Context, before time.Time, keep int) error {
	b := formatTime(before)
	if _, err := s.db.ExecContext(ctx, `DELETE FROM feed_events WHERE at < ?`, b); err != nil {
		return fmt.Errorf("pruning the event feed: %w", err)
	}
	if _, err := s.db.ExecContext(ctx, `DELETE FROM webhook_deliveries WHERE state <> 'pending' AND created_at < ?`, b); err != nil {
		return fmt.Errorf("pruning webhook deliveries: %w", err)
	}
	ids, err := queryRows(ctx, s.db, scanString, `SELECT id FROM webhooks`)
	if err != nil {
		return fmt.Errorf("pruning webhook deliveries: %w", err)
	}
	for _, id := range ids {
		_, err := s.db.ExecContext(ctx, `DELETE FROM webhook_deliveries WHERE webhook_id = ?1 AND state <> 'pending' AND seq < (
			SELECT seq FROM webhook_deliveries WHERE webhook_id = ?1 ORDER BY seq DESC LIMIT 1 OFFSET ?2)`, id, keep-1)
		if err != nil {
			return fmt.Errorf("pruning deliveries of webhook %s: %w", id, err)
		}
	}
	return nil
}
