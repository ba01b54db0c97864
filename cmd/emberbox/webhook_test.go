package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// fakeAPI is an httptest server that checks the key, records each call as
// "METHOD PATH?QUERY BODY" and answers by routes ("METHOD PATH" to a
// status and body); a call no route has is a 404.
type fakeAPI struct {
	*httptest.Server
	calls []string
}

func newFakeAPI(t *testing.T, routes map[string]string) *fakeAPI {
	f := &fakeAPI{}
	f.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer k1" {
			w.WriteHeader(401)
			fmt.Fprint(w, `{"error":{"code":"unauthorized","status":401,"message":"no"}}`)
			return
		}
		b, _ := io.ReadAll(r.Body)
		call := r.Method + " " + r.URL.EscapedPath()
		if r.URL.RawQuery != "" {
			call += "?" + r.URL.RawQuery
		}
		f.calls = append(f.calls, strings.TrimSpace(call+" "+string(b)))
		answer, ok := routes[r.Method+" "+r.URL.EscapedPath()]
		if !ok {
			w.WriteHeader(404)
			fmt.Fprint(w, `{"error":{"code":"not_found","status":404,"message":"no such thing"}}`)
			return
		}
		status := 200
		if n, rest, ok := strings.Cut(answer, " "); ok && len(n) == 3 && n[0] >= '1' && n[0] <= '5' {
			fmt.Sscan(n, &status)
			answer = rest
		}
		w.WriteHeader(status)
		fmt.Fprint(w, answer)
	}))
	t.Cleanup(f.Close)
	return f
}

// last is the last call the server was made.
func (f *fakeAPI) last() string {
	if len(f.calls) == 0 {
		return ""
	}
	return f.calls[len(f.calls)-1]
}

// run runs `emberbox GROUP --server … --key k1 ARGS…` with stdin and
// returns its stdout and stderr.
func (f *fakeAPI) run(stdin string, group string, args ...string) (string, string, error) {
	root := newRootCommand()
	var out, errOut bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&errOut)
	root.SetIn(strings.NewReader(stdin))
	root.SetArgs(append([]string{group, "--server", f.URL, "--key", "k1"}, args...))
	err := root.Execute()
	return out.String(), errOut.String(), err
}

const (
	fakeHook = `{"id":"wh_1","url":"https://ci.example.com/h","description":"ci","events":["sandbox.*"],"enabled":true,
		"previousSecretExpiresAt":null,"createdAt":"2026-01-02T03:04:05.000Z","updatedAt":"2026-01-02T03:04:05.000Z"%s}`
	fakeDelivery = `{"id":"whd_1","webhookId":"wh_1","eventId":"","eventType":"webhook.test","resourceId":"wh_1",
		"state":%q,"attempts":1,"lastStatus":%d,"lastError":%s,"lastDurationMs":12,"createdAt":"2026-01-02T03:04:07.000Z"}`
)

