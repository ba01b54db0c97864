package sandbox

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
	"time"
)

func TestBackoff(t *testing.T) {
	for n := 1; n < 40; n++ {
		d := min(reconnectBackoffMin<<min(n-1, 20), reconnectBackoffMax)
		for range 50 {
			got := backoff(n)
			if got < d/2 || got > d {
				t.Fatalf("backoff(%d) = %s, want within [%s, %s]", n, got, d/2, d)
			}
		}
	}
	// Jitter: two sandboxes failing together do not retry together.
	seen := map[time.Duration]bool{}
	for range 20 {
		seen[backoff(5)] = true
	}
	if len(seen) < 5 {
		t.Errorf("backoff(5) took only %d values in 20 draws", len(seen))
	}
}

// A guest can make the host log at most guestLogBurst warnings a window,
// and the lines left out are counted in one line.
func TestGuestWarnRateLimited(t *testing.T) {
	var buf bytes.Buffer
	c := conduct{log: slog.New(slog.NewTextHandler(&buf, nil))}
	in := &instance{id: "sbx_1"}
	for range 1000 {
		c.warn(in, "guest connection lost")
	}
	if n := strings.Count(buf.String(), "guest connection lost"); n != guestLogBurst {
		t.Errorf("%d warnings logged, want %d", n, guestLogBurst)
	}
	if n := strings.Count(buf.String(), "rate-limiting"); n != 1 {
		t.Errorf("%d rate-limiting lines, want 1", n)
	}
	// A new window logs again, after a line counting what was left out.
	in.safety.logStart = in.safety.logStart.Add(-guestLogWindow)
	buf.Reset()
	c.warn(in, "guest connection lost")
	if !strings.Contains(buf.String(), "count=990") || !strings.Contains(buf.String(), "guest connection lost") {
		t.Errorf("after the window: %s", buf.String())
	}
}
