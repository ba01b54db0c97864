package emberbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"testing"
	"time"
)

// webhookFake answers the webhooks contract for TestWebhooks, refusing a
// call whose method, path or body is not what the client should send.
func webhookFake(t *testing.T) http.Handler {
	const hook = `{"id":"wh_1","url":"https://ci.example.com/h","description":%q,"events":%s,"enabled":%t,%s
		"previousSecretExpiresAt":%s,"createdAt":"2026-01-02T03:04:05.000Z","updatedAt":"2026-01-02T03:04:06.000Z"}`
	const delivery = `{"id":"whd_1","webhookId":"wh_1","eventId":"","eventType":"webhook.test","resourceId":"wh_1",
		"state":%q,"attempts":1,"nextAttemptAt":null,"lastStatus":%d,"lastError":%s,"lastDurationMs":12,
		"lastAttemptAt":"2026-01-02T03:04:07.000Z","createdAt":"2026-01-02T03:04:07.000Z","deliveredAt":null}`
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body map[string]any
		if r.Method == http.MethodPost {
			if r.Header.Get("Content-Type") != "application/json" || r.Header.Get("Idempotency-Key") == "" {
				answerError(w, 415, "unsupported_media_type", "")
				return
			}
			if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
				answerError(w, 400, "invalid", "")
				return
			}
		}
		got := r.Method + " " + r.URL.EscapedPath()
		switch {
		case got == "POST /v1/webhooks" && body["url"] == "https://ci.example.com/h" &&
			fmt.Sprint(body["events"]) == "[sandbox.*]" && body["description"] == "ci":
			fmt.Fprintf(w, hook, "ci", `["sandbox.*"]`, true, `"secret":"whsec_abc",`, "null")
		case got == "POST /v1/webhooks" && body["url"] == "http://10.0.0.1/":
			answerError(w, 400, "invalid_url", "")
		case got == "GET /v1/webhooks":
			fmt.Fprintf(w, `{"data":[`+hook+`],"nextCursor":null}`, "", `["*"]`, true, "", "null")
		case got == "GET /v1/webhooks/wh_1":
			fmt.Fprintf(w, hook, "ci", `["*"]`, true, "", "null")
		case got == "POST /v1/webhooks/wh_1:update" && body["enabled"] == false && body["url"] == nil &&
			fmt.Sprint(body["events"]) == "[*]" && len(body) == 2:
			fmt.Fprintf(w, hook, "ci", `["*"]`, false, "", "null")
		case got == "POST /v1/webhooks/wh_1:rotate-secret" && body["keepPreviousSeconds"] == 2.0:
			fmt.Fprintf(w, hook, "ci", `["*"]`, true, `"secret":"whsec_new",`, `"2026-01-02T03:04:08.000Z"`)
		case got == "POST /v1/webhooks/wh_1:rotate-secret" && len(body) == 0:
			fmt.Fprintf(w, hook, "ci", `["*"]`, true, `"secret":"whsec_day",`, `"2026-01-03T03:04:08.000Z"`)
		case got == "POST /v1/webhooks/wh_1:delete" && len(body) == 0:
			fmt.Fprintf(w, hook, "ci", `["*"]`, true, "", "null")
		case got == "POST /v1/webhooks/wh_1:test" && len(body) == 0:
			fmt.Fprintf(w, delivery, "failed", 500, `"receiver answered 500"`)
		case got == "GET /v1/webhooks/wh_1/deliveries" && r.URL.RawQuery == "cursor=9&limit=2&state=failed":
			fmt.Fprintf(w, `{"data":[`+delivery+`],"nextCursor":"8"}`, "failed", 500, "null")
		case got == "GET /v1/webhooks/wh_1/deliveries" && r.URL.RawQuery == "":
			fmt.Fprint(w, `{"data":[],"nextCursor":null}`)
		case got == "POST /v1/webhook-deliveries/whd_1:retry" && len(body) == 0:
			fmt.Fprintf(w, delivery, "delivered", 204, "null")
		case got == "GET /v1/webhooks/wh%2F2":
			answerError(w, 404, "webhook_not_found", "")
		default:
			t.Errorf("unexpected %s ?%s %v", got, r.URL.RawQuery, body)
			answerError(w, 404, "not_found", "")
		}
	})
}