// TestWebhookCommands runs the webhook commands against a fake of the
// contract: create prints the secret once, update sends only what was
// given, test fails when the receiver refused.
func TestWebhookCommands(t *testing.T) {
	api := newFakeAPI(t, map[string]string{
		"POST /v1/webhooks":                       fmt.Sprintf(fakeHook, `,"secret":"whsec_abc"`),
		"GET /v1/webhooks":                        `{"data":[` + fmt.Sprintf(fakeHook, "") + `],"nextCursor":null}`,
		"GET /v1/webhooks/wh_1":                   fmt.Sprintf(fakeHook, ""),
		"POST /v1/webhooks/wh_1:update":           fmt.Sprintf(fakeHook, ""),
		"POST /v1/webhooks/wh_1:rotate-secret":    fmt.Sprintf(fakeHook, `,"secret":"whsec_new"`),
		"POST /v1/webhooks/wh_1:delete":           fmt.Sprintf(fakeHook, ""),
		"POST /v1/webhooks/wh_1:test":             fmt.Sprintf(fakeDelivery, "failed", 500, `"receiver answered 500"`),
		"GET /v1/webhooks/wh_1/deliveries":        `{"data":[` + fmt.Sprintf(fakeDelivery, "delivered", 204, "null") + `],"nextCursor":"7"}`,
		"POST /v1/webhook-deliveries/whd_1:retry": fmt.Sprintf(fakeDelivery, "delivered", 204, "null"),
	})

	out, errOut, err := api.run("", "webhook", "create", "https://ci.example.com/h", "--event", "sandbox.*", "--description", "ci")
	if err != nil || !strings.Contains(out, "wh_1") || !strings.Contains(out, "whsec_abc") || !strings.Contains(errOut, "shown this once") {
		t.Errorf("create: %v\n%s%s", err, out, errOut)
	}
	if got := api.last(); got != `POST /v1/webhooks {"url":"https://ci.example.com/h","events":["sandbox.*"],"description":"ci"}` {
		t.Errorf("create sent %s", got)
	}
	if out, _, err := api.run("", "webhook", "create", "https://ci.example.com/h", "--json"); err != nil ||
		!strings.Contains(out, `"secret": "whsec_abc"`) {
		t.Errorf("create --json: %v\n%s", err, out)
	}

	out, _, err = api.run("", "webhook", "list")
	if err != nil || !strings.Contains(out, "URL") || !strings.Contains(out, "sandbox.*") || strings.Contains(out, "whsec") {
		t.Errorf("list: %v\n%s", err, out)
	}
	if out, _, err := api.run("", "webhook", "get", "wh_1", "--json"); err != nil || !strings.Contains(out, `"id": "wh_1"`) {
		t.Errorf("get --json: %v\n%s", err, out)
	}
	if _, _, err := api.run("", "webhook", "get", "wh_9"); err == nil || !strings.Contains(err.Error(), "not_found") {
		t.Errorf("get of a missing webhook: %v", err)
	}

	if _, _, err := api.run("", "webhook", "update", "wh_1", "--disable", "--event", "*"); err != nil ||
		api.last() != `POST /v1/webhooks/wh_1:update {"events":["*"],"enabled":false}` {
		t.Errorf("update: %v, sent %s", err, api.last())
	}
	n := len(api.calls)
	for _, args := range [][]string{{}, {"--enable", "--disable"}} {
		if _, _, err := api.run("", "webhook", append([]string{"update", "wh_1"}, args...)...); err == nil {
			t.Errorf("update %v was taken", args)
		}
	}
	if len(api.calls) != n {
		t.Errorf("a refused update was sent: %q", api.calls[n:])
	}

	out, errOut, err = api.run("", "webhook", "rotate", "wh_1", "--keep", "1h")
	if err != nil || !strings.Contains(out, "whsec_new") || !strings.Contains(errOut, "shown this once") ||
		api.last() != `POST /v1/webhooks/wh_1:rotate-secret {"keepPreviousSeconds":3600}` {
		t.Errorf("rotate: %v, sent %s\n%s", err, api.last(), out)
	}
	if _, _, err := api.run("", "webhook", "rotate", "wh_1"); err != nil || api.last() != `POST /v1/webhooks/wh_1:rotate-secret {}` {
		t.Errorf("rotate with the default grace: %v, sent %s", err, api.last())
	}

	out, _, err = api.run("", "webhook", "test", "wh_1")
	if err == nil || !strings.Contains(err.Error(), "HTTP 500") || !strings.Contains(out, "failed") {
		t.Errorf("test of a refusing receiver: %v\n%s", err, out)
	}
	out, errOut, err = api.run("", "webhook", "deliveries", "wh_1", "--state", "delivered", "-n", "5")
	if err != nil || !strings.Contains(out, "HTTP 204, 12 ms") || !strings.Contains(errOut, "--cursor 7") ||
		api.last() != "GET /v1/webhooks/wh_1/deliveries?limit=5&state=delivered" {
		t.Errorf("deliveries: %v, sent %s\n%s%s", err, api.last(), out, errOut)
	}
	if out, _, err := api.run("", "webhook", "retry", "whd_1"); err != nil || !strings.Contains(out, "delivered") {
		t.Errorf("retry: %v\n%s", err, out)
	}
	if out, _, err := api.run("", "webhook", "rm", "wh_1"); err != nil || out != "wh_1\tdeleted\n" || api.last() != "POST /v1/webhooks/wh_1:delete {}" {
		t.Errorf("rm: %v %q, sent %s", err, out, api.last())
	}
}

// TestEventsCommand prints the key's event feed as a table, with its
// filters in the query, and as JSON.
func TestEventsCommand(t *testing.T) {
	api := newFakeAPI(t, map[string]string{
		"GET /v1/events": `{"data":[
			{"id":"evt_2","type":"sandbox.stopped","createdAt":"2026-01-02T03:04:05.000Z","resourceType":"sandbox",
			 "resourceId":"sb_1","data":{"reason":"lease_ended","exitCode":0}},
			{"id":"evt_1","type":"sandbox.created","createdAt":"2026-01-02T03:00:00.000Z","resourceType":"sandbox",
			 "resourceId":"sb_1","data":{}}],"nextCursor":null}`,
	})
	out, errOut, err := api.run("", "events", "--resource", "sb_1", "--type", "sandbox.*", "--limit", "2")
	if err != nil {
		t.Fatal(err)
	}
	if got := api.last(); got != "GET /v1/events?limit=2&resourceId=sb_1&type=sandbox.%2A" {
		t.Errorf("events asked %s", got)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 3 || strings.Join(strings.Fields(lines[0]), " ") != "TIME TYPE RESOURCE DATA" ||
		strings.Join(strings.Fields(lines[1]), " ") != "2026-01-02T03:04:05Z sandbox.stopped sb_1 exitCode=0 reason=lease_ended" ||
		strings.Join(strings.Fields(lines[2]), " ") != "2026-01-02T03:00:00Z sandbox.created sb_1 -" {
		t.Errorf("events table:\n%s", out)
	}
	if errOut != "" {
		t.Errorf("a last page tells of more: %q", errOut)
	}
	out, _, err = api.run("", "events", "--json")
	var events []map[string]any
	if err != nil || json.Unmarshal([]byte(out), &events) != nil || len(events) != 2 || events[0]["id"] != "evt_2" {
		t.Errorf("events --json: %v\n%s", err, out)
	}
}

// TestDataSummary: an event's data is one short line.
func TestDataSummary(t *testing.T) {
	for _, tc := range []struct {
		data  map[string]any
		limit int
		want  string
	}{
		{nil, 60, "-"},
		{map[string]any{"b": "two words", "a": 1.5, "c": []any{"x"}}, 60, `a=1.5 b=two words c=["x"]`},
		{map[string]any{"m": "line\nbreak\ttab"}, 60, "m=line break tab"},
		{map[string]any{"k": strings.Repeat("é", 80)}, 20, "k=" + strings.Repeat("é", 17) + "…"},
	} {
		if got := dataSummary(tc.data, tc.limit); got != tc.want {
			t.Errorf("dataSummary(%v) = %q, want %q", tc.data, got, tc.want)
		}
	}
}
