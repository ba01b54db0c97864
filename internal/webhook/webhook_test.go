package webhook_test

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/emberbox/emberbox/internal/errdefs"
	"github.com/emberbox/emberbox/internal/secrets"
	"github.com/emberbox/emberbox/internal/store"
	"github.com/emberbox/emberbox/internal/webhook"
)

// verify checks a delivery as withruntime.verify_webhook does: t and one
// or more v1 in the header, the HMAC-SHA256 of "<t>.<body>" by one of
// secrets, made within five minutes.
func verify(body []byte, header string, secrets ...string) (map[string]any, error) {
	var stamp string
	var given []string
	for _, part := range strings.Split(header, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(part), "=")
		switch {
		case ok && k == "t":
			stamp = v
		case ok && k == "v1" && v != "":
			given = append(given, v)
		}
	}
	t, err := strconv.ParseInt(stamp, 10, 64)
	if err != nil || len(given) == 0 {
		return nil, fmt.Errorf("malformed signature header %q", header)
	}
	if d := time.Since(time.Unix(t, 0)); d > 5*time.Minute || d < -5*time.Minute {
		return nil, fmt.Errorf("signature too old")
	}
	for _, s := range secrets {
		mac := hmac.New(sha256.New, []byte(s))
		fmt.Fprintf(mac, "%s.%s", stamp, body)
		want := hex.EncodeToString(mac.Sum(nil))
		if slices.ContainsFunc(given, func(g string) bool { return hmac.Equal([]byte(g), []byte(want)) }) {
			var ev map[string]any
			return ev, json.Unmarshal(body, &ev)
		}
	}
	return nil, fmt.Errorf("no signature matches")
}

// receiver is a webhook endpoint: it verifies each delivery with its
// secrets and keeps the events it took, unless it is down (503).
type receiver struct {
	*httptest.Server
	down     atomic.Bool
	refused  atomic.Int64 // deliveries answered 503
	mu       sync.Mutex
	secrets  []string
	events   []map[string]any
	headers  []http.Header
	failures []string
}

func newReceiver(t *testing.T) *receiver {
	rc := &receiver{}
	rc.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if rc.down.Load() {
			rc.refused.Add(1)
			http.Error(w, "down", http.StatusServiceUnavailable)
			return
		}
		body, _ := io.ReadAll(r.Body)
		rc.mu.Lock()
		defer rc.mu.Unlock()
		ev, err := verify(body, r.Header.Get(webhook.SignatureHeader), rc.secrets...)
		if err != nil {
			rc.failures = append(rc.failures, err.Error())
			http.Error(w, err.Error(), http.StatusUnauthorized)
			return
		}
		rc.events, rc.headers = append(rc.events, ev), append(rc.headers, r.Header.Clone())
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(rc.Close)
	return rc
}

func (rc *receiver) setSecrets(s ...string) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	rc.secrets = s
}

func (rc *receiver) taken() []map[string]any {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return slices.Clone(rc.events)
}

// waitFor polls cond until it holds, or fails the test after a minute.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func openStore(t *testing.T) *store.Store {
	t.Helper()
	st, err := store.Open(t.Context(), filepath.Join(t.TempDir(), "emberbox.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

// run starts svc's sender until the test ends.
func run(t *testing.T, svc *webhook.Service) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); svc.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
}

