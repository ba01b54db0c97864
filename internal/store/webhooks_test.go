package store

import (
	"sync"
	"testing"
	"time"

	"github.com/emberbox/emberbox/internal/errdefs"
	"github.com/emberbox/emberbox/internal/sandbox"
	"github.com/emberbox/emberbox/internal/webhook"
)

func newWebhook(t *testing.T, s *Store, id, owner string, events []string) *webhook.Webhook {
	t.Helper()
	w := &webhook.Webhook{ID: id, Owner: owner, URL: "https://example.com/hook", Events: events, Enabled: true,
		Secret: "whsec_" + id, CreatedAt: base, UpdatedAt: base}
	if err := s.CreateWebhook(t.Context(), w); err != nil {
		t.Fatal(err)
	}
	return w
}

func feedTypes(t *testing.T, s *Store, owner string) []string {
	t.Helper()
	events, err := s.ListFeed(t.Context(), webhook.FeedQuery{Owner: owner, Limit: 100})
	if err != nil {
		t.Fatal(err)
	}
	var types []string
	for i := len(events) - 1; i >= 0; i-- { // oldest first
		types = append(types, events[i].Type+"/"+events[i].ResourceID)
	}
	return types
}

// TestFeedIsWrittenWithTheChange: a sandbox's trail entries of the types
// the feed carries, a snapshot's states and an image's outcome reach the
// owner's feed in their own transactions; other trail entries,
// checkpoints and other keys' changes do not.
func TestFeedIsWrittenWithTheChange(t *testing.T) {
	s, _ := openTest(t)
	ctx := t.Context()
	mustInsert(t, s, newSandbox("sbx_a", "k", base), newSandbox("sbx_b", "other", base))
	for _, ev := range []struct{ id, typ string }{{"sbx_a", "created"}, {"sbx_a", "boot_failed"}, {"sbx_a", "ready"},
		{"sbx_b", "created"}, {"sbx_a", "stopped"}} {
		if err := s.AppendEvent(ctx, ev.id, ev.typ, "m", map[string]any{"reason": "user"}); err != nil {
			t.Fatal(err)
		}
	}
	for _, sn := range []*sandbox.Snapshot{
		{ID: "snap_1", OwnerKeyID: "k", SourceSandboxID: "sbx_a", Mode: sandbox.SnapshotModeMemory, State: sandbox.SnapshotCapturing, CreatedAt: base},
		{ID: "ckpt_1", OwnerKeyID: "k", SourceSandboxID: "sbx_a", CheckpointOf: "sbx_a", Mode: sandbox.SnapshotModeMemory, State: sandbox.SnapshotCapturing, CreatedAt: base},
	} {
		if err := s.InsertSnapshot(ctx, sn); err != nil {
			t.Fatal(err)
		}
		if _, err := s.UpdateSnapshot(ctx, sn.ID, func(x *sandbox.Snapshot) bool { x.State = sandbox.SnapshotReady; return true }); err != nil {
			t.Fatal(err)
		}
	}
	// An update that leaves the state as it is publishes nothing.
	if _, err := s.UpdateSnapshot(ctx, "snap_1", func(x *sandbox.Snapshot) bool { x.Name = "renamed"; return true }); err != nil {
		t.Fatal(err)
	}
	got := feedTypes(t, s, "k")
	want := []string{"sandbox.created/sbx_a", "sandbox.running/sbx_a", "sandbox.stopped/sbx_a", "snapshot.ready/snap_1"}
	if len(got) != len(want) {
		t.Fatalf("feed of k: %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("feed of k: %v, want %v", got, want)
		}
	}
	if got := feedTypes(t, s, "other"); len(got) != 1 || got[0] != "sandbox.created/sbx_b" {
		t.Errorf("feed of other: %v", got)
	}
	stopped, err := s.ListFeed(ctx, webhook.FeedQuery{Owner: "k", Type: "sandbox.stopped", Limit: 10})
	if err != nil || len(stopped) != 1 || stopped[0].Data["reason"] != "user" {
		t.Errorf("sandbox.stopped: %+v, %v", stopped, err)
	}
	family, err := s.ListFeed(ctx, webhook.FeedQuery{Owner: "k", Type: "sandbox.*", Limit: 10})
	if err != nil || len(family) != 3 {
		t.Errorf("sandbox.*: %d events, %v; want 3", len(family), err)
	}
	page, err := s.ListFeed(ctx, webhook.FeedQuery{Owner: "k", Before: family[0].Seq, ResourceID: "sbx_a", Limit: 1})
	if err != nil || len(page) != 1 || page[0].Type != webhook.SandboxRunning {
		t.Errorf("page before the newest sandbox event: %+v, %v", page, err)
	}
}

