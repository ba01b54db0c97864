package webhook

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"math/rand/v2"
	"net/http"
	"strconv"
	"time"

	"github.com/emberbox/emberbox/internal/errdefs"
	"github.com/emberbox/emberbox/internal/faultpoint"
)

// How deliveries are sent.
const (
	// attemptTimeout bounds one attempt: connect, send, and the answer's
	// status and headers.
	attemptTimeout = 10 * time.Second
	// claimLease is how long a claim holds a delivery: longer than an
	// attempt, so no other sender takes it while it is under way.
	claimLease = 3 * attemptTimeout
	// maxInFlight bounds the attempts under way at once.
	maxInFlight = 8
	// RetryFor is how long a delivery is retried before it fails.
	RetryFor = 24 * time.Hour
	// firstBackoff is the wait after the first failed attempt; each
	// failure doubles it, up to maxBackoff.
	firstBackoff = 5 * time.Second
	maxBackoff   = time.Hour
	// fanOutBatch bounds the events one pass gives each webhook, and
	// maxBacklog the pending deliveries a webhook may have before it is
	// given more (the rest wait in the feed).
	fanOutBatch = 500
	maxBacklog  = 10000
	// Events and finished deliveries are kept FeedRetention, and at most
	// keepDeliveries finished ones per webhook.
	FeedRetention  = 14 * 24 * time.Hour
	keepDeliveries = 10000
	pollEvery      = time.Second
	pruneEvery     = time.Hour
	// maxAnswerRead bounds what is read of a receiver's answer (and
	// dropped) so that its connection can be reused.
	maxAnswerRead = 64 << 10
)

// Run sends deliveries until ctx ends: it gives webhooks the new events of
// the feed, sends what is due, and prunes what is past keeping.
func (s *Service) Run(ctx context.Context) {
	if err := s.cfg.Outbox.ReleaseClaims(ctx, s.cfg.Claimer); err != nil {
		s.log.Warn("releasing the claims of an earlier run", "err", err)
	}
	slots := make(chan struct{}, maxInFlight)
	done := make(chan struct{}, maxInFlight)
	tick := time.NewTicker(pollEvery)
	defer tick.Stop()
	var pruned time.Time
	for {
		if now := s.cfg.Now(); now.Sub(pruned) >= pruneEvery {
			pruned = now
			if err := s.cfg.Outbox.PruneFeed(ctx, now.Add(-FeedRetention), keepDeliveries); err != nil {
				s.log.Warn("pruning the event feed", "err", err)
			}
		}
		if _, err := s.cfg.Outbox.FanOut(ctx, fanOutBatch, maxBacklog); err != nil && ctx.Err() == nil {
			s.log.Warn("fanning out events", "err", err)
		}
		s.sendDue(ctx, slots, done)
		select {
		case <-ctx.Done():
			for range len(slots) {
				<-done // let the attempts under way record themselves
			}
			return
		case <-tick.C:
		case <-s.kick:
		case <-done:
			// A finished delivery may let the next of its resource go.
		}
	}
}

// sendDue claims what is due, as far as there are free slots, and sends
// each on its own goroutine.
func (s *Service) sendDue(ctx context.Context, slots chan struct{}, done chan struct{}) {
	free := cap(slots) - len(slots)
	if free == 0 {
		return
	}
	due, err := s.cfg.Outbox.ClaimDeliveries(ctx, s.cfg.Claimer, claimLease, free)
	if err != nil {
		if ctx.Err() == nil {
			s.log.Warn("claiming deliveries", "err", err)
		}
		return
	}
	for _, d := range due {
		slots <- struct{}{}
		go func() {
			defer func() { <-slots; done <- struct{}{} }()
			s.deliver(context.WithoutCancel(ctx), d)
		}()
	}
}

// deliver makes one attempt at d and records it with d's next step:
// delivered, another attempt after a backoff, or failed after RetryFor.
func (s *Service) deliver(ctx context.Context, d *Delivery) {
	faultpoint.Hit("webhook.claimed")
	d.Secrets = s.open(d.Owner, d.WebhookID, d.Secrets)
	a := s.attempt(ctx, d)
	if a.OK() {
		faultpoint.Hit("webhook.sent")
	}
	d.Attempts++
	switch {
	case a.OK():
		d.State, d.DeliveredAt = StateDelivered, &a.At
	case a.At.Sub(d.CreatedAt) >= RetryFor:
		d.State = StateFailed
	default:
		d.NextAttemptAt = a.At.Add(backoff(s.cfg.FirstBackoff, d.Attempts))
	}
	if err := s.cfg.Outbox.RecordAttempt(ctx, d, a); err != nil {
		s.log.Warn("recording a delivery", "delivery_id", d.ID, "err", err)
	}
	s.log.Debug("delivery attempted", "delivery_id", d.ID, "webhook_id", d.WebhookID, "event_type", d.EventType,
		"status", a.Status, "state", d.State, "attempts", d.Attempts)
}

