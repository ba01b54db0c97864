package emberbox

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"strconv"
	"time"
)

// Webhook is where a key's events are sent, each as a POST signed with
// Runtime-Signature.
type Webhook struct {
	ID          string   `json:"id"` // wh_…
	URL         string   `json:"url"`
	Description string   `json:"description"`
	Events      []string `json:"events"` // types or families (sandbox.*); ["*"]: every type
	Enabled     bool     `json:"enabled"`
	// Secret signs the deliveries. The server shows it once, in the answer
	// of CreateWebhook and of RotateWebhookSecret; "" elsewhere.
	Secret string `json:"secret,omitempty"`
	// PreviousSecretExpiresAt: a rotated-out secret signs beside the new
	// one until then; nil when none does.
	PreviousSecretExpiresAt *time.Time `json:"previousSecretExpiresAt"`
	CreatedAt               time.Time  `json:"createdAt"`
	UpdatedAt               time.Time  `json:"updatedAt"`
}

// WebhookDelivery is one event sent (or to be sent) to one webhook, with
// how its last attempt went.
type WebhookDelivery struct {
	ID         string `json:"id"`
	WebhookID  string `json:"webhookId"`
	EventID    string `json:"eventId"` // "" for a test: its event is not in the feed
	EventType  string `json:"eventType"`
	ResourceID string `json:"resourceId"`
	State      string `json:"state"` // pending|delivered|failed
	Attempts   int    `json:"attempts"`
	// NextAttemptAt is when a pending delivery is tried again.
	NextAttemptAt *time.Time `json:"nextAttemptAt"`
	// LastStatus is the receiver's HTTP status at the last attempt (0 when
	// it did not answer); nil before the first.
	LastStatus     *int       `json:"lastStatus"`
	LastError      *string    `json:"lastError"`
	LastDurationMs *int64     `json:"lastDurationMs"`
	LastAttemptAt  *time.Time `json:"lastAttemptAt"`
	CreatedAt      time.Time  `json:"createdAt"`
	DeliveredAt    *time.Time `json:"deliveredAt"`
}

// AccountEvent is an entry of a key's event feed (GET /v1/events), the
// body of every delivery of it: sandbox.created, snapshot.ready, ... It
// is not a sandbox's own Event, which Events reads.
type AccountEvent struct {
	ID           string         `json:"id"` // the same at every delivery: drop duplicates by it
	Type         string         `json:"type"`
	CreatedAt    time.Time      `json:"createdAt"`
	ResourceType string         `json:"resourceType"` // sandbox|snapshot|image|webhook
	ResourceID   string         `json:"resourceId"`
	Data         map[string]any `json:"data"`
}

// WebhookSpec is a new webhook.
type WebhookSpec struct {
	URL string `json:"url"`
	// Events are the types it receives, or families such as sandbox.*;
	// nil: every type.
	Events      []string `json:"events,omitempty"`
	Description string   `json:"description,omitempty"`
}

// WebhookUpdate changes a webhook; nil fields stay as they are.
type WebhookUpdate struct {
	URL *string `json:"url,omitempty"`
	// Events replace the types it receives when not nil (["*"]: every type).
	Events      []string `json:"events,omitempty"`
	Description *string  `json:"description,omitempty"`
	Enabled     *bool    `json:"enabled,omitempty"`
}

// webhookPath is the path of webhook id, and what follows it.
func webhookPath(id, suffix string) string {
	return "/v1/webhooks/" + url.PathEscape(id) + suffix
}

// webhookCall posts a call about webhook id and decodes its answer into out.
func (c *Client) webhookCall(ctx context.Context, id, suffix string, body, out any) error {
	if id == "" {
		return errors.New("emberbox: no webhook id")
	}
	r, err := jsonRequest(http.MethodPost, webhookPath(id, suffix), body)
	if err != nil {
		return err
	}
	return c.do(ctx, r, out)
}

// CreateWebhook makes a webhook that is sent this key's events. Keep the
// answer's Secret: it verifies the deliveries, and it is shown this once.
// A key has at most 20 webhooks; receivers on private addresses are refused
// unless the server allows them.
func (c *Client) CreateWebhook(ctx context.Context, spec WebhookSpec) (*Webhook, error) {
	if spec.URL == "" {
		return nil, errors.New("emberbox: no webhook URL")
	}
	r, err := jsonRequest(http.MethodPost, "/v1/webhooks", spec)
	if err != nil {
		return nil, err
	}
	var wh Webhook
	if err := c.do(ctx, r, &wh); err != nil {
		return nil, err
	}
	return &wh, nil
}

// ListWebhooks lists this key's webhooks, oldest first, without secrets.
func (c *Client) ListWebhooks(ctx context.Context) ([]Webhook, error) {
	var page struct {
		Data []Webhook `json:"data"`
	}
	if err := c.do(ctx, &request{method: http.MethodGet, path: "/v1/webhooks"}, &page); err != nil {
		return nil, err
	}
	return page.Data, nil
}

// GetWebhook reads a webhook (without its secret); one that is not there
// is a 404 (see IsNotFound).
func (c *Client) GetWebhook(ctx context.Context, id string) (*Webhook, error) {
	if id == "" {
		return nil, errors.New("emberbox: no webhook id")
	}
	var wh Webhook
	if err := c.do(ctx, &request{method: http.MethodGet, path: webhookPath(id, "")}, &wh); err != nil {
		return nil, err
	}
	return &wh, nil
}

// UpdateWebhook changes a webhook's URL, events, description or whether it
// is enabled, and answers it as it then is.
func (c *Client) UpdateWebhook(ctx context.Context, id string, u WebhookUpdate) (*Webhook, error) {
	var wh Webhook
	if err := c.webhookCall(ctx, id, ":update", u, &wh); err != nil {
		return nil, err
	}
	return &wh, nil
}

