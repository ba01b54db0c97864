package main

import (
	"context"
	"net/netip"

	"github.com/emberbox/emberbox/internal/egress"
	"github.com/emberbox/emberbox/internal/errdefs"
	"github.com/emberbox/emberbox/internal/webhook"
)

// openWebhooks makes the webhooks and starts their sender. Every node of a
// cluster sends: claims in the shared store keep two from sending one
// delivery at once.
func (s *server) openWebhooks(context.Context) error {
	// Tenants name the URL, so deliveries obey the egress rules' refusal
	// of private addresses unless the operator allows them.
	allowed := func(a netip.Addr) bool { return s.o.webhookAllowPrivate || !s.egress.op.Forbidden(a) }
	claimer := ""
	if s.isNode {
		claimer = s.o.cluster.nodeID
	}
	s.hooks = webhook.New(webhook.Config{Records: s.st, Outbox: s.st, Logger: s.log, Allowed: allowed, Claimer: claimer, Sealer: s.sealer,
		Transport: egress.GuardedTransport(allowed, refusedWebhookAddr)})
	s.bg.run(s.hooks.Run)
	// Egress secrets changed on another node reach this one's sandboxes.
	s.bg.run(s.secrets.Run)
	if s.cas != nil {
		s.bg.run(func(ctx context.Context) { s.cas.Run(ctx, caRefresh) })
	}
	return nil
}

func refusedWebhookAddr(what string, metadata bool) error {
	if metadata {
		return errdefs.New(errdefs.ErrInvalidArgument, "webhook_url_forbidden",
			"%s is a cloud metadata address, which this server never sends to", what)
	}
	return errdefs.New(errdefs.ErrInvalidArgument, "webhook_url_forbidden",
		"%s is a private, loopback or link-local address this server does not send webhooks to (--webhook-allow-private)", what)
}
