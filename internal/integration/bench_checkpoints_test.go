package integration

import (
	"encoding/json"
	"fmt"
	"net/http"
	"testing"
	"time"
)

// BenchmarkCheckpoints measures checkpoints for a typical agent step (a
// file edit and a pip install or uninstall) on this machine:
//
//   - a checkpoint that the step waits for (wait:true): time and bytes;
//   - a checkpoint in the background (wait:false), the overhead it adds to
//     the agent's next step: the call itself plus how much later the next
//     command answers than it does without a checkpoint, when the agent
//     thinks for 0 s and for 2 s between steps;
//   - a restore of a running sandbox to an earlier step, and a branch of
//     one, each to the first output.
//
// It asserts nothing about time.
func BenchmarkCheckpoints(b *testing.B) {
	for range b.N {
		var t table
		s, c := templateServer(b)
		t.note("accel", accelOf(b, c))
		sb := c.createRunning(b, map[string]any{"timeoutSeconds": 3600})
		c.sh(b, sb.ID, "pip download -q -d /tmp/wheels tabulate >/dev/null 2>&1; echo ok")

		const steps = 10
		step := func(i int) {
			verb := "install -q --no-index --find-links /tmp/wheels tabulate"
			if i%2 == 1 {
				verb = "uninstall -y -q tabulate"
			}
			c.sh(b, sb.ID, fmt.Sprintf("echo 'step %d' >> /workspace/notes.md && sed -i 's/step/Step/' /workspace/notes.md && pip %s 2>&1; echo ok", i, verb))
		}
		firstOutput := func() float64 {
			start := time.Now()
			c.sh(b, sb.ID, "true")
			return ms(time.Since(start))
		}

		var waitMs, bytes []float64
		var ids []string
		for i := range steps {
			step(i)
			start := time.Now()
			cp, _ := c.checkpoint(b, sb.ID, fmt.Sprintf("step-%d", i))
			waitMs = append(waitMs, ms(time.Since(start)))
			bytes = append(bytes, float64(cp.SizeBytes)/(1<<20))
			ids = append(ids, cp.ID)
		}
		t.row("checkpoint after a step, waited for", waitMs)
		t.rowUnit("checkpoint size after a step", bytes, "MiB")

		var base []float64
		for i := range steps {
			step(i)
			base = append(base, firstOutput())
		}
		t.row("next command after a step, no checkpoint", base)
		for _, think := range []time.Duration{0, 2 * time.Second} {
			var added []float64
			for i := range steps {
				step(i)
				start := time.Now()
				r := c.raw(b, "POST", "/v1/sandboxes/"+sb.ID+"/checkpoints", map[string]any{"label": "bg", "wait": false}, nil, requestTimeout)
				if r.err != nil || r.Status != http.StatusAccepted {
					b.Fatalf("background checkpoint: %v", r)
				}
				call := time.Since(start)
				time.Sleep(think)
				added = append(added, ms(call)+firstOutput()-percentile(base, 50))
			}
			t.row(fmt.Sprintf("step overhead, background checkpoint, agent thinks %s", think), added)
		}

		// The background checkpoints pushed the first ones past the cap.
		ids = ids[:0]
		for _, cp := range c.checkpoints(b, sb.ID) {
			if cp.State == "ready" {
				ids = append(ids, cp.ID)
			}
		}
		var restore, branch []float64
		for i := range 5 {
			start := time.Now()
			c.restore(b, sb.ID, ids[len(ids)-1-i*2], false)
			firstOutput()
			restore = append(restore, ms(time.Since(start)))
		}
		t.row("restore of a running sandbox → first output", restore)
		for range 3 {
			start := time.Now()
			r := c.raw(b, "POST", "/v1/sandboxes/"+sb.ID+"/checkpoints/"+ids[0]+":branch", map[string]any{"count": 1}, nil, requestTimeout)
			if r.err != nil || r.Status != http.StatusOK {
				b.Fatalf("branch: %v", r)
			}
			var out struct {
				Sandboxes []sandboxJSON `json:"sandboxes"`
			}
			if err := json.Unmarshal(r.Body, &out); err != nil || len(out.Sandboxes) != 1 {
				b.Fatalf("branch answered %s: %v", r.Body, err)
			}
			s.tr.add(out.Sandboxes[0].ID, s.AdminKey)
			c.sh(b, out.Sandboxes[0].ID, "true")
			branch = append(branch, ms(time.Since(start)))
			c.delete(b, out.Sandboxes[0].ID)
		}
		t.row("branch of one → first output", branch)
		t.print()
	}
}
