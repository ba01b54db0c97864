package api

import (
	"net/http"
	"strconv"
	"time"

	"github.com/emberbox/emberbox/internal/webhook"
)

// Webhooks and the account's event feed (internal/webhook).

// webhooksAPI serves webhooks, their deliveries and the event feed.
type webhooksAPI struct{ *server }

// webhookJSON is the wire form of a webhook. Secret is shown once: in
// the answer of a create or a rotation.
type webhookJSON struct {
	ID          string   `json:"id"`
	URL         string   `json:"url"`
	Description string   `json:"description"`
	Events      []string `json:"events"` // ["*"]: every type
	Enabled     bool     `json:"enabled"`
	Secret      *string  `json:"secret,omitempty"`
	// PreviousSecretExpiresAt: a rotated-out secret signs beside the
	// new one until then.
	PreviousSecretExpiresAt *jsonTime `json:"previousSecretExpiresAt"`
	CreatedAt               jsonTime  `json:"createdAt"`
	UpdatedAt               jsonTime  `json:"updatedAt"`
}

func toWebhookJSON(w *webhook.Webhook) webhookJSON {
	events := w.Events
	if events == nil {
		events = []string{"*"}
	}
	j := webhookJSON{ID: w.ID, URL: w.URL, Description: w.Description, Events: events, Enabled: w.Enabled,
		CreatedAt: jsonTime(w.CreatedAt), UpdatedAt: jsonTime(w.UpdatedAt)}
	if w.PreviousSecret != "" && w.PreviousUntil != nil && time.Now().Before(*w.PreviousUntil) {
		j.PreviousSecretExpiresAt = optTime(w.PreviousUntil)
	}
	return j
}

// withSecret is the wire form of a webhook with its secret.
func withSecret(w *webhook.Webhook) webhookJSON {
	j := toWebhookJSON(w)
	j.Secret = &w.Secret
	return j
}

// deliveryJSON is the wire form of a delivery.
type deliveryJSON struct {
	ID             string    `json:"id"`
	WebhookID      string    `json:"webhookId"`
	EventID        string    `json:"eventId"`
	EventType      string    `json:"eventType"`
	ResourceID     string    `json:"resourceId"`
	State          string    `json:"state"`
	Attempts       int       `json:"attempts"`
	NextAttemptAt  *jsonTime `json:"nextAttemptAt"` // pending ones
	LastStatus     *int      `json:"lastStatus"`    // the receiver's HTTP status
	LastError      *string   `json:"lastError"`
	LastDurationMs *int64    `json:"lastDurationMs"`
	LastAttemptAt  *jsonTime `json:"lastAttemptAt"`
	CreatedAt      jsonTime  `json:"createdAt"`
	DeliveredAt    *jsonTime `json:"deliveredAt"`
}

func toDeliveryJSON(d *webhook.Delivery) deliveryJSON {
	j := deliveryJSON{ID: d.ID, WebhookID: d.WebhookID, EventID: webhook.EventID(d.EventSeq), EventType: d.EventType,
		ResourceID: d.ResourceID, State: d.State, Attempts: d.Attempts, LastError: optString(d.LastError),
		LastAttemptAt: optTime(d.LastAttemptAt), CreatedAt: jsonTime(d.CreatedAt), DeliveredAt: optTime(d.DeliveredAt)}
	if d.EventSeq == 0 {
		j.EventID = "" // a test: its event is not in the feed
	}
	if d.State == webhook.StatePending {
		j.NextAttemptAt = optTime(&d.NextAttemptAt)
	}
	if d.Attempts > 0 {
		j.LastStatus, j.LastDurationMs = &d.LastStatus, &d.LastDurationMs
	}
	return j
}

func toEventJSON(e *webhook.Event) webhook.EventJSON { return e.JSON() }

// hooks is the server's webhooks, or webhooks_unavailable.
func (s webhooksAPI) hooks() (*webhook.Service, error) {
	if s.webhooks == nil {
		return nil, newError(http.StatusNotImplemented, "webhooks_unavailable", "This server does not send webhooks.")
	}
	return s.webhooks, nil
}

type createWebhookRequest struct {
	URL         string   `json:"url"`
	Events      []string `json:"events"`
	Description string   `json:"description"`
}

func (s webhooksAPI) create(w http.ResponseWriter, r *http.Request, c *call) error {
	hs, err := s.hooks()
	if err != nil {
		return err
	}
	var req createWebhookRequest
	if err := decode(c, &req); err != nil {
		return err
	}
	h, err := hs.Create(r.Context(), c.owner, webhook.Spec{URL: req.URL, Events: req.Events, Description: req.Description})
	return reply(w, h, err, withSecret)
}

func (s webhooksAPI) list(w http.ResponseWriter, r *http.Request, c *call) error {
	hs, err := s.hooks()
	if err != nil {
		return err
	}
	list, err := hs.List(r.Context(), c.owner)
	return replyPage(w, list, "", err, toWebhookJSON)
}

func (s webhooksAPI) get(w http.ResponseWriter, r *http.Request, c *call) error {
	hs, err := s.hooks()
	if err != nil {
		return err
	}
	h, err := hs.Get(r.Context(), c.owner, r.PathValue("id"))
	return reply(w, h, err, toWebhookJSON)
}

