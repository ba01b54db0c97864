package store

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"fmt"

	"github.com/emberbox/emberbox/internal/errdefs"
	"github.com/emberbox/emberbox/internal/webhook"
)

// webhookRows are the store's methods on webhooks, their deliveries (the
// outbox) and the feed (feed.go).
type webhookRows struct{ *backend }

var (
	_ webhook.Records = (*Store)(nil)
	_ webhook.Outbox  = (*Store)(nil)
)

const webhookColumns = `id, owner_key_id, url, description, events, enabled, secret, previous_secret, previous_until,
	cursor, created_at, updated_at`

func scanWebhook(row rowScanner) (*webhook.Webhook, error) {
	var (
		w                webhook.Webhook
		events, prevTill sql.NullString
		created, updated string
	)
	if err := row.Scan(&w.ID, &w.Owner, &w.URL, &w.Description, &events, &w.Enabled, &w.Secret, &w.PreviousSecret,
		&prevTill, &w.Cursor, &created, &updated); err != nil {
		return nil, err
	}
	if err := unmarshalNullable(events, &w.Events); err != nil {
		return nil, fmt.Errorf("webhook %s: decoding events: %w", w.ID, err)
	}
	var err error
	if w.PreviousUntil, err = parseTimePtr(prevTill); err != nil {
		return nil, err
	}
	if w.CreatedAt, err = parseTime(created); err != nil {
		return nil, err
	}
	if w.UpdatedAt, err = parseTime(updated); err != nil {
		return nil, err
	}
	return &w, nil
}

func webhookNotFound(id string) error {
	return errdefs.New(errdefs.ErrNotFound, "webhook_not_found", "no webhook %s", id)
}

// webhookTable reads webhooks by id.
var webhookTable = newTable("webhook", "webhooks", webhookColumns, scanWebhook, webhookNotFound)