// TestDeliveriesSurviveAnOutage: a receiver that is down gets every event
// once it is back, each signed, and a resource's events in the order they
// happened.
func TestDeliveriesSurviveAnOutage(t *testing.T) {
	st := openStore(t)
	svc := webhook.New(webhook.Config{Records: st, Outbox: st, FirstBackoff: 50 * time.Millisecond})
	rc := newReceiver(t)
	w, err := svc.Create(t.Context(), "k", webhook.Spec{URL: rc.URL + "/hook"})
	if err != nil {
		t.Fatal(err)
	}
	rc.setSecrets(w.Secret)
	rc.down.Store(true)
	run(t, svc)
	var want []string
	for i := range 5 {
		for _, res := range []string{"sbx_a", "sbx_b"} {
			e := &webhook.Event{Owner: "k", Type: webhook.SandboxRunning, ResourceType: "sandbox", ResourceID: res,
				Data: map[string]any{"step": i}}
			if err := svc.Publish(t.Context(), e); err != nil {
				t.Fatal(err)
			}
			want = append(want, e.ID())
		}
	}
	waitFor(t, "deliveries refused while the receiver is down", func() bool { return rc.refused.Load() >= 4 })
	rc.down.Store(false)
	waitFor(t, "every event after the receiver came back", func() bool {
		seen := map[string]bool{}
		for _, ev := range rc.taken() {
			seen[ev["id"].(string)] = true
		}
		return len(seen) == len(want)
	})
	last := map[string]float64{}
	for _, ev := range rc.taken() {
		res, step := ev["resourceId"].(string), ev["data"].(map[string]any)["step"].(float64)
		if prev, ok := last[res]; ok && step < prev {
			t.Errorf("%s: step %v arrived after step %v", res, step, prev)
		}
		last[res] = step
		if ev["type"] != webhook.SandboxRunning || ev["resourceType"] != "sandbox" || ev["createdAt"] == "" {
			t.Errorf("event: %v", ev)
		}
	}
	if len(rc.failures) > 0 {
		t.Errorf("deliveries that did not verify: %v", rc.failures)
	}
	waitFor(t, "the deliveries recorded delivered", func() bool {
		ds, err := svc.Deliveries(t.Context(), webhook.DeliveryQuery{Owner: "k", WebhookID: w.ID, State: webhook.StateDelivered, Limit: 100})
		return err == nil && len(ds) == len(want)
	})
	ds, _ := svc.Deliveries(t.Context(), webhook.DeliveryQuery{Owner: "k", WebhookID: w.ID, Limit: 100})
	retried := 0
	for _, d := range ds {
		if d.Attempts > 1 {
			retried++
		}
	}
	if retried == 0 {
		t.Errorf("no delivery was retried, though the receiver refused %d", rc.refused.Load())
	}
}

// TestFilterAndDisable: a webhook gets the types it names, nothing while
// disabled, and nothing of another key's.
func TestFilterAndDisable(t *testing.T) {
	st := openStore(t)
	svc := webhook.New(webhook.Config{Records: st, Outbox: st})
	rc := newReceiver(t)
	w, err := svc.Create(t.Context(), "k", webhook.Spec{URL: rc.URL, Events: []string{"sandbox.stopped", "snapshot.*"}})
	if err != nil {
		t.Fatal(err)
	}
	rc.setSecrets(w.Secret)
	run(t, svc)
	pub := func(owner, typ, res string) {
		t.Helper()
		if err := svc.Publish(t.Context(), &webhook.Event{Owner: owner, Type: typ, ResourceType: "x", ResourceID: res}); err != nil {
			t.Fatal(err)
		}
	}
	pub("k", webhook.SandboxCreated, "sbx_1")
	pub("other", webhook.SandboxStopped, "sbx_9")
	pub("k", webhook.SnapshotReady, "snap_1")
	pub("k", webhook.SandboxStopped, "sbx_1")
	waitFor(t, "two events", func() bool { return len(rc.taken()) >= 2 })
	off := false
	if _, err := svc.Change(t.Context(), "k", w.ID, webhook.Update{Enabled: &off}); err != nil {
		t.Fatal(err)
	}
	pub("k", webhook.SandboxStopped, "sbx_2")
	// The sender's fan-out, run here too: a disabled webhook is given
	// nothing.
	if n, err := st.FanOut(t.Context(), 100, 100); err != nil || n != 0 {
		t.Errorf("fan-out to a disabled webhook: %d deliveries, %v", n, err)
	}
	// A test is sent whatever the webhook's state.
	if d, err := svc.Test(t.Context(), "k", w.ID); err != nil || d.State != webhook.StateDelivered {
		t.Fatalf("Test: %+v, %v", d, err)
	}
	if ds, err := svc.Deliveries(t.Context(), webhook.DeliveryQuery{Owner: "k", WebhookID: w.ID, Limit: 100}); err != nil || len(ds) != 3 {
		t.Errorf("%d deliveries (%v), want 3: two events and the test", len(ds), err)
	}
	var got []string
	for _, ev := range rc.taken() {
		got = append(got, ev["type"].(string)+"/"+ev["resourceId"].(string))
	}
	// Two resources' events may pass each other; the test came last.
	want := []string{"sandbox.stopped/sbx_1", "snapshot.ready/snap_1", "webhook.test/" + w.ID}
	if len(got) == 3 {
		slices.Sort(got[:2])
	}
	if !slices.Equal(got, want) {
		t.Errorf("received %v, want %v", got, want)
	}
}

