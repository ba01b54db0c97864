package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"math"
	"time"
	"unicode/utf8"

	"github.com/emberbox/emberbox/internal/sandbox"
)

// eventRows are the store's methods on the sandbox_events table.
type eventRows struct{ *backend }

// Bounds of the event log. A sandbox's log is a ring: appending beyond
// MaxEventsPerSandbox deletes the oldest, in the same transaction, so a
// tenant (or its guest) that makes events in a loop keeps a fixed number
// of rows. Messages and data are capped as they are stored.
const (
	MaxEventsPerSandbox = 1000
	MaxEventMessage     = 1024 // bytes
	MaxEventData        = 4096 // bytes of JSON
	// maxEventString caps each string in an event's data when the whole
	// is over MaxEventData.
	maxEventString = 256
)

// Event is one entry of a sandbox's audit trail.
type Event struct {
	ID        int64 // increases with each event appended
	SandboxID string
	Type      string
	Message   string
	// Data is decoded from JSON: numbers come back as float64.
	Data map[string]any
	At   time.Time
}

// AppendEvent adds an event, stamped with the current time, to the trail of
// sandbox sandboxID, and drops the sandbox's oldest events beyond
// MaxEventsPerSandbox. A message over MaxEventMessage bytes is cut; data
// whose JSON is over MaxEventData has its strings cut to 256 bytes, and is
// replaced by {"truncated": true} if that is not enough. An unknown
// sandbox is an error of class errdefs.ErrNotFound. An event of a type
// the account's feed carries is published to it in the same transaction.
func (s *eventRows) AppendEvent(ctx context.Context, sandboxID, typ, message string, data map[string]any) error {
	// Scoped to the sandbox: the ring reads and deletes its events only.
	tx, err := s.db.beginScoped(ctx, sandboxScope(sandboxID))
	if err != nil {
		return fmt.Errorf("appending %s event to sandbox %s: %w", typ, sandboxID, err)
	}
	defer tx.Rollback()
	if err := appendEvent(ctx, tx, sandboxID, typ, message, data, formatTime(s.now())); err != nil {
		return err
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("appending %s event to sandbox %s: %w", typ, sandboxID, err)
	}
	return nil
}

// appendEntries appends a change's trail entries in its transaction tx,
// stamped at (InsertSandbox, UpdateSandbox).
func appendEntries(ctx context.Context, tx *txHandle, sandboxID string, entries []*sandbox.TrailEntry, at string) error {
	for _, e := range entries {
		if err := appendEvent(ctx, tx, sandboxID, e.Type, e.Message, e.Data, at); err != nil {
			return err
		}
	}
	return nil
}

// appendEvent is AppendEvent's work in tx, stamped at.
func appendEvent(ctx context.Context, tx *txHandle, sandboxID, typ, message string, data map[string]any, at string) error {
	d, err := eventData(data)
	if err != nil {
		return fmt.Errorf("appending %s event to sandbox %s: encoding data: %w", typ, sandboxID, err)
	}
	_, err = tx.ExecContext(ctx, `INSERT INTO sandbox_events (sandbox_id, type, message, data, at)
		VALUES (?, ?, ?, ?, ?)`, sandboxID, Truncate(typ, 64), Truncate(message, MaxEventMessage), d, at)
	if isForeignKeyViolation(err) {
		return fmt.Errorf("appending %s event: %w", typ, sandboxNotFound(sandboxID))
	}
	if err != nil {
		return fmt.Errorf("appending %s event to sandbox %s: %w", typ, sandboxID, err)
	}
	// The ring: everything older than the newest MaxEventsPerSandbox goes.
	// The index (sandbox_id, id) makes this a short walk.
	_, err = tx.ExecContext(ctx, `DELETE FROM sandbox_events WHERE sandbox_id = ?1 AND id < (
		SELECT id FROM sandbox_events WHERE sandbox_id = ?1 ORDER BY id DESC LIMIT 1 OFFSET ?2)`,
		sandboxID, MaxEventsPerSandbox-1)
	if err != nil {
		return fmt.Errorf("appending %s event to sandbox %s: dropping old events: %w", typ, sandboxID, err)
	}
	// The feed's copy commits with the trail's, and goes last (feed.go).
	return publishFromTrail(ctx, tx, sandboxID, typ, d, at)
}