// RotateWebhookSecret gives a webhook a new secret and answers it with it,
// shown this once. The old secret signs beside the new one for
// keepPrevious (whole seconds, rounded up; at most a week; 0 ends it now),
// or for the server's default of a day when keepPrevious is nil, so that
// receivers can switch without refusing a delivery.
func (c *Client) RotateWebhookSecret(ctx context.Context, id string, keepPrevious *time.Duration) (*Webhook, error) {
	var body struct {
		KeepPreviousSeconds *int64 `json:"keepPreviousSeconds,omitempty"`
	}
	if keepPrevious != nil {
		if *keepPrevious < 0 {
			return nil, errors.New("emberbox: keepPrevious must not be negative")
		}
		secs := int64((*keepPrevious + time.Second - 1) / time.Second)
		body.KeepPreviousSeconds = &secs
	}
	var wh Webhook
	if err := c.webhookCall(ctx, id, ":rotate-secret", body, &wh); err != nil {
		return nil, err
	}
	return &wh, nil
}

// DeleteWebhook deletes a webhook and its deliveries.
func (c *Client) DeleteWebhook(ctx context.Context, id string) error {
	return c.webhookCall(ctx, id, ":delete", struct{}{}, nil)
}

// TestWebhook sends a signed webhook.test to the webhook now, once, and
// answers the delivery with how the receiver answered (State failed, with
// LastStatus and LastError, when it refused).
func (c *Client) TestWebhook(ctx context.Context, id string) (*WebhookDelivery, error) {
	var d WebhookDelivery
	if err := c.webhookCall(ctx, id, ":test", struct{}{}, &d); err != nil {
		return nil, err
	}
	return &d, nil
}

// DeliveriesOptions choose a page of a webhook's deliveries.
type DeliveriesOptions struct {
	State  string // pending|delivered|failed; "": every state
	Limit  int    // 1..100; 0: the server's default, 50
	Cursor string // NextCursor of the previous page; "": the newest
}

// WebhookDeliveriesPage is one page of a webhook's deliveries, newest
// first.
type WebhookDeliveriesPage struct {
	Deliveries []WebhookDelivery `json:"data"`
	// NextCursor reads the deliveries before this page; "" when there are
	// none.
	NextCursor string `json:"-"`
}

// ListWebhookDeliveries reads a page of a webhook's deliveries, newest
// first.
func (c *Client) ListWebhookDeliveries(ctx context.Context, id string, o DeliveriesOptions) (*WebhookDeliveriesPage, error) {
	if id == "" {
		return nil, errors.New("emberbox: no webhook id")
	}
	q := pageQuery(o.Limit, o.Cursor)
	if o.State != "" {
		q.Set("state", o.State)
	}
	var page struct {
		Data       []WebhookDelivery `json:"data"`
		NextCursor *string           `json:"nextCursor"`
	}
	if err := c.do(ctx, &request{method: http.MethodGet, path: webhookPath(id, "/deliveries"), query: q}, &page); err != nil {
		return nil, err
	}
	return &WebhookDeliveriesPage{Deliveries: page.Data, NextCursor: deref(page.NextCursor)}, nil
}

// RetryWebhookDelivery sends a delivery again, once, now, and answers it as
// it then is.
func (c *Client) RetryWebhookDelivery(ctx context.Context, deliveryID string) (*WebhookDelivery, error) {
	if deliveryID == "" {
		return nil, errors.New("emberbox: no delivery id")
	}
	r, err := jsonRequest(http.MethodPost, "/v1/webhook-deliveries/"+url.PathEscape(deliveryID)+":retry", struct{}{})
	if err != nil {
		return nil, err
	}
	var d WebhookDelivery
	if err := c.do(ctx, r, &d); err != nil {
		return nil, err
	}
	return &d, nil
}

// AccountEventsOptions choose a page of the key's event feed.
type AccountEventsOptions struct {
	ResourceID string // only the events of this sandbox, snapshot or image
	Type       string // only this type, or a family such as sandbox.*
	Limit      int    // 1..100; 0: the server's default, 50
	Cursor     string // NextCursor of the previous page; "": the newest
}

// AccountEventsPage is one page of the key's event feed, newest first.
type AccountEventsPage struct {
	Events []AccountEvent `json:"data"`
	// NextCursor reads the events before this page; "" when there are none.
	NextCursor string `json:"-"`
}

// ListAccountEvents reads a page of the key's event feed (its sandboxes',
// snapshots' and images' events, kept 14 days), newest first: what its
// webhooks are sent, for a program that would rather poll.
func (c *Client) ListAccountEvents(ctx context.Context, o AccountEventsOptions) (*AccountEventsPage, error) {
	q := pageQuery(o.Limit, o.Cursor)
	if o.ResourceID != "" {
		q.Set("resourceId", o.ResourceID)
	}
	if o.Type != "" {
		q.Set("type", o.Type)
	}
	var page struct {
		Data       []AccountEvent `json:"data"`
		NextCursor *string        `json:"nextCursor"`
	}
	if err := c.do(ctx, &request{method: http.MethodGet, path: "/v1/events", query: q}, &page); err != nil {
		return nil, err
	}
	return &AccountEventsPage{Events: page.Data, NextCursor: deref(page.NextCursor)}, nil
}

// pageQuery is the query of a page: limit (0: the server's default) and
// cursor ("" for the first page).
func pageQuery(limit int, cursor string) url.Values {
	q := url.Values{}
	if limit > 0 {
		q.Set("limit", strconv.Itoa(limit))
	}
	if cursor != "" {
		q.Set("cursor", cursor)
	}
	return q
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}
