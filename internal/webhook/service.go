package webhook

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"slices"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/emberbox/emberbox/internal/errdefs"
)

// Bounds of webhooks.
const (
	// MaxPerOwner bounds the webhooks of one key.
	MaxPerOwner = 20
	MaxURLLen   = 2048
	// MaxEvents bounds the types one webhook names.
	MaxEvents         = 32
	MaxDescriptionLen = 256
	// DefaultKeepPrevious is how long a rotated-out secret still signs
	// when the rotation does not say; MaxKeepPrevious bounds it.
	DefaultKeepPrevious = 24 * time.Hour
	MaxKeepPrevious     = 7 * 24 * time.Hour
)

// Config configures a Service.
type Config struct {
	// Records and Outbox are the store (*store.Store is both).
	Records Records
	Outbox  Outbox
	Logger  *slog.Logger // nil discards
	// Transport carries deliveries: egress.GuardedTransport, which
	// refuses the addresses Allowed refuses at every dial. Nil is
	// http.DefaultTransport (tests).
	Transport http.RoundTripper
	// Allowed reports whether a webhook may name an address; a URL with a
	// refused address literal is refused at create. Nil allows every one.
	Allowed func(netip.Addr) bool
	// Claimer names this process's claims on deliveries: its node id in a
	// cluster, "" on a server of its own.
	Claimer string
	// Now is the clock; nil is time.Now.
	Now func() time.Time
	// FirstBackoff is the wait after a first failed attempt, doubled at
	// each failure after it up to an hour; 0 is 5 s.
	FirstBackoff time.Duration
	// Sealer seals signing secrets before the store keeps them
	// (secrets.Sealer, under the key that seals egress secrets); nil
	// keeps them as they are.
	Sealer Sealer
}

// Sealer seals a value for an owner's named thing, and opens it.
type Sealer interface {
	Seal(owner, name, value string) string
	Open(owner, name, sealed string) (string, error)
}

// Service keeps webhooks and sends their deliveries; Run is its sender.
type Service struct {
	cfg    Config
	log    *slog.Logger
	client *http.Client
	kick   chan struct{}
}

