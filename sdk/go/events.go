package emberbox

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"strconv"
	"time"
)

// Event is something that happened to a sandbox: created, ready,
// stopped, egress_refused, ...
type Event struct {
	ID      int64          `json:"id"`
	Type    string         `json:"type"`
	Message string         `json:"message"`
	Data    map[string]any `json:"data,omitempty"`
	At      time.Time      `json:"at"`
}

// EventsPage is one page of a sandbox's events, oldest first.
type EventsPage struct {
	Events []Event `json:"data"`
	// NextCursor reads the events before this page; "" when there are none.
	NextCursor string `json:"-"`
}

// Events reads the newest limit events of a sandbox (0: the server's
// default, 100) before cursor ("" for the newest), oldest first.
func (c *Client) Events(ctx context.Context, id string, limit int, cursor string) (*EventsPage, error) {
	if id == "" {
		return nil, errors.New("emberbox: no sandbox id")
	}
	q := url.Values{}
	if limit > 0 {
		q.Set("limit", strconv.Itoa(limit))
	}
	if cursor != "" {
		q.Set("cursor", cursor)
	}
	var page struct {
		Data       []Event `json:"data"`
		NextCursor *string `json:"nextCursor"`
	}
	if err := c.do(ctx, &request{method: http.MethodGet, path: sandboxPath(id, "/events"), query: q}, &page); err != nil {
		return nil, err
	}
	out := &EventsPage{Events: page.Data}
	if page.NextCursor != nil {
		out.NextCursor = *page.NextCursor
	}
	return out, nil
}