// TestTestRetryAndRotation: a test reports how the receiver answered; a
// failed delivery is sent again by hand; during a rotation both secrets
// sign, after it the new one alone.
func TestTestRetryAndRotation(t *testing.T) {
	st := openStore(t)
	svc := webhook.New(webhook.Config{Records: st, Outbox: st})
	rc := newReceiver(t)
	w, err := svc.Create(t.Context(), "k", webhook.Spec{URL: rc.URL})
	if err != nil {
		t.Fatal(err)
	}
	old := w.Secret
	rc.setSecrets(old)
	rc.down.Store(true)
	d, err := svc.Test(t.Context(), "k", w.ID)
	if err != nil || d.State != webhook.StateFailed || d.LastStatus != 503 || d.Attempts != 1 {
		t.Fatalf("Test to a receiver that is down: %+v, %v", d, err)
	}
	rc.down.Store(false)
	if _, err := svc.Retry(t.Context(), "other", d.ID); !errdefs.IsNotFound(err) {
		t.Errorf("another key's Retry: %v", err)
	}
	r, err := svc.Retry(t.Context(), "k", d.ID)
	if err != nil || r.State != webhook.StateDelivered || r.LastStatus != 204 || r.Attempts != 2 {
		t.Fatalf("Retry: %+v, %v", r, err)
	}

	w, err = svc.RotateSecret(t.Context(), "k", w.ID, nil)
	if err != nil || w.Secret == old || w.PreviousSecret != old {
		t.Fatalf("RotateSecret: %+v, %v", w, err)
	}
	rc.setSecrets(old) // a receiver not yet told of the new secret
	if d, err := svc.Test(t.Context(), "k", w.ID); err != nil || d.State != webhook.StateDelivered {
		t.Fatalf("Test during the grace, verified with the old secret: %+v, %v", d, err)
	}
	rc.setSecrets(w.Secret)
	if d, err := svc.Test(t.Context(), "k", w.ID); err != nil || d.State != webhook.StateDelivered {
		t.Fatalf("Test during the grace, verified with the new secret: %+v, %v", d, err)
	}
	zero := time.Duration(0)
	w, err = svc.RotateSecret(t.Context(), "k", w.ID, &zero)
	if err != nil || w.PreviousSecret != "" {
		t.Fatalf("RotateSecret keeping nothing: %+v, %v", w, err)
	}
	rc.setSecrets(old)
	if d, err := svc.Test(t.Context(), "k", w.ID); err != nil || d.State != webhook.StateFailed || d.LastStatus != 401 {
		t.Fatalf("Test after the grace, verified with an old secret: %+v, %v", d, err)
	}
	tooLong := 8 * 24 * time.Hour
	if _, err := svc.RotateSecret(t.Context(), "k", w.ID, &tooLong); !errdefs.IsInvalidArgument(err) {
		t.Errorf("RotateSecret keeping 8 days: %v", err)
	}
}

