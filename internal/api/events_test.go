package api

import (
	"context"
	"encoding/json"
	"net/http"
	"testing"
	"time"
)

type fakeEvents map[string][]Event

func (f fakeEvents) ListEvents(ctx context.Context, id string, limit int) ([]Event, error) {
	evs := f[id]
	if len(evs) > limit {
		evs = evs[len(evs)-limit:]
	}
	return evs, nil
}

func TestListEvents(t *testing.T) {
	e := newEnv(t)
	id := decodeBody[map[string]any](t, e.do("POST", "/v1/sandboxes", `{}`))["id"].(string)
	at := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	var evs []Event
	for i := range 5 {
		evs = append(evs, Event{ID: int64(i + 1), Type: "egress_refused", Message: "refused", At: at,
			Data: map[string]any{"reason": "rule-not-allowed"}})
	}
	e.s.events = fakeEvents{id: evs}

	w := e.do("GET", "/v1/sandboxes/"+id+"/events?limit=2", "")
	if w.Code != http.StatusOK {
		t.Fatalf("status %d: %s", w.Code, w.Body)
	}
	var got struct {
		Data []struct {
			ID   int64          `json:"id"`
			Type string         `json:"type"`
			Data map[string]any `json:"data"`
			At   string         `json:"at"`
		} `json:"data"`
	}
	if err := json.Unmarshal(w.Body.Bytes(), &got); err != nil {
		t.Fatal(err)
	}
	if len(got.Data) != 2 || got.Data[0].ID != 4 || got.Data[1].ID != 5 {
		t.Errorf("got %+v, want the newest two, oldest first", got.Data)
	}
	if got.Data[0].Data["reason"] != "rule-not-allowed" || got.Data[0].At != "2026-11-29T12:00:00.000Z" {
		t.Errorf("event = %+v", got.Data[0])
	}
	if w := e.do("GET", "/v1/sandboxes/"+id+"/events?limit=0", ""); w.Code != http.StatusBadRequest {
		t.Errorf("limit=0: status %d, want 400", w.Code)
	}
	if w := e.do("GET", "/v1/sandboxes/"+id+"/events", "", "Authorization", "Bearer secret-b"); w.Code != http.StatusNotFound {
		t.Errorf("another key: status %d, want 404", w.Code)
	}
}
