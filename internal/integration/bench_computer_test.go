package integration

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// BenchmarkComputerUse measures computer use in fresh default sandboxes on
// this machine: a browser's start (to a DevTools answer), the desktop's
// start (to a display that answers), screenshots of the desktop, the
// VM's Pss with the headless browser open, and the computer-use layer's
// size on disk. It asserts nothing about time.
func BenchmarkComputerUse(b *testing.B) {
	for range b.N {
		var t table
		_, c := templateServer(b)
		t.note("accel", accelOf(b, c))
		const boxes = 3
		var browser, desktop, shots, pssBefore, pssAfter []float64
		for range boxes {
			sb := c.createRunning(b, map[string]any{"timeoutSeconds": 3600})
			c.sh(b, sb.ID, "true")
			pssBefore = append(pssBefore, pssMiB(b, vmPID(sb.ID)))
			start := time.Now()
			postOK(b, c, "/v1/sandboxes/"+sb.ID+"/browser:start", map[string]any{})
			browser = append(browser, ms(time.Since(start)))
			pssAfter = append(pssAfter, pssMiB(b, vmPID(sb.ID)))

			start = time.Now()
			postOK(b, c, "/v1/sandboxes/"+sb.ID+"/desktop:start", map[string]any{"width": 1280, "height": 720})
			desktop = append(desktop, ms(time.Since(start)))
			for range 5 {
				start = time.Now()
				r := c.raw(b, "GET", "/v1/sandboxes/"+sb.ID+"/desktop/screenshot", nil, nil, requestTimeout)
				if r.err != nil || r.Status != http.StatusOK || len(r.Body) < 1000 {
					b.Fatalf("screenshot: %v", r)
				}
				shots = append(shots, ms(time.Since(start)))
			}
			c.delete(b, sb.ID)
		}
		t.row("browser start in a fresh sandbox (headless, to DevTools)", browser)
		t.row("desktop start in a fresh sandbox (1280x720)", desktop)
		t.row("desktop screenshot, PNG 1280x720", shots)
		t.rowUnit("VM Pss before the browser", pssBefore, "MiB")
		t.rowUnit("VM Pss with the headless browser open (about:blank)", pssAfter, "MiB")
		if dir, err := os.UserCacheDir(); err == nil {
			if st, err := os.Stat(filepath.Join(dir, "emberbox", "images", "current", "layer.img")); err == nil {
				t.note("computer-use layer, apparent size (allocated: du)", fmt.Sprintf("%d MiB", st.Size()>>20))
			}
		}
		t.print()
	}
}

// postOK posts body to path and fails unless it answers 200.
func postOK(b testing.TB, c *client, path string, body any) {
	b.Helper()
	r := c.raw(b, "POST", path, body, nil, 5*time.Minute)
	if r.err != nil || r.Status != http.StatusOK {
		b.Fatalf("POST %s: %v", path, r)
	}
}