// eventData encodes data within MaxEventData bytes (or NULL for nil).
func eventData(data map[string]any) (any, error) {
	if data == nil {
		return nil, nil
	}
	b, err := json.Marshal(data)
	if err != nil {
		return nil, err
	}
	if len(b) <= MaxEventData {
		return string(b), nil
	}
	if b, err = json.Marshal(shorten(data)); err == nil && len(b) <= MaxEventData {
		return string(b), nil
	}
	return `{"truncated":true}`, nil
}

// shorten cuts the strings in v to maxEventString bytes and its lists to
// maxEventList elements.
func shorten(v any) any {
	const maxEventList = 16
	switch v := v.(type) {
	case string:
		return Truncate(v, maxEventString)
	case []string:
		out := make([]any, 0, min(len(v), maxEventList))
		for _, e := range v[:min(len(v), maxEventList)] {
			out = append(out, Truncate(e, maxEventString))
		}
		return out
	case []any:
		out := make([]any, 0, min(len(v), maxEventList))
		for _, e := range v[:min(len(v), maxEventList)] {
			out = append(out, shorten(e))
		}
		return out
	case map[string]any:
		out := make(map[string]any, len(v))
		for k, e := range v {
			out[Truncate(k, maxEventString)] = shorten(e)
		}
		return out
	}
	return v
}

// Truncate cuts s to at most n bytes, at a UTF-8 character boundary.
func Truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// ListEvents returns the latest limit events of sandbox sandboxID, oldest
// first; limit <= 0 means all of them. An unknown sandbox has no events.
func (s *eventRows) ListEvents(ctx context.Context, sandboxID string, limit int) ([]Event, error) {
	return s.ListEventsBefore(ctx, sandboxID, 0, limit)
}

// ListEventsBefore returns the latest limit events of sandbox sandboxID
// whose id is below before (0: no bound), oldest first; limit <= 0 means
// all of them. It is one page of a listing that goes back in time.
func (s *eventRows) ListEventsBefore(ctx context.Context, sandboxID string, before int64, limit int) ([]Event, error) {
	if limit <= 0 {
		limit = math.MaxInt64 // no limit, on either engine
	}
	if before <= 0 {
		before = 1<<63 - 1
	}
	rows, err := s.db.QueryContext(ctx, `SELECT id, type, message, data, at FROM (
			SELECT * FROM sandbox_events WHERE sandbox_id = ? AND id < ? ORDER BY id DESC LIMIT ?
		) AS e ORDER BY id`, sandboxID, before, limit)
	if err != nil {
		return nil, fmt.Errorf("listing events of sandbox %s: %w", sandboxID, err)
	}
	defer rows.Close()
	var events []Event
	for rows.Next() {
		var (
			e    = Event{SandboxID: sandboxID}
			data sql.NullString
			at   string
		)
		if err := rows.Scan(&e.ID, &e.Type, &e.Message, &data, &at); err != nil {
			return nil, fmt.Errorf("listing events of sandbox %s: %w", sandboxID, err)
		}
		if err := unmarshalNullable(data, &e.Data); err != nil {
			return nil, fmt.Errorf("listing events of sandbox %s: event %d: decoding data: %w", sandboxID, e.ID, err)
		}
		if e.At, err = parseTime(at); err != nil {
			return nil, fmt.Errorf("listing events of sandbox %s: event %d: %w", sandboxID, e.ID, err)
		}
		events = append(events, e)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("listing events of sandbox %s: %w", sandboxID, err)
	}
	return events, nil
}
