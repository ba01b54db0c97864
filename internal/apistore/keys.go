package apistore

import (
	"context"

	"github.com/emberbox/emberbox/internal/api"
	"github.com/emberbox/emberbox/internal/store"
)

var (
	_ api.Keys      = Keys{}
	_ api.KeyLister = Keys{}
)

// Keys is the store's API keys as api.Keys and api.KeyLister, and as
// internal/e2b's Keys (which also asks for a key's secret generations).
type Keys struct{ Store *store.Store }

// Authenticate implements api.Keys.
func (k Keys) Authenticate(ctx context.Context, secret string) (api.Key, error) {
	key, err := k.Store.AuthenticateKey(ctx, secret)
	if err != nil {
		return api.Key{}, err
	}
	return api.Key{ID: key.ID, Role: key.Role, Generation: store.SecretGeneration(secret)}, nil
}

// Generations returns the generations of key id's secrets that
// authenticate now.
func (k Keys) Generations(ctx context.Context, id string) ([]string, error) {
	return k.Store.KeyGenerations(ctx, id)
}

// ListKeys implements api.KeyLister.
func (k Keys) ListKeys(ctx context.Context) ([]api.KeyInfo, error) {
	keys, err := k.Store.ListKeys(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]api.KeyInfo, len(keys))
	for i, key := range keys {
		out[i] = api.KeyInfo{ID: key.ID, Name: key.Name, Role: key.Role, CreatedAt: key.CreatedAt,
			ExpiresAt: key.ExpiresAt, RevokedAt: key.RevokedAt}
	}
	return out, nil
}
