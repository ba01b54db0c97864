package integration

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// hookReceiver is a webhook endpoint on this machine: it checks each
// delivery's Runtime-Signature with the webhook's secret and keeps, in
// arrival order, the id and resource of each event it took.
type hookReceiver struct {
	*httptest.Server
	mu      sync.Mutex
	secret  string
	arrived []hookEvent
	bad     []string
}

type hookEvent struct {
	ID, Type, ResourceID string
}

func newHookReceiver(t *testing.T) *hookReceiver {
	h := &hookReceiver{}
	h.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		h.mu.Lock()
		defer h.mu.Unlock()
		if err := checkSignature(body, r.Header.Get("Runtime-Signature"), h.secret); err != nil {
			h.bad = append(h.bad, err.Error())
			http.Error(w, err.Error(), http.StatusUnauthorized)
			return
		}
		var ev struct {
			ID         string `json:"id"`
			Type       string `json:"type"`
			ResourceID string `json:"resourceId"`
		}
		if err := json.Unmarshal(body, &ev); err != nil {
			h.bad = append(h.bad, err.Error())
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		h.arrived = append(h.arrived, hookEvent(ev))
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(h.Close)
	return h
}

// checkSignature is withruntime.verify_webhook's check: t=<unix>,v1=<hex
// HMAC-SHA256 of "<t>.<body>">, within five minutes.
func checkSignature(body []byte, header, secret string) error {
	var stamp string
	var given []string
	for _, part := range strings.Split(header, ",") {
		k, v, _ := strings.Cut(strings.TrimSpace(part), "=")
		switch k {
		case "t":
			stamp = v
		case "v1":
			given = append(given, v)
		}
	}
	var t int64
	if _, err := fmt.Sscan(stamp, &t); err != nil || len(given) == 0 {
		return fmt.Errorf("malformed Runtime-Signature %q", header)
	}
	if d := time.Since(time.Unix(t, 0)); d > 5*time.Minute || d < -5*time.Minute {
		return fmt.Errorf("signature made %v ago", d)
	}
	mac := hmac.New(sha256.New, []byte(secret))
	fmt.Fprintf(mac, "%s.%s", stamp, body)
	if want := hex.EncodeToString(mac.Sum(nil)); !slices.Contains(given, want) {
		return fmt.Errorf("no signature matches")
	}
	return nil
}

// of returns the events that arrived for resource id, in arrival order.
func (h *hookReceiver) of(id string) []hookEvent {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []hookEvent
	for _, e := range h.arrived {
		if e.ResourceID == id {
			out = append(out, e)
		}
	}
	return out
}

// TestKillDuringWebhookDelivery: the server dies (SIGKILL) with a delivery
// claimed and not yet sent, or sent and taken but not yet recorded. The
// next server on the data dir sends every event of the sandbox, in order,
// signed: nothing is lost, and what may arrive twice carries the same
// event id for the receiver to drop.
func TestKillDuringWebhookDelivery(t *testing.T) {
	needVMs(t)
	flags := []string{"--webhook-allow-private"}
	for _, fault := range []string{"webhook.claimed", "webhook.sent"} {
		t.Run(fault, func(t *testing.T) {
			dataDir := t.TempDir()
			rc := newHookReceiver(t)
			var id string
			s := startServerArgs(t, dataDir, flags, "EMBERBOX_FAULTPOINT="+fault)
			c := s.client(s.AdminKey)
			r := c.raw(t, "POST", "/v1/webhooks", map[string]any{"url": rc.URL + "/hook", "events": []string{"sandbox.*"}}, nil, requestTimeout)
			var hook struct{ ID, Secret string }
			if r.err != nil || r.Status != http.StatusOK || json.Unmarshal(r.Body, &hook) != nil || hook.Secret == "" {
				t.Fatalf("creating the webhook: %v", r)
			}
			rc.mu.Lock()
			rc.secret = hook.Secret
			rc.mu.Unlock()
			// The sandbox's first event is claimed for delivery at once;
			// the server dies at the fault point while it boots.
			r = c.raw(t, "POST", "/v1/sandboxes", map[string]any{"vcpu": 1, "memoryMiB": 1024}, nil, requestTimeout)
			var sb sandboxJSON
			if r.err != nil || json.Unmarshal(r.Body, &sb) != nil || sb.ID == "" {
				t.Fatalf("create: %v", r)
			}
			id = sb.ID
			select {
			case <-s.exited:
			case <-time.After(2 * time.Minute):
				t.Fatalf("the server did not die at fault point %s", fault)
			}
			before := len(rc.of(id))

			s = startServerArgs(t, dataDir, flags)
			c = s.client(s.AdminKey)
			c.delete(t, id)
			var feed struct {
				Data []struct{ ID, Type string } `json:"data"`
			}
			r = c.raw(t, "GET", "/v1/events?limit=100&resourceId="+id, nil, nil, requestTimeout)
			if r.err != nil || json.Unmarshal(r.Body, &feed) != nil || len(feed.Data) < 2 {
				t.Fatalf("the sandbox's events: %v", r)
			}
			var want []string // oldest first
			for i := len(feed.Data) - 1; i >= 0; i-- {
				want = append(want, feed.Data[i].ID)
			}
			if feed.Data[len(feed.Data)-1].Type != "sandbox.created" || feed.Data[0].Type != "sandbox.deleted" {
				t.Errorf("the feed of %s: %+v, want sandbox.created first and sandbox.deleted last", id, feed.Data)
			}
			var firsts []string
			ok := waitUntil(2*time.Minute, 100*time.Millisecond, func() bool {
				firsts = firsts[:0]
				for _, e := range rc.of(id) {
					if !slices.Contains(firsts, e.ID) {
						firsts = append(firsts, e.ID)
					}
				}
				return len(firsts) >= len(want)
			})
			if !ok || !slices.Equal(firsts, want) {
				t.Fatalf("events of %s that arrived, first arrivals in order: %v; want the feed's %v", id, firsts, want)
			}
			if len(rc.bad) > 0 {
				t.Errorf("deliveries that did not verify: %v", rc.bad)
			}
			arrived := rc.of(id)
			switch fault {
			case "webhook.claimed":
				if before != 0 {
					t.Errorf("%d events arrived before the server died at the claim, want none", before)
				}
			case "webhook.sent":
				// Taken, not recorded: sent again by the next server, with
				// the same id.
				if before != 1 || len(arrived) < len(want)+1 || arrived[0].ID != arrived[1].ID {
					t.Errorf("arrivals %v (%d before the kill): want the first event twice", arrived, before)
				}
			}
			t.Logf("%s: %d events, %d arrivals", fault, len(want), len(arrived))
		})
	}
}
