package integration

import (
	"encoding/json"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
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
// gets 429 rate_limited, a key filling volumes, backups and image builds
// meets its quotas (DiskQuotas) while another key's sandbox execs, and
// once a sandbox is deleted another key creates and execs.
func TestAdmission(t *testing.T) {
	swapBefore, swapTotal := swapUsedKiB(t)
	// 1 vCPU and 1024 MiB each, plus 256 MiB of overhead: two fit in
	// 2560 MiB. Reads are limited tightly for the burst below.
	s := startServerWith(t, t.TempDir(),
		"--max-memory-mib", "2560", "--vm-overhead-mib", "256", "--max-vcpus", "4",
		"--quota-sandboxes", "1", "--rate-read", "2", "--rate-read-burst", "10",
		// No volume size quota: a 1 TiB volume meets the host's disk check,
		// strict here (the measured default promises 16 × the free space,
		// which is more than 1 TiB on a disk with 64 GiB free).
		"--disk-overcommit", "1",
		"--quota-volumes", "2", "--quota-volume-mib", "0", "--quota-volume-backups", "2", "--quota-backups-per-volume", "1",
		"--quota-image-builds", "2")
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

	t.Run("DiskQuotas", func(t *testing.T) {
		filler := s.client(s.createKey(t, "filler"))
		fillDisks(t, filler)
		fillBuilds(t, filler)
		tenant.sh(t, second.ID, "true") // another key works throughout
	})

	// A guest that outgrows its memory meets its own kernel's OOM killer:
	// the process dies, the sandbox runs on, and its events say so.
	t.Run("OutgrowsItsMemory", func(t *testing.T) {
		res, _ := tenant.exec(t, second.ID, execReq{Command: `python3 -c '
a = []
while True:
    a.append(b"x" * (64 << 20))
'`, TimeoutMs: 300_000})
		// Killed: -9 when the agent sees the signal, 137 through a shell.
		if res.ExitCode == nil || (*res.ExitCode != -9 && *res.ExitCode != 137) {
			t.Fatalf("allocating past 1024 MiB: exit %s, stderr %q, want -9 or 137 (killed)", res.exit(), res.Stderr)
		}
		tenant.sh(t, second.ID, "true") // the sandbox runs on
		deadline := time.Now().Add(2 * time.Minute)
		for {
			var evs struct {
				Data []struct {
					Type string         `json:"type"`
					Data map[string]any `json:"data"`
				} `json:"data"`
			}
			r := tenant.raw(t, "GET", "/v1/sandboxes/"+second.ID+"/events?limit=1000", nil, nil, requestTimeout)
			if r.Status != http.StatusOK || json.Unmarshal(r.Body, &evs) != nil {
				t.Fatalf("GET events: %v", r)
			}
			for _, ev := range evs.Data {
				if ev.Type == "out_of_memory" {
					t.Logf("out_of_memory event: %v", ev.Data)
					return
				}
			}
			if time.Now().After(deadline) {
				t.Fatal("no out_of_memory event within 2 min of the guest's OOM kill (the meter reads every 15 s)")
			}
			time.Sleep(2 * time.Second)
		}
	})

	third := s.client(s.createKey(t, "third"))
	sb := third.createRunning(t, small)
	third.sh(t, sb.ID, "true")
}

// quotaRefusal checks that r is 429 quota_exceeded on quota, whose hint
// names the flag that raises it.
func quotaRefusal(t testing.TB, r *response, quota, flag string) {
	t.Helper()
	retryAfter(t, r, http.StatusTooManyRequests, "quota_exceeded")
	if r.Err.Details["quota"] != quota || !strings.Contains(r.Err.Hint, flag) {
		t.Errorf("refusal of %s: details %v, hint %q; want quota %s and a hint naming %s", quota, r.Err.Details, r.Err.Hint, quota, flag)
	}
}

// fillDisks creates volumes and backups as c until each quota refuses:
// a sparse volume larger than the host's disk is 409 no_capacity (the
// server admits disks strictly), the third volume and a second backup of
// a volume or a third backup are 429.
// No VM is needed: the volumes are detached.
func fillDisks(t *testing.T, c *client) {
	var st unix.Statfs_t
	if err := unix.Statfs(c.s.DataDir, &st); err != nil {
		t.Fatal(err)
	}
	if free := int64(st.Bavail) * int64(st.Bsize); free < 1<<40 {
		r := c.raw(t, "POST", "/v1/volumes", map[string]any{"sizeMiB": 1 << 20}, nil, requestTimeout)
		retryAfter(t, r, http.StatusConflict, "no_capacity")
	} else {
		t.Logf("the data dir has %d GiB free: a 1 TiB volume fits, not tried", free>>30)
	}
	var ids []string
	for range 2 {
		v, _ := call[struct {
			ID string `json:"id"`
		}](t, c, "POST", "/v1/volumes", map[string]any{"sizeMiB": 64}, nil)
		ids = append(ids, v.ID)
	}
	quotaRefusal(t, c.raw(t, "POST", "/v1/volumes", map[string]any{"sizeMiB": 64}, nil, requestTimeout), "volumes", "--quota-volumes")

	backup := func(id string) *response {
		return c.raw(t, "POST", "/v1/volumes/"+id+":backup", map[string]any{}, nil, 2*time.Minute)
	}
	for i, want := range []string{"", "backupsPerVolume", "", "volumeBackups"} {
		r := backup(ids[i/2])
		if want == "" {
			if r.Status != http.StatusOK {
				t.Fatalf("backup %d: %v", i, r)
			}
			continue
		}
		quotaRefusal(t, r, want, map[string]string{"backupsPerVolume": "--quota-backups-per-volume", "volumeBackups": "--quota-volume-backups"}[want])
	}
}

// fillBuilds queues image builds as c until its cap refuses one, while
// its first build's VM is booting: the build VM counts against c's quota
// of one sandbox, so c's own create is refused too. The builds are
// deleted after, and their VM's room given back.
func fillBuilds(t *testing.T, c *client) {
	build := map[string]any{"recipe": map[string]any{"commands": []string{"true"}}, "build": map[string]any{"memoryMiB": 1024, "vcpu": 1}}
	var ids []string
	queue := func() {
		t.Helper()
		r := c.raw(t, "POST", "/v1/images", build, nil, requestTimeout)
		var img struct {
			ID string `json:"id"`
		}
		if r.err != nil || r.Status != http.StatusCreated || json.Unmarshal(r.Body, &img) != nil {
			t.Fatalf("queueing a build: %v", r)
		}
		ids = append(ids, img.ID)
	}
	defer func() {
		// The queued build first: deleting the running one first would
		// let the queue start it.
		for _, id := range slices.Backward(ids) {
			if r := c.raw(t, "POST", "/v1/images/"+id+":delete", map[string]any{}, nil, requestTimeout); r.Status != http.StatusOK {
				t.Errorf("deleting build %s: %v", id, r)
			}
		}
		if !waitUntil(3*time.Minute, readPoll, func() bool { return sandboxesHeld(t, c) == 0 }) {
			t.Errorf("the build VM still holds the key's quota after its build was deleted")
		}
	}()
	queue()
	// The first build runs: its VM is admitted (and boots for seconds).
	if !waitUntil(2*time.Minute, readPoll, func() bool { return sandboxesHeld(t, c) == 1 }) {
		t.Fatal("the build's VM never counted against its key")
	}
	quotaRefusal(t, c.raw(t, "POST", "/v1/sandboxes", map[string]any{"vcpu": 1, "memoryMiB": 1024, "diskMiB": 3072}, nil, requestTimeout),
		"sandboxes", "--quota-sandboxes")
	queue()
	quotaRefusal(t, c.raw(t, "POST", "/v1/images", build, nil, requestTimeout), "imageBuilds", "--quota-image-builds")
}

// readPoll keeps polls under TestAdmission's read rate (2/s per key).
const readPoll = 600 * time.Millisecond

// sandboxesHeld reads the sandboxes c's key holds from GET /v1/limits.
func sandboxesHeld(t testing.TB, c *client) int64 {
	t.Helper()
	lim, _ := call[struct {
		Account []struct {
			Limit string `json:"limit"`
			Used  int64  `json:"used"`
		} `json:"account"`
	}](t, c, "GET", "/v1/limits", nil, nil)
	for _, row := range lim.Account {
		if row.Limit == "sandbox.count" {
			return row.Used
		}
	}
	t.Fatal("GET /v1/limits has no sandbox.count")
	return 0
}
