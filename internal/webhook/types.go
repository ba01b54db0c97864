package webhook

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Event is one entry of a key's event feed.
type Event struct {
	Seq          int64  // increases with each event published; the id is evt_<Seq>
	Owner        string // the key whose resource it is
	Type         string // sandbox.stopped, snapshot.ready, ...
	ResourceType string // sandbox, snapshot, image, webhook
	ResourceID   string
	// Data is decoded from JSON: numbers come back as float64.
	Data map[string]any
	At   time.Time
}

// ID is the event's public id, the same in the feed and in every delivery
// of it, so a receiver can drop a delivery it already has.
func (e *Event) ID() string { return EventID(e.Seq) }

// EventID is the public id of the event numbered seq.
func EventID(seq int64) string { return "evt_" + strconv.FormatInt(seq, 10) }

// ParseEventID returns the number of a public event id, or false.
func ParseEventID(id string) (int64, bool) {
	s, ok := strings.CutPrefix(id, "evt_")
	if !ok {
		return 0, false
	}
	n, err := strconv.ParseInt(s, 10, 64)
	return n, err == nil && n > 0
}

// Webhook is where a key's events are sent.
type Webhook struct {
	ID          string
	Owner       string
	URL         string
	Description string
	// Events are the types it receives: exact names or a prefix ending in
	// ".*" (sandbox.*); nil receives every type.
	Events  []string
	Enabled bool
	// Secret signs every delivery; PreviousSecret signs beside it until
	// PreviousUntil, so a receiver can switch without missing one.
	Secret         string
	PreviousSecret string
	PreviousUntil  *time.Time
	// Cursor is the newest feed event the webhook has been given
	// deliveries for; a new webhook starts at the feed's newest event.
	Cursor    int64
	CreatedAt time.Time
	UpdatedAt time.Time
}

// Wants reports whether the webhook receives events of type typ.
func (w *Webhook) Wants(typ string) bool {
	if w.Events == nil {
		return true
	}
	for _, e := range w.Events {
		if e == typ || e == "*" {
			return true
		}
		if p, ok := strings.CutSuffix(e, "*"); ok && strings.HasSuffix(p, ".") && strings.HasPrefix(typ, p) {
			return true
		}
	}
	return false
}

// Secrets are the secrets that sign a delivery made at now: the current
// one first.
func (w *Webhook) Secrets(now time.Time) []string {
	s := []string{w.Secret}
	if w.PreviousSecret != "" && w.PreviousUntil != nil && now.Before(*w.PreviousUntil) {
		s = append(s, w.PreviousSecret)
	}
	return s
}

// Delivery states.
const (
	StatePending   = "pending"   // waiting for its next attempt (or in one)
	StateDelivered = "delivered" // the receiver answered 2xx
	StateFailed    = "failed"    // out of attempts, or a test that was refused
)

// Delivery is one event sent (or to be sent) to one webhook.
type Delivery struct {
	Seq       int64  // orders deliveries; the id is the public name
	ID        string // whd_…
	WebhookID string
	Owner     string
	EventSeq  int64
	EventType string
	// ResourceID orders deliveries: a webhook's deliveries for one
	// resource are sent one at a time, in order.
	ResourceID string
	// Body is the JSON sent, the same at every attempt.
	Body          []byte
	State         string
	Attempts      int
	NextAttemptAt time.Time
	// The last attempt's outcome: the status the receiver answered (0:
	// none), or why it could not be sent.
	LastStatus     int
	LastError      string
	LastDurationMs int64
	LastAttemptAt  *time.Time
	CreatedAt      time.Time
	DeliveredAt    *time.Time

	// Set on a claimed delivery: where it goes and what signs it.
	URL     string
	Secrets []string
}

// Attempt is the outcome of one attempt to send a delivery.
type Attempt struct {
	Status     int    // the receiver's HTTP status; 0 when none came
	Error      string // why it failed, for the delivery log
	DurationMs int64
	At         time.Time
}

// OK reports whether the receiver took the delivery (any 2xx).
func (a Attempt) OK() bool { return a.Status >= 200 && a.Status < 300 }

// FeedQuery selects a page of a key's feed, newest first.
type FeedQuery struct {
	Owner      string
	ResourceID string // "": every resource
	Type       string // exact type or a "<prefix>.*" pattern; "": every type
	Before     int64  // only events numbered below it; 0: from the newest
	Limit      int
}