// New returns a Service; whoever makes it runs its Run.
func New(cfg Config) *Service {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Transport == nil {
		cfg.Transport = http.DefaultTransport
	}
	if cfg.Allowed == nil {
		cfg.Allowed = func(netip.Addr) bool { return true }
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.FirstBackoff <= 0 {
		cfg.FirstBackoff = firstBackoff
	}
	client := &http.Client{Transport: cfg.Transport, Timeout: attemptTimeout,
		// A redirect is not a delivery: the receiver must answer itself.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	return &Service{cfg: cfg, log: cfg.Logger.With("component", "webhooks"), client: client, kick: make(chan struct{}, 1)}
}

// Spec is a new webhook.
type Spec struct {
	URL         string
	Events      []string // nil: every type
	Description string
}

// Update changes a webhook; nil fields stay as they are.
type Update struct {
	URL         *string
	Events      *[]string
	Description *string
	Enabled     *bool
}

// Create makes a webhook for owner and answers it with its secret.
func (s *Service) Create(ctx context.Context, owner string, spec Spec) (*Webhook, error) {
	if err := s.checkURL(spec.URL); err != nil {
		return nil, err
	}
	if err := checkEvents(spec.Events); err != nil {
		return nil, err
	}
	if err := checkDescription(spec.Description); err != nil {
		return nil, err
	}
	have, err := s.cfg.Records.ListWebhooks(ctx, owner)
	if err != nil {
		return nil, err
	}
	if len(have) >= MaxPerOwner {
		return nil, errdefs.New(errdefs.ErrConflict, "too_many_webhooks", "this key has %d webhooks, the most it may", len(have)).
			WithHint("delete one it no longer needs")
	}
	now := s.cfg.Now().UTC()
	secret := newSecret()
	w := &Webhook{ID: newID("wh_"), Owner: owner, URL: spec.URL, Description: spec.Description, Events: spec.Events,
		Enabled: true, CreatedAt: now, UpdatedAt: now}
	w.Secret = s.seal(w, secret)
	if err := s.cfg.Records.CreateWebhook(ctx, w); err != nil {
		return nil, err
	}
	s.log.Info("webhook created", "webhook_id", w.ID, "owner", owner)
	w.Secret = secret // shown once, in the answer
	return w, nil
}

// Get reads one of owner's webhooks.
func (s *Service) Get(ctx context.Context, owner, id string) (*Webhook, error) {
	return s.cfg.Records.GetWebhook(ctx, owner, id)
}

// List reads owner's webhooks, oldest first.
func (s *Service) List(ctx context.Context, owner string) ([]*Webhook, error) {
	return s.cfg.Records.ListWebhooks(ctx, owner)
}

// Change updates one of owner's webhooks. Enabling one that was disabled
// does not send what happened meanwhile: its cursor moved on.
func (s *Service) Change(ctx context.Context, owner, id string, u Update) (*Webhook, error) {
	if u.URL != nil {
		if err := s.checkURL(*u.URL); err != nil {
			return nil, err
		}
	}
	if u.Events != nil {
		if err := checkEvents(*u.Events); err != nil {
			return nil, err
		}
	}
	if u.Description != nil {
		if err := checkDescription(*u.Description); err != nil {
			return nil, err
		}
	}
	return s.cfg.Records.UpdateWebhook(ctx, owner, id, func(w *Webhook) error {
		if u.URL != nil {
			w.URL = *u.URL
		}
		if u.Events != nil {
			w.Events = *u.Events
		}
		if u.Description != nil {
			w.Description = *u.Description
		}
		if u.Enabled != nil {
			w.Enabled = *u.Enabled
		}
		w.UpdatedAt = s.cfg.Now().UTC()
		return nil
	})
}

// RotateSecret gives a webhook a new secret and answers it. The old one
// signs beside it for keep (nil: DefaultKeepPrevious; 0 ends it now).
func (s *Service) RotateSecret(ctx context.Context, owner, id string, keep *time.Duration) (*Webhook, error) {
	k := DefaultKeepPrevious
	if keep != nil {
		k = *keep
	}
	if k < 0 || k > MaxKeepPrevious {
		return nil, errdefs.New(errdefs.ErrInvalidArgument, "invalid_keep_previous",
			"keepPreviousSeconds must be between 0 and %d", int(MaxKeepPrevious/time.Second))
	}
	secret := newSecret()
	w, err := s.cfg.Records.UpdateWebhook(ctx, owner, id, func(w *Webhook) error {
		now := s.cfg.Now().UTC()
		w.PreviousSecret, w.PreviousUntil = "", nil
		if k > 0 {
			until := now.Add(k)
			w.PreviousSecret, w.PreviousUntil = w.Secret, &until
		}
		w.Secret, w.UpdatedAt = s.seal(w, secret), now
		return nil
	})
	if err != nil {
		return nil, err
	}
	w.Secret = secret // shown once, in the answer
	return w, nil
}

// sealPrefix marks a sealed signing secret; a plain one starts "whsec_".
const sealPrefix = "v1:"

// seal is secret as the store keeps it for w.
func (s *Service) seal(w *Webhook, secret string) string {
	if s.cfg.Sealer == nil {
		return secret
	}
	return s.cfg.Sealer.Seal(w.Owner, "webhook:"+w.ID, secret)
}

// open returns the signing secrets as kept for webhook id of owner, opened;
// one that does not open is left out (and logged).
func (s *Service) open(owner, id string, kept []string) []string {
	out := make([]string, 0, len(kept))
	for _, k := range kept {
		if s.cfg.Sealer == nil || !strings.HasPrefix(k, sealPrefix) {
			out = append(out, k)
			continue
		}
		v, err := s.cfg.Sealer.Open(owner, "webhook:"+id, k)
		if err != nil {
			s.log.Error("a webhook's signing secret does not open with this server's key", "webhook_id", id)
			continue
		}
		out = append(out, v)
	}
	return out
}

// Delete removes one of owner's webhooks and its deliveries.
func (s *Service) Delete(ctx context.Context, owner, id string) (*Webhook, error) {
	w, err := s.cfg.Records.DeleteWebhook(ctx, owner, id)
	if err == nil {
		s.log.Info("webhook deleted", "webhook_id", id, "owner", owner)
	}
	return w, err
}

// Events reads a page of q.Owner's feed, newest first.
func (s *Service) Events(ctx context.Context, q FeedQuery) ([]*Event, error) {
	if q.Type != "" {
		if err := checkEvents([]string{q.Type}); err != nil {
			return nil, err
		}
	}
	return s.cfg.Records.ListFeed(ctx, q)
}

// Deliveries reads a page of a webhook's deliveries, newest first.
func (s *Service) Deliveries(ctx context.Context, q DeliveryQuery) ([]*Delivery, error) {
	if _, err := s.cfg.Records.GetWebhook(ctx, q.Owner, q.WebhookID); err != nil {
		return nil, err
	}
	switch q.State {
	case "", StatePending, StateDelivered, StateFailed:
	default:
		return nil, errdefs.New(errdefs.ErrInvalidArgument, "invalid_state", "state must be pending, delivered or failed")
	}
	return s.cfg.Outbox.ListDeliveries(ctx, q)
}

// Publish adds an event to its owner's feed (events the store does not
// publish itself) and wakes the sender.
func (s *Service) Publish(ctx context.Context, e *Event) error {
	if err := s.cfg.Records.PublishEvent(ctx, e); err != nil {
		return err
	}
	s.Kick()
	return nil
}

// Kick wakes the sender: an event was published.
func (s *Service) Kick() {
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

func newID(prefix string) string {
	var b [10]byte
	_, _ = rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}

// checkURL refuses a webhook URL that is not http(s), carries
// credentials, or names an address literal this server does not send to.
// A name is checked again at every dial (Config.Transport).
func (s *Service) checkURL(raw string) error {
	bad := func(format string, args ...any) error {
		return errdefs.New(errdefs.ErrInvalidArgument, "invalid_webhook_url", format, args...)
	}
	if raw == "" {
		return bad("url is required")
	}
	if len(raw) > MaxURLLen || !utf8.ValidString(raw) {
		return bad("url must be at most %d bytes of UTF-8", MaxURLLen)
	}
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.Opaque != "" {
		return bad("url must be an absolute http or https URL")
	}
	if u.User != nil {
		return bad("url must not carry credentials: the signature proves who sent a delivery")
	}
	host := u.Hostname()
	a, err := netip.ParseAddr(host)
	if err != nil && (strings.EqualFold(host, "localhost") || strings.HasSuffix(strings.ToLower(host), ".localhost")) {
		a, err = netip.MustParseAddr("127.0.0.1"), nil
	}
	if err == nil && !s.cfg.Allowed(a.Unmap()) {
		return errdefs.New(errdefs.ErrInvalidArgument, "webhook_url_forbidden",
			"url names %s, a private, loopback or link-local address this server does not send to", host).
			WithHint("use a public address; the operator can allow private ones with --webhook-allow-private")
	}
	if _, _, err := net.SplitHostPort(u.Host); err != nil && strings.Contains(u.Host, ":") && !strings.HasPrefix(u.Host, "[") {
		return bad("url has a bad port")
	}
	return nil
}

// checkEvents refuses a list of event types that names an unknown type,
// or is too long.
func checkEvents(events []string) error {
	if len(events) > MaxEvents {
		return errdefs.New(errdefs.ErrInvalidArgument, "invalid_events", "events may name at most %d types", MaxEvents)
	}
	for _, e := range events {
		family, pattern := strings.CutSuffix(e, "*")
		known := slices.Contains(Types, e) || e == "*" ||
			(pattern && strings.HasSuffix(family, ".") && slices.ContainsFunc(Types, func(t string) bool { return strings.HasPrefix(t, family) }))
		if !known {
			return errdefs.New(errdefs.ErrInvalidArgument, "invalid_events",
				"%q is not an event type; types: %s, or a family such as sandbox.*", truncate(e, 64), strings.Join(Types, ", "))
		}
	}
	return nil
}

func checkDescription(d string) error {
	if len(d) > MaxDescriptionLen || !utf8.ValidString(d) || strings.ContainsFunc(d, unicode.IsControl) {
		return errdefs.New(errdefs.ErrInvalidArgument, "invalid_description",
			"description must be at most %d bytes of UTF-8 without control characters", MaxDescriptionLen)
	}
	return nil
}

// truncate cuts s to at most n bytes at a character boundary.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}
