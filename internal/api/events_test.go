package api

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"
)

type fakeEvents map[string][]Event

func (f fakeEvents) ListEvents(ctx context.Context, id string, before int64, limit int) ([]Event, error) {
	evs := f[id]
	if before > 0 {
		i := 0
		for i < len(evs) && evs[i].ID < before {
			i++
		}
		evs = evs[:i]
	}
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

// A page of events never passes 1 MiB, however large its events; the
// cursor leads through all of them, newest pages first.
func TestListEventsPagedByBytes(t *testing.T) {
	e := newEnv(t)
	id := decodeBody[map[string]any](t, e.do("POST", "/v1/sandboxes", `{}`))["id"].(string)
	var evs []Event
	for i := range 1000 {
		evs = append(evs, Event{ID: int64(i + 1), Type: "network_changed", Message: strings.Repeat("m", 1024),
			Data: map[string]any{"pad": strings.Repeat("d", 4000)}, At: time.Now()})
	}
	e.s.events = fakeEvents{id: evs}
	seen := map[int64]bool{}
	cursor, pages := "", 0
	for {
		target := "/v1/sandboxes/" + id + "/events?limit=1000"
		if cursor != "" {
			target += "&cursor=" + cursor
		}
		w := e.do("GET", target, "")
		if w.Code != http.StatusOK {
			t.Fatalf("status %d: %s", w.Code, w.Body)
		}
		if w.Body.Len() > maxEventPage {
			t.Errorf("page of %d bytes, want at most %d", w.Body.Len(), maxEventPage)
		}
		var page struct {
			Data       []struct{ ID int64 } `json:"data"`
			NextCursor *string              `json:"nextCursor"`
		}
		if err := json.Unmarshal(w.Body.Bytes(), &page); err != nil {
			t.Fatal(err)
		}
		for i, ev := range page.Data {
			if seen[ev.ID] || (i > 0 && ev.ID <= page.Data[i-1].ID) {
				t.Fatalf("event %d repeated or out of order", ev.ID)
			}
			seen[ev.ID] = true
		}
		pages++
		if page.NextCursor == nil {
			break
		}
		cursor = *page.NextCursor
	}
	if len(seen) != 1000 || pages < 5 {
		t.Errorf("%d events in %d pages, want 1000 in at least 5", len(seen), pages)
	}
}