// CreateWebhook implements webhook.Store. The webhook's cursor is its
// owner's newest feed event: it receives what happens from now on.
func (s *webhookRows) CreateWebhook(ctx context.Context, w *webhook.Webhook) error {
	events, err := jsonOrNull(w.Events, w.Events == nil)
	if err != nil {
		return fmt.Errorf("creating webhook: encoding events: %w", err)
	}
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("creating webhook: %w", err)
	}
	defer tx.Rollback()
	if err := tx.QueryRowContext(ctx, `SELECT coalesce(max(seq), 0) FROM feed_events WHERE owner_key_id = ?`,
		w.Owner).Scan(&w.Cursor); err != nil {
		return fmt.Errorf("creating webhook: %w", err)
	}
	_, err = tx.ExecContext(ctx, `INSERT INTO webhooks (`+webhookColumns+`) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
		w.ID, w.Owner, w.URL, w.Description, events, w.Enabled, w.Secret, w.PreviousSecret, formatTimePtr(w.PreviousUntil),
		w.Cursor, formatTime(w.CreatedAt), formatTime(w.UpdatedAt))
	if err != nil {
		return fmt.Errorf("creating webhook: %w", err)
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("creating webhook: %w", err)
	}
	return nil
}

// GetWebhook implements webhook.Store.
func (s *webhookRows) GetWebhook(ctx context.Context, owner, id string) (*webhook.Webhook, error) {
	w, err := webhookTable.read(ctx, s.db, id)
	if err != nil {
		return nil, err
	}
	if w.Owner != owner {
		return nil, webhookNotFound(id)
	}
	return w, nil
}

// ListWebhooks implements webhook.Store: oldest first.
func (s *webhookRows) ListWebhooks(ctx context.Context, owner string) ([]*webhook.Webhook, error) {
	ws, err := queryRows(ctx, s.db, scanWebhook, `SELECT `+webhookColumns+` FROM webhooks
		WHERE owner_key_id = ? ORDER BY created_at, id`, owner)
	if err != nil {
		return nil, fmt.Errorf("listing webhooks: %w", err)
	}
	return ws, nil
}

// UpdateWebhook implements webhook.Store. ID, owner, cursor and creation
// time never change here.
func (s *webhookRows) UpdateWebhook(ctx context.Context, owner, id string, fn func(w *webhook.Webhook) error) (*webhook.Webhook, error) {
	var fnErr error
	w, err := webhookTable.update(ctx, s.db, id, func(_ *txHandle, w *webhook.Webhook) error {
		if w.Owner != owner {
			return webhookNotFound(id)
		}
		return nil
	}, func(w *webhook.Webhook) bool {
		fnErr = fn(w)
		return fnErr == nil
	}, func(tx *txHandle, w *webhook.Webhook) error {
		events, err := jsonOrNull(w.Events, w.Events == nil)
		if err != nil {
			return fmt.Errorf("updating webhook %s: encoding events: %w", id, err)
		}
		_, err = tx.ExecContext(ctx, `UPDATE webhooks SET url = ?, description = ?, events = ?, enabled = ?, secret = ?,
			previous_secret = ?, previous_until = ?, updated_at = ? WHERE id = ?`,
			w.URL, w.Description, events, w.Enabled, w.Secret, w.PreviousSecret, formatTimePtr(w.PreviousUntil),
			formatTime(w.UpdatedAt), id)
		if err != nil {
			return fmt.Errorf("updating webhook %s: %w", id, err)
		}
		return nil
	})
	if fnErr != nil {
		return nil, fnErr
	}
	if err != nil {
		if errdefs.IsNotFound(err) {
			return nil, webhookNotFound(id)
		}
		return nil, err
	}
	return w, nil
}

// DeleteWebhook implements webhook.Store: the webhook and its deliveries.
func (s *webhookRows) DeleteWebhook(ctx context.Context, owner, id string) (*webhook.Webhook, error) {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return nil, fmt.Errorf("deleting webhook %s: %w", id, err)
	}
	defer tx.Rollback()
	w, err := webhookTable.read(ctx, tx, id)
	if err != nil {
		return nil, err
	}
	if w.Owner != owner {
		return nil, webhookNotFound(id)
	}
	if _, err := tx.ExecContext(ctx, `DELETE FROM webhook_deliveries WHERE webhook_id = ?`, id); err != nil {
		return nil, fmt.Errorf("deleting webhook %s: %w", id, err)
	}
	if _, err := tx.ExecContext(ctx, `DELETE FROM webhooks WHERE id = ?`, id); err != nil {
		return nil, fmt.Errorf("deleting webhook %s: %w", id, err)
	}
	if err := tx.Commit(); err != nil {
		return nil, fmt.Errorf("deleting webhook %s: %w", id, err)
	}
	return w, nil
}

// newDeliveryID names a delivery.
func newDeliveryID() string {
	var b [10]byte
	_, _ = rand.Read(b[:])
	return "whd_" + hex.EncodeToString(b[:])
}

// FanOut implements webhook.Store. Each webhook's share is one
// transaction that inserts its deliveries and moves its cursor, so an
// event is given to a webhook once, whichever node of a cluster does it.
func (s *webhookRows) FanOut(ctx context.Context, limit, backlog int) (int, error) {
	ids, err := queryRows(ctx, s.db, scanString, `SELECT w.id FROM webhooks w WHERE w.enabled = 1
		AND EXISTS (SELECT 1 FROM feed_events e WHERE e.owner_key_id = w.owner_key_id AND e.seq > w.cursor)`)
	if err != nil {
		return 0, fmt.Errorf("fanning out events: %w", err)
	}
	made := 0
	for _, id := range ids {
		n, err := s.fanOutOne(ctx, id, limit, backlog)
		if err != nil {
			return made, err
		}
		made += n
	}
	return made, nil
}

func (s *webhookRows) fanOutOne(ctx context.Context, id string, limit, backlog int) (int, error) {
	// The whole write lock, not a scope: with it no transaction that
	// appends to the feed is open, so the cursor cannot pass a seq that
	// commits later (feed.go).
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return 0, fmt.Errorf("fanning out events to webhook %s: %w", id, err)
	}
	defer tx.Rollback()
	w, err := webhookTable.read(ctx, tx, id)
	if errdefs.IsNotFound(err) {
		return 0, nil // deleted meanwhile
	}
	if err != nil {
		return 0, err
	}
	var pending int
	if err := tx.QueryRowContext(ctx, `SELECT count(*) FROM webhook_deliveries WHERE webhook_id = ? AND state = 'pending'`,
		id).Scan(&pending); err != nil {
		return 0, fmt.Errorf("fanning out events to webhook %s: %w", id, err)
	}
	if !w.Enabled || pending >= backlog {
		return 0, nil // the events wait in the feed
	}
	events, err := queryRows(ctx, tx, scanFeedEvent, `SELECT `+feedColumns+` FROM feed_events
		WHERE owner_key_id = ? AND seq > ? ORDER BY seq LIMIT ?`, w.Owner, w.Cursor, min(limit, backlog-pending))
	if err != nil || len(events) == 0 {
		return 0, err
	}
	now, made := formatTime(s.now()), 0
	for _, e := range events {
		if !w.Wants(e.Type) {
			continue
		}
		_, err := tx.ExecContext(ctx, `INSERT INTO webhook_deliveries (id, webhook_id, owner_key_id, event_seq, event_type,
			resource_id, body, state, attempts, next_attempt_at, claimed_by, claimed_until, last_status, last_error,
			last_duration_ms, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, 'pending', 0, ?, '', '', 0, '', 0, ?)`,
			newDeliveryID(), id, w.Owner, e.Seq, e.Type, e.ResourceID, string(e.Body()), now, now)
		if err != nil {
			return 0, fmt.Errorf("fanning out event %d to webhook %s: %w", e.Seq, id, err)
		}
		made++
	}
	if _, err := tx.ExecContext(ctx, `UPDATE webhooks SET cursor = ? WHERE id = ?`, events[len(events)-1].Seq, id); err != nil {
		return 0, fmt.Errorf("fanning out events to webhook %s: %w", id, err)
	}
	if err := tx.Commit(); err != nil {
		return 0, fmt.Errorf("fanning out events to webhook %s: %w", id, err)
	}
	return made, nil
}