type updateWebhookRequest struct {
	URL         *string   `json:"url"`
	Events      *[]string `json:"events"`
	Description *string   `json:"description"`
	Enabled     *bool     `json:"enabled"`
}

func (s webhooksAPI) update(w http.ResponseWriter, r *http.Request, c *call) error {
	hs, err := s.hooks()
	if err != nil {
		return err
	}
	var req updateWebhookRequest
	if err := decode(c, &req); err != nil {
		return err
	}
	h, err := hs.Change(r.Context(), c.owner, r.PathValue("id"),
		webhook.Update{URL: req.URL, Events: req.Events, Description: req.Description, Enabled: req.Enabled})
	return reply(w, h, err, toWebhookJSON)
}

type rotateSecretRequest struct {
	// KeepPreviousSeconds: how long the old secret still signs (default a
	// day, at most a week; 0 ends it now).
	KeepPreviousSeconds *int64 `json:"keepPreviousSeconds"`
}

func (s webhooksAPI) rotate(w http.ResponseWriter, r *http.Request, c *call) error {
	hs, err := s.hooks()
	if err != nil {
		return err
	}
	var req rotateSecretRequest
	if err := decode(c, &req); err != nil {
		return err
	}
	var keep *time.Duration
	if k := req.KeepPreviousSeconds; k != nil {
		if *k < 0 || *k > int64(webhook.MaxKeepPrevious/time.Second) {
			return invalid([]issue{{Path: "keepPreviousSeconds", Message: "must be from 0 to " +
				strconv.Itoa(int(webhook.MaxKeepPrevious/time.Second))}})
		}
		d := time.Duration(*k) * time.Second
		keep = &d
	}
	h, err := hs.RotateSecret(r.Context(), c.owner, r.PathValue("id"), keep)
	return reply(w, h, err, withSecret)
}

func (s webhooksAPI) delete(w http.ResponseWriter, r *http.Request, c *call) error {
	hs, err := s.hooks()
	if err != nil {
		return err
	}
	h, err := hs.Delete(r.Context(), c.owner, r.PathValue("id"))
	return reply(w, h, err, toWebhookJSON)
}

func (s webhooksAPI) test(w http.ResponseWriter, r *http.Request, c *call) error {
	hs, err := s.hooks()
	if err != nil {
		return err
	}
	d, err := hs.Test(r.Context(), c.owner, r.PathValue("id"))
	return reply(w, d, err, toDeliveryJSON)
}

// cursorParam reads a page cursor: the number of the last item of the
// previous page.
func cursorParam(v string, issues *[]issue) int64 {
	if v == "" {
		return 0
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n <= 0 {
		*issues = append(*issues, issue{Path: "cursor", Message: "must be the nextCursor of the previous page"})
	}
	return n
}

// nextCursor is the cursor after a full page whose last item is numbered
// last, or "" after the last page.
func nextCursor(n, limit int, last int64) string {
	if n < limit {
		return ""
	}
	return strconv.FormatInt(last, 10)
}

func (s webhooksAPI) deliveries(w http.ResponseWriter, r *http.Request, c *call) error {
	hs, err := s.hooks()
	if err != nil {
		return err
	}
	q := r.URL.Query()
	var issues []issue
	dq := webhook.DeliveryQuery{Owner: c.owner, WebhookID: r.PathValue("id"), State: q.Get("state"),
		Before: cursorParam(q.Get("cursor"), &issues), Limit: limitParam(q.Get("limit"), 50, &issues)}
	if len(issues) > 0 {
		return invalid(issues)
	}
	list, err := hs.Deliveries(r.Context(), dq)
	next := ""
	if len(list) > 0 {
		next = nextCursor(len(list), dq.Limit, list[len(list)-1].Seq)
	}
	return replyPage(w, list, next, err, toDeliveryJSON)
}

func (s webhooksAPI) retry(w http.ResponseWriter, r *http.Request, c *call) error {
	hs, err := s.hooks()
	if err != nil {
		return err
	}
	d, err := hs.Retry(r.Context(), c.owner, r.PathValue("id"))
	return reply(w, d, err, toDeliveryJSON)
}

// events answers GET /v1/events: the key's feed, newest first.
func (s webhooksAPI) events(w http.ResponseWriter, r *http.Request, c *call) error {
	if s.webhooks == nil {
		return newError(http.StatusNotImplemented, "events_unavailable", "This server keeps no event feed.")
	}
	q := r.URL.Query()
	var issues []issue
	fq := webhook.FeedQuery{Owner: c.owner, ResourceID: q.Get("resourceId"), Type: q.Get("type"),
		Before: cursorParam(q.Get("cursor"), &issues), Limit: limitParam(q.Get("limit"), 50, &issues)}
	if len(issues) > 0 {
		return invalid(issues)
	}
	list, err := s.webhooks.Events(r.Context(), fq)
	next := ""
	if len(list) > 0 {
		next = nextCursor(len(list), fq.Limit, list[len(list)-1].Seq)
	}
	return replyPage(w, list, next, err, toEventJSON)
}
