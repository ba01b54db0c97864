package integration

import (
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestLease checks that the server ends sandboxes at the end of their lease
// as onLeaseEnd says, and that :extend moves the lease. The three sandboxes
// wait out their leases in parallel.
func TestLease(t *testing.T) {
	needVMs(t)
	t.Parallel() // with TestAPI: this test mostly waits
	s := startServer(t, t.TempDir())
	c := s.client(s.AdminKey)
	small := func(extra map[string]any) map[string]any {
		body := map[string]any{"vcpu": 1, "memoryMiB": 1024, "timeoutSeconds": 60}
		for k, v := range extra {
			body[k] = v
		}
		return body
	}

	t.Run("ExpireStop", func(t *testing.T) {
		t.Parallel()
		sb := c.createRunning(t, small(map[string]any{"onLeaseEnd": "stop"}))
		if sb.ExpiresAt == nil || sb.ReadyAt == nil {
			t.Fatalf("running sandbox without readyAt/expiresAt: %+v", sb)
		}
		if d := sb.ExpiresAt.Sub(*sb.ReadyAt); d < 59*time.Second || d > 61*time.Second {
			t.Errorf("expiresAt is %s after readyAt, want 60 s", d)
		}
		exp := *sb.ExpiresAt
		var seen time.Time
		var last sandboxJSON
		ok := waitUntil(time.Until(exp)+30*time.Second, time.Second, func() bool {
			last = c.get(t, sb.ID)
			if last.State == "stopped" {
				seen = time.Now()
				return true
			}
			if last.State != "running" && last.State != "stopping" {
				t.Errorf("state %q before the lease ended", last.State)
			}
			if last.State != "running" && time.Now().Before(exp) {
				t.Errorf("state %q at %s, %s before expiresAt", last.State, time.Now().Format(time.RFC3339Nano), time.Until(exp))
			}
			return false
		})
		if !ok {
			t.Fatalf("sandbox still %q 30 s after expiresAt %s", last.State, exp.Format(time.RFC3339Nano))
		}
		if last.stopReason() != "lease_expired" {
			t.Errorf("stopReason %q, want lease_expired", last.stopReason())
		}
		if last.EndedAt == nil {
			t.Fatalf("stopped sandbox has no endedAt")
		}
		if last.EndedAt.Before(exp) {
			t.Errorf("endedAt %s is before expiresAt %s", last.EndedAt, exp)
		}
		if pid := vmPID(sb.ID); pid != 0 {
			t.Errorf("lease-expired sandbox's VM is still running (pid %d)", pid)
		}
		t.Logf("lease end: endedAt is %s after expiresAt; the stop was seen %s after it (polling every 1 s)",
			last.EndedAt.Sub(exp).Round(time.Millisecond), seen.Sub(exp).Round(time.Millisecond))
	})

	t.Run("ExpireDelete", func(t *testing.T) {
		t.Parallel()
		sb := c.createRunning(t, small(map[string]any{"onLeaseEnd": "delete"}))
		if sb.OnLeaseEnd != "delete" || sb.ExpiresAt == nil {
			t.Fatalf("onLeaseEnd %q expiresAt %v", sb.OnLeaseEnd, sb.ExpiresAt)
		}
		exp := *sb.ExpiresAt
		var seen time.Time
		var last *response
		ok := waitUntil(time.Until(exp)+30*time.Second, time.Second, func() bool {
			last = c.raw(t, "GET", "/v1/sandboxes/"+sb.ID, nil, nil, requestTimeout)
			if last.Status == http.StatusNotFound {
				seen = time.Now()
				return true
			}
			if last.Status != http.StatusOK {
				t.Errorf("GET: %v", last)
			} else if time.Now().Before(exp) && !strings.Contains(string(last.Body), `"state":"running"`) {
				t.Errorf("before expiresAt: %s", last.Body)
			}
			return false
		})
		if !ok {
			t.Fatalf("sandbox still there 30 s after expiresAt: %v", last)
		}
		if last.Err == nil || last.Err.Code != "not_found" {
			t.Errorf("after the lease: %v, want 404 not_found", last)
		}
		if seen.Before(exp) {
			t.Errorf("deleted at %s, before expiresAt %s", seen, exp)
		}
		if pid := vmPID(sb.ID); pid != 0 {
			t.Errorf("deleted sandbox's VM is still running (pid %d)", pid)
		}
		for _, l := range c.list(t, "?includeStopped=true") {
			if l.ID == sb.ID {
				t.Errorf("deleted sandbox still listed as %s", l.State)
			}
		}
		t.Logf("lease end with onLeaseEnd delete: 404 seen %s after expiresAt (polling every 1 s)", seen.Sub(exp).Round(time.Millisecond))
	})

	t.Run("Extend", func(t *testing.T) {
		t.Parallel()
		sb := c.createRunning(t, small(nil))
		exp := *sb.ExpiresAt
		ext, _ := call[sandboxJSON](t, c, "POST", "/v1/sandboxes/"+sb.ID+":extend", map[string]any{"seconds": 600}, nil)
		if ext.ExpiresAt == nil || ext.ExpiresAt.Sub(exp) < 500*time.Second {
			t.Fatalf(":extend 600 s moved expiresAt from %s to %v", exp, ext.ExpiresAt)
		}
		if got := c.get(t, sb.ID); got.ExpiresAt == nil || !got.ExpiresAt.Equal(*ext.ExpiresAt) {
			t.Errorf("GET after :extend shows expiresAt %v, want %s", got.ExpiresAt, ext.ExpiresAt)
		}
		// Never shortens.
		again, _ := call[sandboxJSON](t, c, "POST", "/v1/sandboxes/"+sb.ID+":extend", map[string]any{"seconds": 60}, nil)
		if again.ExpiresAt == nil || !again.ExpiresAt.Equal(*ext.ExpiresAt) {
			t.Errorf(":extend 60 after :extend 600 moved expiresAt to %v (was %s)", again.ExpiresAt, ext.ExpiresAt)
		}
		if r := c.raw(t, "POST", "/v1/sandboxes/"+sb.ID+":extend", map[string]any{"seconds": 0}, nil, requestTimeout); r.Status != http.StatusBadRequest {
			t.Errorf(":extend 0: %v, want 400", r)
		}
		// The old lease end passes without effect.
		waitUntil(time.Until(exp)+5*time.Second, time.Second, func() bool {
			if got := c.get(t, sb.ID); got.State != "running" {
				t.Fatalf("extended sandbox is %s (stopReason %q) at %s, its old lease end was %s",
					got.State, got.stopReason(), time.Now().Format(time.RFC3339), exp.Format(time.RFC3339))
			}
			return false
		})
		c.sh(t, sb.ID, "true")
		c.delete(t, sb.ID)
	})
}
