package store

import (
	"context"
	"database/sql"
	"fmt"
	"strings"

	"github.com/emberbox/emberbox/internal/webhook"
)

// The feed (feed_events) is each key's account-wide event log, which
// GET /v1/events pages and webhooks are sent from. Its entries are written
// in the transaction that makes the change they report: a sandbox's trail
// entry of a type webhook.FromSandboxTrail names (AppendEvent), a
// snapshot's state (UpdateSnapshot), an image's outcome (FinishImage). So
// a change is never committed without its event, and the webhook outbox
// cannot miss one, whatever kills the server when.
//
// A seq is taken at insert, and transactions scoped to different
// sandboxes (engine.go's beginScoped) append at once, so a seq may commit
// after a greater one. The webhook fan-out, which pages by seq and must
// miss nothing, reads in a transaction that holds the whole write lock:
// no scoped transaction is then open, every seq taken is committed or
// gone, and its cursor never passes one that commits later. A reader
// outside that lock (ListFeed, GET /v1/events) can see an event appear
// below one it has listed.

// publish appends e to its owner's feed in tx and sets e.Seq.
func publish(ctx context.Context, tx *txHandle, e *webhook.Event) error {
	d, err := eventData(e.Data)
	if err != nil {
		return fmt.Errorf("publishing %s event: encoding data: %w", e.Type, err)
	}
	err = tx.QueryRowContext(ctx, `INSERT INTO feed_events (owner_key_id, type, resource_type, resource_id, data, at)
		VALUES (?, ?, ?, ?, ?, ?) RETURNING seq`, e.Owner, e.Type, e.ResourceType, e.ResourceID, d, formatTime(e.At)).Scan(&e.Seq)
	if err != nil {
		return fmt.Errorf("publishing %s event: %w", e.Type, err)
	}
	return nil
}

// publishFromTrail publishes the sandbox trail entry just appended in tx
// (data d, already encoded) when its type is one the feed carries.
func publishFromTrail(ctx context.Context, tx *txHandle, sandboxID, typ string, d any, at string) error {
	ft := webhook.FromSandboxTrail(typ)
	if ft == "" {
		return nil
	}
	_, err := tx.ExecContext(ctx, `INSERT INTO feed_events (owner_key_id, type, resource_type, resource_id, data, at)
		SELECT owner_key_id, ?, ?, id, ?, ? FROM sandboxes WHERE id = ?`, ft, webhook.ResourceSandbox, d, at, sandboxID)
	if err != nil {
		return fmt.Errorf("publishing %s event of sandbox %s: %w", ft, sandboxID, err)
	}
	return nil
}

// PublishEvent implements webhook.Store.
func (s *webhookRows) PublishEvent(ctx context.Context, e *webhook.Event) error {
	if e.At.IsZero() {
		e.At = s.now()
	}
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("publishing %s event: %w", e.Type, err)
	}
	defer tx.Rollback()
	if err := publish(ctx, tx, e); err != nil {
		return err
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("publishing %s event: %w", e.Type, err)
	}
	return nil
}

const feedColumns = `seq, owner_key_id, type, resource_type, resource_id, data, at`

func scanFeedEvent(row rowScanner) (*webhook.Event, error) {
	var (
		e    webhook.Event
		data sql.NullString
		at   string
	)
	if err := row.Scan(&e.Seq, &e.Owner, &e.Type, &e.ResourceType, &e.ResourceID, &data, &at); err != nil {
		return nil, err
	}
	if err := unmarshalNullable(data, &e.Data); err != nil {
		return nil, fmt.Errorf("event %d: decoding data: %w", e.Seq, err)
	}
	var err error
	if e.At, err = parseTime(at); err != nil {
		return nil, fmt.Errorf("event %d: %w", e.Seq, err)
	}
	return &e, nil
}

// ListFeed implements webhook.Store: a page of q.Owner's feed, newest
// first. An event whose transaction commits late can appear below one
// an earlier page listed (feed.go's note); the webhooks miss none.
func (s *webhookRows) ListFeed(ctx context.Context, q webhook.FeedQuery) ([]*webhook.Event, error) {
	where, args := []string{"owner_key_id = ?"}, []any{q.Owner}
	if q.ResourceID != "" {
		where, args = append(where, "resource_id = ?"), append(args, q.ResourceID)
	}
	if family, ok := strings.CutSuffix(q.Type, "*"); ok {
		// A family: the types that start with it, as a range of text
		// (LIKE would read wildcards in the prefix).
		where, args = append(where, "type >= ? AND type < ?"), append(args, family, family+"\U0010FFFF")
	} else if q.Type != "" {
		where, args = append(where, "type = ?"), append(args, q.Type)
	}
	if q.Before > 0 {
		where, args = append(where, "seq < ?"), append(args, q.Before)
	}
	limit := q.Limit
	if limit <= 0 {
		limit = DefaultListLimit
	}
	args = append(args, limit)
	events, err := queryRows(ctx, s.db, scanFeedEvent, `SELECT `+feedColumns+` FROM feed_events
		WHERE `+strings.Join(where, " AND ")+` ORDER BY seq DESC LIMIT ?`, args...)
	if err != nil {
		return nil, fmt.Errorf("listing events of key %s: %w", q.Owner, err)
	}
	return events, nil
}