// backoff is the wait after the n-th failed attempt, ±10 %: first,
// doubled at each failure, at most maxBackoff.
func backoff(first time.Duration, n int) time.Duration {
	d := maxBackoff
	if n < 20 {
		d = min(first<<(n-1), maxBackoff)
	}
	return d + time.Duration((rand.Float64()*0.2-0.1)*float64(d))
}

// attempt POSTs d's body, signed now, to its URL.
func (s *Service) attempt(ctx context.Context, d *Delivery) Attempt {
	start := s.cfg.Now()
	ctx, cancel := context.WithTimeout(ctx, attemptTimeout)
	defer cancel()
	a := Attempt{At: start}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, d.URL, bytes.NewReader(d.Body))
	if err != nil {
		a.Error = err.Error()
		return a
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "Emberbox-Webhooks/1")
	req.Header.Set(SignatureHeader, Sign(d.Body, start.Unix(), d.Secrets))
	req.Header.Set("Runtime-Delivery-Id", d.ID)
	if d.EventSeq > 0 {
		req.Header.Set("Runtime-Event-Id", EventID(d.EventSeq))
	}
	req.Header.Set("Runtime-Event-Type", d.EventType)
	req.Header.Set("Runtime-Delivery-Attempt", strconv.Itoa(d.Attempts+1))
	resp, err := s.client.Do(req)
	a.DurationMs = s.cfg.Now().Sub(start).Milliseconds()
	if err != nil {
		a.Error = err.Error()
		if c := errdefs.Code(err); c != "" {
			a.Error = c + ": " + a.Error
		}
		return a
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, maxAnswerRead))
	resp.Body.Close()
	a.Status = resp.StatusCode
	if !a.OK() {
		a.Error = "the receiver answered " + resp.Status
	}
	return a
}

// Test sends a signed webhook.test to one of owner's webhooks now, records
// it among its deliveries, and answers the delivery as it ended: a test
// is sent once, never retried.
func (s *Service) Test(ctx context.Context, owner, id string) (*Delivery, error) {
	w, err := s.cfg.Records.GetWebhook(ctx, owner, id)
	if err != nil {
		return nil, err
	}
	now := s.cfg.Now().UTC()
	e := &Event{Owner: owner, Type: WebhookTest, ResourceType: ResourceWebhook, ResourceID: w.ID, At: now,
		Data: map[string]any{"message": "a test delivery of webhook " + w.ID}}
	d := &Delivery{WebhookID: w.ID, Owner: owner, EventType: WebhookTest, ResourceID: w.ID, State: StatePending}
	// A test is not in the feed: its event id is its own.
	body := e.JSON()
	body.ID = newID("evt_test_")
	d.Body, _ = json.Marshal(body)
	if err := s.cfg.Outbox.AddDelivery(ctx, d, s.cfg.Claimer, claimLease); err != nil {
		return nil, err
	}
	d.URL, d.Secrets = w.URL, s.open(owner, w.ID, w.Secrets(now))
	a := s.attempt(ctx, d)
	d.Attempts++
	d.State = StateFailed
	if a.OK() {
		d.State, d.DeliveredAt = StateDelivered, &a.At
	}
	d.LastStatus, d.LastError, d.LastDurationMs, d.LastAttemptAt = a.Status, a.Error, a.DurationMs, &a.At
	if err := s.cfg.Outbox.RecordAttempt(context.WithoutCancel(ctx), d, a); err != nil {
		return nil, err
	}
	return d, nil
}

// Retry sends one of owner's deliveries again, once, now, whatever its
// state, and answers it as it then is. A delivered one stays delivered;
// a failed one becomes delivered if the receiver takes it.
func (s *Service) Retry(ctx context.Context, owner, id string) (*Delivery, error) {
	d, err := s.cfg.Outbox.ClaimDelivery(ctx, owner, id, s.cfg.Claimer, claimLease)
	if err != nil {
		return nil, err
	}
	d.Secrets = s.open(d.Owner, d.WebhookID, d.Secrets)
	a := s.attempt(ctx, d)
	d.Attempts++
	if a.OK() {
		d.State, d.DeliveredAt = StateDelivered, &a.At
	}
	d.LastStatus, d.LastError, d.LastDurationMs, d.LastAttemptAt = a.Status, a.Error, a.DurationMs, &a.At
	if err := s.cfg.Outbox.RecordAttempt(context.WithoutCancel(ctx), d, a); err != nil {
		return nil, err
	}
	s.Kick()
	return d, nil
}
