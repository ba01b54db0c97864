package apistore

import (
	"context"

	"github.com/emberbox/emberbox/internal/api"
	"github.com/emberbox/emberbox/internal/store"
)

var _ api.Idempotency = Idempotency{}

// Idempotency is the store's idempotency records as api.Idempotency.
type Idempotency struct{ Store *store.Store }

// Reserve implements api.Idempotency.
func (s Idempotency) Reserve(ctx context.Context, keyID, key, fingerprint string) (*api.IdempotentResult, bool, error) {
	rec, reserved, err := s.Store.ReserveIdempotency(ctx, keyID, key, fingerprint)
	if err != nil || rec == nil {
		return nil, reserved, err
	}
	return &api.IdempotentResult{Fingerprint: rec.Fingerprint, Status: rec.Status, ContentType: rec.ContentType,
		Body: rec.Body, SandboxID: rec.SandboxID, Omitted: rec.Omitted}, reserved, nil
}

// Complete implements api.Idempotency.
func (s Idempotency) Complete(ctx context.Context, keyID, key string, status int, contentType string, body []byte) error {
	return s.Store.CompleteIdempotency(ctx, keyID, key, status, contentType, body)
}

// Release implements api.Idempotency.
func (s Idempotency) Release(ctx context.Context, keyID, key string) error {
	return s.Store.ReleaseIdempotency(ctx, keyID, key)
}
