package api

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"time"
)

// Event is one entry of a sandbox's event log (created, ready, stopped,
// egress_refused, ...), as the store keeps it.
type Event struct {
	ID      int64
	Type    string
	Message string
	Data    map[string]any
	At      time.Time
}

// Events reads sandboxes' event logs.
type Events interface {
	// ListEvents returns the newest limit events of a sandbox, oldest first.
	ListEvents(ctx context.Context, sandboxID string, limit int) ([]Event, error)
}

const (
	defaultEventLimit = 100
	maxEventLimit     = 1000
)

type sandboxEventJSON struct {
	ID      int64          `json:"id"`
	Type    string         `json:"type"`
	Message string         `json:"message"`
	Data    map[string]any `json:"data,omitempty"`
	At      jsonTime       `json:"at"`
}

// listEvents answers GET /v1/sandboxes/{id}/events: what happened to the
// sandbox, refused egress included.
func (s *server) listEvents(w http.ResponseWriter, r *http.Request, c *call) error {
	limit := defaultEventLimit
	if v := r.URL.Query().Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > maxEventLimit {
			return invalid([]issue{{Path: "limit", Message: fmt.Sprintf("must be from 1 to %d", maxEventLimit)}})
		}
		limit = n
	}
	// The owner check: another key's sandbox is not found.
	sb, err := s.mgr.Get(r.Context(), c.owner, r.PathValue("id"))
	if err != nil {
		return err
	}
	data := []sandboxEventJSON{}
	if s.events != nil {
		evs, err := s.events.ListEvents(r.Context(), sb.ID, limit)
		if err != nil {
			return err
		}
		for _, e := range evs {
			data = append(data, sandboxEventJSON{ID: e.ID, Type: e.Type, Message: e.Message, Data: e.Data, At: jsonTime(e.At)})
		}
	}
	writeJSON(w, http.StatusOK, map[string]any{"data": data})
	return nil
}