// TestWebhooks makes, lists, reads, changes, rotates, tests, pages the
// deliveries of, retries and deletes webhooks against a fake of the
// contract.
func TestWebhooks(t *testing.T) {
	c := newTestClient(t, webhookFake(t))
	ctx := context.Background()

	wh, err := c.CreateWebhook(ctx, WebhookSpec{URL: "https://ci.example.com/h", Events: []string{"sandbox.*"}, Description: "ci"})
	if err != nil || wh.ID != "wh_1" || wh.Secret != "whsec_abc" || !wh.Enabled || wh.Events[0] != "sandbox.*" ||
		wh.PreviousSecretExpiresAt != nil || wh.CreatedAt.Second() != 5 || wh.UpdatedAt.Second() != 6 {
		t.Fatalf("CreateWebhook: %+v %v", wh, err)
	}
	var ae *APIError
	if _, err := c.CreateWebhook(ctx, WebhookSpec{URL: "http://10.0.0.1/"}); !errors.As(err, &ae) || ae.Code != "invalid_url" || ae.Status != 400 {
		t.Errorf("a refused URL: %v", err)
	}
	list, err := c.ListWebhooks(ctx)
	if err != nil || len(list) != 1 || list[0].Secret != "" || list[0].Events[0] != "*" {
		t.Errorf("ListWebhooks: %+v %v", list, err)
	}
	if wh, err := c.GetWebhook(ctx, "wh_1"); err != nil || wh.Description != "ci" || wh.Secret != "" {
		t.Errorf("GetWebhook: %+v %v", wh, err)
	}
	if _, err := c.GetWebhook(ctx, "wh/2"); !IsNotFound(err) || !errors.As(err, &ae) || ae.Code != "webhook_not_found" {
		t.Errorf("a missing webhook: %v", err)
	}
	off := false
	if wh, err := c.UpdateWebhook(ctx, "wh_1", WebhookUpdate{Enabled: &off, Events: []string{"*"}}); err != nil || wh.Enabled {
		t.Errorf("UpdateWebhook: %+v %v", wh, err)
	}

	keep := 1500 * time.Millisecond
	wh, err = c.RotateWebhookSecret(ctx, "wh_1", &keep)
	if err != nil || wh.Secret != "whsec_new" || wh.PreviousSecretExpiresAt == nil || wh.PreviousSecretExpiresAt.Second() != 8 {
		t.Errorf("RotateWebhookSecret: %+v %v", wh, err)
	}
	if wh, err := c.RotateWebhookSecret(ctx, "wh_1", nil); err != nil || wh.Secret != "whsec_day" {
		t.Errorf("RotateWebhookSecret with the default grace: %+v %v", wh, err)
	}

	d, err := c.TestWebhook(ctx, "wh_1")
	if err != nil || d.State != "failed" || d.LastStatus == nil || *d.LastStatus != 500 || d.LastError == nil || d.EventID != "" {
		t.Errorf("TestWebhook: %+v %v", d, err)
	}
	page, err := c.ListWebhookDeliveries(ctx, "wh_1", DeliveriesOptions{State: "failed", Limit: 2, Cursor: "9"})
	if err != nil || len(page.Deliveries) != 1 || page.NextCursor != "8" || *page.Deliveries[0].LastDurationMs != 12 {
		t.Errorf("ListWebhookDeliveries: %+v %v", page, err)
	}
	if page, err := c.ListWebhookDeliveries(ctx, "wh_1", DeliveriesOptions{}); err != nil || len(page.Deliveries) != 0 || page.NextCursor != "" {
		t.Errorf("ListWebhookDeliveries, last page: %+v %v", page, err)
	}
	if d, err := c.RetryWebhookDelivery(ctx, "whd_1"); err != nil || d.State != "delivered" || *d.LastStatus != 204 {
		t.Errorf("RetryWebhookDelivery: %+v %v", d, err)
	}
	if err := c.DeleteWebhook(ctx, "wh_1"); err != nil {
		t.Errorf("DeleteWebhook: %v", err)
	}
}