// DeliveryQuery selects a page of a webhook's deliveries, newest first.
type DeliveryQuery struct {
	Owner     string
	WebhookID string
	State     string // "": every state
	Before    int64
	Limit     int
}

// Records are the webhooks and the feed in the store; *store.Store
// implements it. Every method that takes an owner reports another key's
// record as errdefs.ErrNotFound.
type Records interface {
	CreateWebhook(ctx context.Context, w *Webhook) error
	GetWebhook(ctx context.Context, owner, id string) (*Webhook, error)
	ListWebhooks(ctx context.Context, owner string) ([]*Webhook, error)
	// UpdateWebhook changes a webhook in one transaction: fn sees the
	// committed record and nothing is written if it returns an error.
	UpdateWebhook(ctx context.Context, owner, id string, fn func(w *Webhook) error) (*Webhook, error)
	// DeleteWebhook removes a webhook and its deliveries.
	DeleteWebhook(ctx context.Context, owner, id string) (*Webhook, error)
	// PublishEvent appends e to its owner's feed and sets its Seq.
	PublishEvent(ctx context.Context, e *Event) error
	ListFeed(ctx context.Context, q FeedQuery) ([]*Event, error)
}

// Outbox is the deliveries in the store; *store.Store implements it.
type Outbox interface {
	// FanOut gives each enabled webhook deliveries for the feed events
	// past its cursor that it wants, at most limit events per webhook, and
	// none to a webhook that already has backlog pending; it answers how
	// many deliveries it made.
	FanOut(ctx context.Context, limit, backlog int) (int, error)
	// ClaimDeliveries claims up to limit pending deliveries that are due
	// and first in line for their webhook and resource, until now+lease,
	// for claimer, and answers them with their URL and secrets.
	ClaimDeliveries(ctx context.Context, claimer string, lease time.Duration, limit int) ([]*Delivery, error)
	// ClaimDelivery claims one delivery of owner's, whatever its state,
	// unless another attempt at it is under way (errdefs.ErrConflict).
	ClaimDelivery(ctx context.Context, owner, id, claimer string, lease time.Duration) (*Delivery, error)
	// ReleaseClaims ends claimer's claims (at its start: a claim of a
	// killed process is not waited out).
	ReleaseClaims(ctx context.Context, claimer string) error
	// RecordAttempt records an attempt at delivery d: d's State,
	// NextAttemptAt and Attempts as the caller set them, a's outcome, and
	// the claim ended. A delivered one makes the webhook's other pending
	// deliveries due now: the receiver is back.
	RecordAttempt(ctx context.Context, d *Delivery, a Attempt) error
	// AddDelivery records a delivery made outside the feed (a test),
	// claimed by claimer until now+lease.
	AddDelivery(ctx context.Context, d *Delivery, claimer string, lease time.Duration) error
	GetDelivery(ctx context.Context, owner, id string) (*Delivery, error)
	ListDeliveries(ctx context.Context, q DeliveryQuery) ([]*Delivery, error)
	// PruneFeed deletes feed events and finished deliveries older than
	// before, and each webhook's finished deliveries beyond keep.
	PruneFeed(ctx context.Context, before time.Time, keep int) error
}

// EventJSON is the wire form of an event: a delivery's body and an entry
// of GET /v1/events.
type EventJSON struct {
	ID           string         `json:"id"`
	Type         string         `json:"type"`
	CreatedAt    string         `json:"createdAt"` // RFC 3339, UTC
	ResourceType string         `json:"resourceType"`
	ResourceID   string         `json:"resourceId"`
	Data         map[string]any `json:"data"`
}

// JSON is the wire form of e.
func (e *Event) JSON() EventJSON {
	data := e.Data
	if data == nil {
		data = map[string]any{}
	}
	return EventJSON{ID: e.ID(), Type: e.Type, CreatedAt: e.At.UTC().Format("2006-01-02T15:04:05.000Z07:00"),
		ResourceType: e.ResourceType, ResourceID: e.ResourceID, Data: data}
}

// Body is the body of every delivery of e.
func (e *Event) Body() []byte {
	b, err := json.Marshal(e.JSON())
	if err != nil {
		// Data came from JSON (the store) or from the server's own maps.
		panic(fmt.Sprintf("webhook: encoding event %d: %v", e.Seq, err))
	}
	return b
}
