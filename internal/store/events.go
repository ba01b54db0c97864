package store

import (
	"context"
	"database/sql"
	"fmt"
	"time"
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
// sandbox sandboxID. An unknown sandbox is an error of class
// errdefs.ErrNotFound.
func (s *Store) AppendEvent(ctx context.Context, sandboxID, typ, message string, data map[string]any) error {
	d, err := jsonOrNull(data, data == nil)
	if err != nil {
		return fmt.Errorf("appending %s event to sandbox %s: encoding data: %w", typ, sandboxID, err)
	}
	_, err = s.db.ExecContext(ctx, `INSERT INTO sandbox_events (sandbox_id, type, message, data, at)
		VALUES (?, ?, ?, ?, ?)`, sandboxID, typ, message, d, formatTime(s.now()))
	if isForeignKeyViolation(err) {
		return fmt.Errorf("appending %s event: %w", typ, sandboxNotFound(sandboxID))
	}
	if err != nil {
		return fmt.Errorf("appending %s event to sandbox %s: %w", typ, sandboxID, err)
	}
	return nil
}

// ListEvents returns the latest limit events of sandbox sandboxID, oldest
// first; limit <= 0 means all of them. An unknown sandbox has no events.
func (s *Store) ListEvents(ctx context.Context, sandboxID string, limit int) ([]Event, error) {
	if limit <= 0 {
		limit = -1 // SQLite: no limit
	}
	rows, err := s.db.QueryContext(ctx, `SELECT id, type, message, data, at FROM (
			SELECT * FROM sandbox_events WHERE sandbox_id = ? ORDER BY id DESC LIMIT ?
		) ORDER BY id`, sandboxID, limit)
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