// TestWebhooksRefuseWithoutIDs: a call without its id (or URL) is refused
// before it is sent.
func TestWebhooksRefuseWithoutIDs(t *testing.T) {
	c := newTestClient(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		t.Errorf("%s %s was sent", r.Method, r.URL.Path)
	}))
	ctx := context.Background()
	neg := -time.Second
	var ae *APIError
	for name, err := range map[string]error{
		"Create":     func() error { _, err := c.CreateWebhook(ctx, WebhookSpec{}); return err }(),
		"Get":        func() error { _, err := c.GetWebhook(ctx, ""); return err }(),
		"Update":     func() error { _, err := c.UpdateWebhook(ctx, "", WebhookUpdate{}); return err }(),
		"Rotate":     func() error { _, err := c.RotateWebhookSecret(ctx, "", nil); return err }(),
		"RotateNeg":  func() error { _, err := c.RotateWebhookSecret(ctx, "wh_1", &neg); return err }(),
		"Delete":     c.DeleteWebhook(ctx, ""),
		"Test":       func() error { _, err := c.TestWebhook(ctx, ""); return err }(),
		"Deliveries": func() error { _, err := c.ListWebhookDeliveries(ctx, "", DeliveriesOptions{}); return err }(),
		"Retry":      func() error { _, err := c.RetryWebhookDelivery(ctx, ""); return err }(),
	} {
		if err == nil || errors.As(err, &ae) {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// TestAccountEvents reads the key's event feed with its filters and
// cursor, and maps a server without one to its code, not retried.
func TestAccountEvents(t *testing.T) {
	calls := 0
	c := newTestClient(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls++
		switch r.URL.Query().Get("type") {
		case "sandbox.*":
			if r.Method != http.MethodGet || r.URL.Path != "/v1/events" ||
				r.URL.RawQuery != "cursor=41&limit=2&resourceId=sb_1&type=sandbox.%2A" {
				answerError(w, 400, "invalid", "")
				return
			}
			fmt.Fprint(w, `{"data":[{"id":"evt_40","type":"sandbox.stopped","createdAt":"2026-01-02T03:04:05.000Z",
				"resourceType":"sandbox","resourceId":"sb_1","data":{"reason":"lease"}},
				{"id":"evt_39","type":"sandbox.running","createdAt":"2026-01-02T03:04:00.000Z",
				"resourceType":"sandbox","resourceId":"sb_1","data":{}}],"nextCursor":"39"}`)
		default:
			answerError(w, 501, "events_unavailable", "")
		}
	}))
	ctx := context.Background()
	page, err := c.ListAccountEvents(ctx, AccountEventsOptions{ResourceID: "sb_1", Type: "sandbox.*", Limit: 2, Cursor: "41"})
	if err != nil || len(page.Events) != 2 || page.NextCursor != "39" {
		t.Fatalf("ListAccountEvents: %+v %v", page, err)
	}
	e := page.Events[0]
	if e.ID != "evt_40" || e.Type != "sandbox.stopped" || e.ResourceType != "sandbox" || e.Data["reason"] != "lease" ||
		e.CreatedAt.Second() != 5 {
		t.Errorf("event %+v", e)
	}
	calls = 0
	_, err = c.ListAccountEvents(ctx, AccountEventsOptions{})
	var ae *APIError
	if !errors.As(err, &ae) || ae.Code != "events_unavailable" || ae.Status != 501 || calls != 1 {
		t.Errorf("%d calls, %v", calls, err)
	}
}

// TestWebhookPathsAreEscaped: ids go into the path as one segment.
func TestWebhookPathsAreEscaped(t *testing.T) {
	if got := webhookPath("wh 1/x", ":test"); got != "/v1/webhooks/wh%201%2Fx:test" {
		t.Errorf("webhookPath: %s", got)
	}
}
