package api

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
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
	// ListEvents returns the newest limit events of a sandbox whose id is
	// below before (0: no bound), oldest first.
	ListEvents(ctx context.Context, sandboxID string, before int64, limit int) ([]Event, error)
}

const (
	defaultEventLimit = 100
	maxEventLimit     = 1000
	// maxEventPage bounds the bytes of one page, however many events it
	// holds; the rest come with nextCursor.
	maxEventPage = 1 << 20
)

type sandboxEventJSON struct {
	ID      int64          `json:"id"`
	Type    string         `json:"type"`
	Message string         `json:"message"`
	Data    map[string]any `json:"data,omitempty"`
	At      jsonTime       `json:"at"`
}

// listEvents answers GET /v1/sandboxes/{id}/events: what happened to the
// sandbox, refused egress included. A page holds the newest events before
// the cursor, oldest first, at most limit of them and maxEventPage bytes;
// nextCursor, when there are older ones, asks for the page before it.
func (s sandboxesAPI) listEvents(w http.ResponseWriter, r *http.Request, c *call) error {
	q := r.URL.Query()
	limit := defaultEventLimit
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > maxEventLimit {
			return invalid([]issue{{Path: "limit", Message: fmt.Sprintf("must be from 1 to %d", maxEventLimit)}})
		}
		limit = n
	}
	var before int64
	if v := q.Get("cursor"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 1 {
			return invalid([]issue{{Path: "cursor", Message: "must be a nextCursor of an earlier page"}})
		}
		before = n
	}
	// The owner check: another key's sandbox is not found.
	sb, err := s.mgr.Get(r.Context(), c.owner, r.PathValue("id"))
	if err != nil {
		return err
	}
	type page struct {
		Data       []json.RawMessage `json:"data"`
		NextCursor *string           `json:"nextCursor"`
	}
	out := page{Data: []json.RawMessage{}}
	if s.events != nil {
		// One more than asked tells whether older events remain.
		evs, err := s.events.ListEvents(r.Context(), sb.ID, before, limit+1)
		if err != nil {
			return err
		}
		more := len(evs) > limit
		if more {
			evs = evs[1:]
		}
		// Newest first until the page is full, then put back in order.
		size := 64 // the page's own bytes
		kept := 0
		for i := len(evs) - 1; i >= 0; i-- {
			e := evs[i]
			b, err := json.Marshal(sandboxEventJSON{ID: e.ID, Type: e.Type, Message: e.Message, Data: e.Data, At: jsonTime(e.At)})
			if err != nil {
				return err
			}
			if size+len(b)+1 > maxEventPage && kept > 0 {
				more = true
				break
			}
			size += len(b) + 1
			out.Data = append(out.Data, b)
			kept++
		}
		slices.Reverse(out.Data)
		if more && kept > 0 {
			next := strconv.FormatInt(evs[len(evs)-kept].ID, 10)
			out.NextCursor = &next
		}
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}