// TestOutbox: fan-out gives each webhook the events it wants from its
// creation on, once; a resource's deliveries are claimed one at a time,
// in order; a claim keeps a delivery from a second claimer; a success
// brings the webhook's waiting deliveries forward.
func TestOutbox(t *testing.T) {
	s, _ := openTest(t)
	ctx := t.Context()
	now := base
	s.now = func() time.Time { return now }
	publish := func(typ, res string) {
		t.Helper()
		if err := s.PublishEvent(ctx, &webhook.Event{Owner: "k", Type: typ, ResourceType: "sandbox", ResourceID: res}); err != nil {
			t.Fatal(err)
		}
	}
	publish(webhook.SandboxCreated, "sbx_old") // before the webhooks: not theirs
	all := newWebhook(t, s, "wh_all", "k", nil)
	newWebhook(t, s, "wh_stops", "k", []string{"sandbox.stopped"})
	newWebhook(t, s, "wh_other", "other", nil)
	publish(webhook.SandboxCreated, "sbx_1")
	publish(webhook.SandboxCreated, "sbx_2")
	publish(webhook.SandboxStopped, "sbx_1")
	n, err := s.FanOut(ctx, 100, 100)
	if err != nil || n != 4 {
		t.Fatalf("FanOut: %d deliveries, %v; want 3 for wh_all and 1 for wh_stops", n, err)
	}
	if n, err := s.FanOut(ctx, 100, 100); err != nil || n != 0 {
		t.Fatalf("second FanOut: %d, %v; want nothing new", n, err)
	}

	// The first of each resource's line, for each webhook: sbx_1 created
	// and sbx_2 created for wh_all, sbx_1 stopped for wh_stops.
	first, err := s.ClaimDeliveries(ctx, "a", time.Minute, 10)
	if err != nil || len(first) != 3 {
		t.Fatalf("ClaimDeliveries: %d, %v; want 3", len(first), err)
	}
	for _, d := range first {
		if d.WebhookID == "wh_all" && d.EventType != webhook.SandboxCreated {
			t.Errorf("claimed %s of %s before the resource's earlier event", d.EventType, d.ResourceID)
		}
		if d.URL != all.URL || len(d.Secrets) != 1 {
			t.Errorf("claimed delivery: url %q secrets %d", d.URL, len(d.Secrets))
		}
	}
	if again, err := s.ClaimDeliveries(ctx, "b", time.Minute, 10); err != nil || len(again) != 0 {
		t.Fatalf("a second claimer got %d deliveries (%v), want none: all are claimed or behind one", len(again), err)
	}
	if _, err := s.ClaimDelivery(ctx, "k", first[0].ID, "b", time.Minute); !errdefs.IsConflict(err) {
		t.Errorf("ClaimDelivery of a claimed delivery: %v, want a conflict", err)
	}
	if _, err := s.ClaimDelivery(ctx, "other", first[0].ID, "b", time.Minute); !errdefs.IsNotFound(err) {
		t.Errorf("ClaimDelivery by another key: %v, want not found", err)
	}

	// Every attempt fails; the retries wait an hour.
	for _, d := range first {
		d.Attempts, d.NextAttemptAt = 1, now.Add(time.Hour)
		if err := s.RecordAttempt(ctx, d, webhook.Attempt{Status: 503, Error: "down", At: now}); err != nil {
			t.Fatal(err)
		}
	}
	now = now.Add(time.Minute)
	if due, err := s.ClaimDeliveries(ctx, "a", time.Minute, 10); err != nil || len(due) != 0 {
		t.Fatalf("claimed %d deliveries during their backoff (%v)", len(due), err)
	}
	// A manual retry that succeeds brings the rest of wh_all forward.
	d, err := s.ClaimDelivery(ctx, "k", first[0].ID, "a", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	d.State, d.Attempts, d.DeliveredAt = webhook.StateDelivered, 2, &now
	if err := s.RecordAttempt(ctx, d, webhook.Attempt{Status: 204, At: now}); err != nil {
		t.Fatal(err)
	}
	due, err := s.ClaimDeliveries(ctx, "a", time.Minute, 10)
	if err != nil {
		t.Fatal(err)
	}
	for _, x := range due {
		if x.WebhookID != d.WebhookID {
			t.Errorf("claimed a delivery of %s: only %s's receiver came back", x.WebhookID, d.WebhookID)
		}
	}
	if len(due) == 0 {
		t.Errorf("nothing of %s was brought forward by its success", d.WebhookID)
	}
	// A claimer's claims end at its next start.
	if err := s.ReleaseClaims(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if again, err := s.ClaimDeliveries(ctx, "b", time.Minute, 10); err != nil || len(again) != len(due) {
		t.Errorf("after release: claimed %d, %v; want %d", len(again), err, len(due))
	}
	list, err := s.ListDeliveries(ctx, webhook.DeliveryQuery{Owner: "k", WebhookID: "wh_all", State: webhook.StateDelivered, Limit: 10})
	if err != nil || len(list) != 1 || list[0].ID != d.ID || list[0].LastStatus != 204 || list[0].Attempts != 2 {
		t.Errorf("delivered deliveries: %+v, %v", list, err)
	}
}

// TestFanOutOnce: fan-outs running at once (nodes of a cluster) give an
// event to a webhook once.
func TestFanOutOnce(t *testing.T) {
	s, _ := openTest(t)
	ctx := t.Context()
	newWebhook(t, s, "wh_1", "k", nil)
	for range 50 {
		if err := s.PublishEvent(ctx, &webhook.Event{Owner: "k", Type: webhook.SandboxCreated, ResourceType: "sandbox", ResourceID: "sbx"}); err != nil {
			t.Fatal(err)
		}
	}
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			if _, err := s.FanOut(ctx, 7, 1000); err != nil {
				t.Error(err)
			}
			if _, err := s.FanOut(ctx, 1000, 1000); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	list, err := s.ListDeliveries(ctx, webhook.DeliveryQuery{Owner: "k", WebhookID: "wh_1", Limit: 100})
	if err != nil || len(list) != 50 {
		t.Fatalf("%d deliveries, %v; want 50", len(list), err)
	}
	seen := map[int64]bool{}
	for _, d := range list {
		if seen[d.EventSeq] {
			t.Fatalf("event %d given twice", d.EventSeq)
		}
		seen[d.EventSeq] = true
	}
}

// TestWebhookRecords: updates, another key's view, delete with its
// deliveries, and pruning.
func TestWebhookRecords(t *testing.T) {
	s, _ := openTest(t)
	ctx := t.Context()
	now := base
	s.now = func() time.Time { return now }
	newWebhook(t, s, "wh_1", "k", []string{"sandbox.*"})
	if _, err := s.GetWebhook(ctx, "other", "wh_1"); !errdefs.IsNotFound(err) || errdefs.Code(err) != "webhook_not_found" {
		t.Errorf("another key's GetWebhook: %v", err)
	}
	if _, err := s.UpdateWebhook(ctx, "other", "wh_1", func(*webhook.Webhook) error { return nil }); !errdefs.IsNotFound(err) {
		t.Errorf("another key's UpdateWebhook: %v", err)
	}
	until := now.Add(time.Hour)
	w, err := s.UpdateWebhook(ctx, "k", "wh_1", func(w *webhook.Webhook) error {
		w.PreviousSecret, w.PreviousUntil, w.Secret, w.Enabled = w.Secret, &until, "whsec_new", false
		return nil
	})
	if err != nil || w.Secret != "whsec_new" || w.Enabled {
		t.Fatalf("UpdateWebhook: %+v, %v", w, err)
	}
	got, err := s.GetWebhook(ctx, "k", "wh_1")
	if err != nil || got.PreviousSecret != "whsec_wh_1" || !got.PreviousUntil.Equal(until) || len(got.Events) != 1 {
		t.Fatalf("GetWebhook after update: %+v, %v", got, err)
	}
	if s := got.Secrets(now); len(s) != 2 || s[0] != "whsec_new" {
		t.Errorf("secrets during the grace: %v", s)
	}
	if s := got.Secrets(until); len(s) != 1 {
		t.Errorf("secrets after the grace: %v", s)
	}

	// A disabled webhook is given nothing; events wait for nobody.
	if err := s.PublishEvent(ctx, &webhook.Event{Owner: "k", Type: webhook.SandboxCreated, ResourceType: "sandbox", ResourceID: "sbx"}); err != nil {
		t.Fatal(err)
	}
	if n, err := s.FanOut(ctx, 10, 10); err != nil || n != 0 {
		t.Errorf("FanOut to a disabled webhook: %d, %v", n, err)
	}
	d := &webhook.Delivery{WebhookID: "wh_1", Owner: "k", EventType: webhook.WebhookTest, ResourceID: "wh_1", State: webhook.StateFailed, Body: []byte("{}")}
	if err := s.AddDelivery(ctx, d, "", time.Minute); err != nil {
		t.Fatal(err)
	}
	now = now.Add(15 * 24 * time.Hour)
	if err := s.PruneFeed(ctx, now.Add(-14*24*time.Hour), 100); err != nil {
		t.Fatal(err)
	}
	if events, err := s.ListFeed(ctx, webhook.FeedQuery{Owner: "k", Limit: 10}); err != nil || len(events) != 0 {
		t.Errorf("feed after pruning: %d events, %v", len(events), err)
	}
	if _, err := s.GetDelivery(ctx, "k", d.ID); !errdefs.IsNotFound(err) {
		t.Errorf("a finished delivery past retention: %v, want pruned", err)
	}
	if _, err := s.DeleteWebhook(ctx, "other", "wh_1"); !errdefs.IsNotFound(err) {
		t.Errorf("another key's DeleteWebhook: %v", err)
	}
	if _, err := s.DeleteWebhook(ctx, "k", "wh_1"); err != nil {
		t.Fatal(err)
	}
	if list, err := s.ListWebhooks(ctx, "k"); err != nil || len(list) != 0 {
		t.Errorf("webhooks after delete: %d, %v", len(list), err)
	}
}
