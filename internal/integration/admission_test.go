package integration

import (
	"encoding/json"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// swapUsedKiB returns SwapTotal−SwapFree of /proc/meminfo and SwapTotal.
func swapUsedKiB(t testing.TB) (used, total int64) {
	t.Helper()
	data, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		t.Fatal(err)
	}
	var free int64
	for _, line := range strings.Split(string(data), "\n") {
		name, rest, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		n, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
		switch name {
		case "SwapTotal":
			total = n
		case "SwapFree":
			free = n
		}
	}
	return total - free, total
}

// retryAfter checks that r is status with code and a wait in the body and
// the Retry-After header, and returns the wait in milliseconds.
func retryAfter(t testing.TB, r *response, status int, code string) int64 {
	t.Helper()
	if r.err != nil || r.Status != status {
		t.Fatalf("want HTTP %d %s, got %v", status, code, r)
	}
	var eb struct {
		Error struct {
			Code         string `json:"code"`
			RetryAfterMs int64  `json:"retryAfterMs"`
		} `json:"error"`
	}
	if err := json.Unmarshal(r.Body, &eb); err != nil || eb.Error.Code != code {
		t.Fatalf("want code %s, got %s (%v)", code, r.Body, err)
	}
	if eb.Error.RetryAfterMs <= 0 {
		t.Errorf("%s without retryAfterMs: %s", code, r.Body)
	}
	if ra, err := strconv.Atoi(r.Header.Get("Retry-After")); err != nil || ra < 1 {
		t.Errorf("%s: Retry-After %q, want whole seconds", code, r.Header.Get("Retry-After"))
	}
	return eb.Error.RetryAfterMs
}

// TestAdmission fills a server whose capacity is two small sandboxes: the
// next create is refused with no_capacity and the host does not swap, a
// key at its quota gets 429 quota_exceeded, a burst beyond a key's rate
// gets 429 rate_limited, and once a sandbox is deleted a create succeeds.
func TestAdmission(t *testing.T) {
	swapBefore, swapTotal := swapUsedKiB(t)
	// 1 vCPU and 1024 MiB each, plus 256 MiB of overhead: two fit in
	// 2560 MiB. Reads are limited tightly for the burst below.
	s := startServerWith(t, t.TempDir(),
		"--max-memory-mib", "2560", "--vm-overhead-mib", "256", "--max-vcpus", "4",
		"--quota-sandboxes", "1", "--rate-read", "2", "--rate-read-burst", "10")
	admin := s.client(s.AdminKey)
	tenant := s.client(s.createKey(t, "tenant"))
	small := map[string]any{"vcpu": 1, "memoryMiB": 1024, "diskMiB": 3072, "timeoutSeconds": 600}

	first := admin.createRunning(t, small)
	// The tenant's key may hold one sandbox; the admin key here has the
	// same quota, so the second sandbox is the tenant's.
	second := tenant.createRunning(t, small)
	admin.sh(t, first.ID, "true")
	tenant.sh(t, second.ID, "true")

	t.Run("Quota", func(t *testing.T) {
		r := tenant.raw(t, "POST", "/v1/sandboxes", small, nil, requestTimeout)
		retryAfter(t, r, http.StatusTooManyRequests, "quota_exceeded")
	})

	t.Run("NoCapacity", func(t *testing.T) {
		other := s.client(s.createKey(t, "other"))
		r := other.raw(t, "POST", "/v1/sandboxes", small, http.Header{"Idempotency-Key": {"full-1"}}, requestTimeout)
		retryAfter(t, r, http.StatusConflict, "no_capacity")
		// A retry with the same key runs again rather than replaying.
		r = other.raw(t, "POST", "/v1/sandboxes", small, http.Header{"Idempotency-Key": {"full-1"}}, requestTimeout)
		retryAfter(t, r, http.StatusConflict, "no_capacity")
		// Too large for the server at all is a 400 naming the field.
		big := map[string]any{"vcpu": 1, "memoryMiB": 4096, "diskMiB": 3072}
		r = other.raw(t, "POST", "/v1/sandboxes", big, nil, requestTimeout)
		if r.Status != http.StatusBadRequest || r.Err == nil || !strings.Contains(strings.Join(r.Err.issuePaths(), ","), "memoryMiB") {
			t.Errorf("create above the per-sandbox limit: %v, want 400 naming memoryMiB", r)
		}
	})

	t.Run("NoSwap", func(t *testing.T) {
		used, _ := swapUsedKiB(t)
		if used > swapBefore {
			t.Errorf("swap in use grew from %d KiB to %d KiB with the server full", swapBefore, used)
		}
		t.Logf("swap: %d KiB total, %d KiB in use before, %d KiB now", swapTotal, swapBefore, used)
	})

	t.Run("RateLimit", func(t *testing.T) {
		burst := s.client(s.createKey(t, "burst"))
		var mu sync.Mutex
		codes := map[int]int{}
		var limited *response
		var wg sync.WaitGroup
		for range 40 {
			wg.Go(func() {
				r := burst.raw(t, "GET", "/v1/sandboxes", nil, nil, requestTimeout)
				mu.Lock()
				defer mu.Unlock()
				codes[r.Status]++
				if r.Status == http.StatusTooManyRequests {
					limited = r
				}
			})
		}
		wg.Wait()
		if codes[http.StatusOK] < 10 || codes[http.StatusTooManyRequests] == 0 || codes[http.StatusOK]+codes[http.StatusTooManyRequests] != 40 {
			t.Fatalf("40 reads at once against a burst of 10: %v, want 10 or a few more 200s and the rest 429", codes)
		}
		retryAfter(t, limited, http.StatusTooManyRequests, "rate_limited")
		// Another key is not slowed by it.
		if r := admin.raw(t, "GET", "/v1/sandboxes", nil, nil, requestTimeout); r.Status != http.StatusOK {
			t.Errorf("another key during the burst: %v", r)
		}
	})

	// Deleting one gives its room back.
	admin.delete(t, first.ID)
	third := s.client(s.createKey(t, "third"))
	sb := third.createRunning(t, small)
	third.sh(t, sb.ID, "true")
}
