package apistore

import (
	"context"

	"github.com/emberbox/emberbox/internal/api"
	"github.com/emberbox/emberbox/internal/store"
)

var _ api.Events = Events{}

// Events is the store's sandbox event logs as api.Events.
type Events struct{ Store *store.Store }

// ListEvents implements api.Events.
func (e Events) ListEvents(ctx context.Context, sandboxID string, before int64, limit int) ([]api.Event, error) {
	evs, err := e.Store.ListEventsBefore(ctx, sandboxID, before, limit)
	if err != nil {
		return nil, err
	}
	out := make([]api.Event, len(evs))
	for i, ev := range evs {
		out[i] = api.Event{ID: ev.ID, Type: ev.Type, Message: ev.Message, Data: ev.Data, At: ev.At}
	}
	return out, nil
}