// TestCreateRefuses: what a webhook may not be.
func TestCreateRefuses(t *testing.T) {
	st := openStore(t)
	publicOnly := func(a netip.Addr) bool { return !a.IsLoopback() && !a.IsPrivate() }
	svc := webhook.New(webhook.Config{Records: st, Outbox: st, Allowed: publicOnly})
	for _, tc := range []struct {
		spec webhook.Spec
		code string
	}{
		{webhook.Spec{URL: ""}, "invalid_webhook_url"},
		{webhook.Spec{URL: "ftp://example.com/x"}, "invalid_webhook_url"},
		{webhook.Spec{URL: "/relative"}, "invalid_webhook_url"},
		{webhook.Spec{URL: "https://user:pass@example.com/"}, "invalid_webhook_url"},
		{webhook.Spec{URL: "https://example.com/" + strings.Repeat("x", 2048)}, "invalid_webhook_url"},
		{webhook.Spec{URL: "http://127.0.0.1:9000/"}, "webhook_url_forbidden"},
		{webhook.Spec{URL: "http://[::ffff:10.0.0.1]/"}, "webhook_url_forbidden"},
		{webhook.Spec{URL: "http://LOCALHOST/"}, "webhook_url_forbidden"},
		{webhook.Spec{URL: "https://example.com/", Events: []string{"sandbox.exploded"}}, "invalid_events"},
		{webhook.Spec{URL: "https://example.com/", Events: []string{"nothing.*"}}, "invalid_events"},
		{webhook.Spec{URL: "https://example.com/", Description: "a\x00b"}, "invalid_description"},
	} {
		if _, err := svc.Create(t.Context(), "k", tc.spec); errdefs.Code(err) != tc.code {
			t.Errorf("Create(%.60q, %v): %v, want %s", tc.spec.URL, tc.spec.Events, err, tc.code)
		}
	}
	for i := range webhook.MaxPerOwner {
		if _, err := svc.Create(t.Context(), "k", webhook.Spec{URL: fmt.Sprintf("https://example.com/%d", i), Events: []string{"sandbox.*"}}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := svc.Create(t.Context(), "k", webhook.Spec{URL: "https://example.com/x"}); errdefs.Code(err) != "too_many_webhooks" {
		t.Errorf("one webhook too many: %v", err)
	}
}

func TestSign(t *testing.T) {
	body := []byte(`{"id":"evt_1"}`)
	h := webhook.Sign(body, time.Now().Unix(), []string{"new", "old"})
	if strings.Count(h, "v1=") != 2 {
		t.Fatalf("header %q: want one v1 per secret", h)
	}
	for _, s := range []string{"new", "old"} {
		if _, err := verify(body, h, s); err != nil {
			t.Errorf("secret %s: %v", s, err)
		}
	}
	if _, err := verify(body, h, "other"); err == nil {
		t.Error("verified with a secret that did not sign")
	}
	if _, err := verify([]byte(`{"id":"evt_2"}`), h, "new"); err == nil {
		t.Error("verified another body")
	}
}

// TestSealedSigningSecrets: with a sealer, the store keeps a webhook's
// signing secrets sealed, the answer shows the secret once as it is, and
// deliveries are signed with it, and with the previous one during a
// rotation.
func TestSealedSigningSecrets(t *testing.T) {
	st := openStore(t)
	sealer, err := secrets.NewSealer(make([]byte, secrets.KeySize))
	if err != nil {
		t.Fatal(err)
	}
	svc := webhook.New(webhook.Config{Records: st, Outbox: st, Sealer: sealer})
	rc := newReceiver(t)
	w, err := svc.Create(t.Context(), "k", webhook.Spec{URL: rc.URL})
	if err != nil {
		t.Fatal(err)
	}
	kept, err := st.GetWebhook(t.Context(), "k", w.ID)
	if err != nil || kept.Secret == w.Secret || !strings.HasPrefix(kept.Secret, "v1:") || !strings.HasPrefix(w.Secret, "whsec_") {
		t.Fatalf("kept %q for the answer's %q (%v): want it sealed", kept.Secret, w.Secret, err)
	}
	rc.setSecrets(w.Secret)
	if d, err := svc.Test(t.Context(), "k", w.ID); err != nil || d.State != webhook.StateDelivered {
		t.Fatalf("Test: %+v, %v", d, err)
	}
	old := w.Secret
	if w, err = svc.RotateSecret(t.Context(), "k", w.ID, nil); err != nil || !strings.HasPrefix(w.Secret, "whsec_") {
		t.Fatalf("RotateSecret: %+v, %v", w, err)
	}
	for _, s := range []string{old, w.Secret} {
		rc.setSecrets(s)
		if d, err := svc.Test(t.Context(), "k", w.ID); err != nil || d.State != webhook.StateDelivered {
			t.Errorf("Test verified with one of the two secrets: %+v, %v", d, err)
		}
	}
	// The sender signs with the opened secrets too.
	rc.setSecrets(w.Secret)
	run(t, svc)
	if err := svc.Publish(t.Context(), &webhook.Event{Owner: "k", Type: webhook.SandboxCreated, ResourceType: "sandbox", ResourceID: "sbx"}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the event, signed", func() bool {
		for _, ev := range rc.taken() {
			if ev["type"] == webhook.SandboxCreated {
				return true
			}
		}
		return false
	})
}
