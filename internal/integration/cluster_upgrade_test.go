package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/emberbox/emberbox/internal/pgtest"
)

// The rolling upgrade's cluster: three nodes of four small slots each, so
// that the six sandboxes fit on any two of them.
const (
	upgradeMemMiB   = 512
	upgradeSlots    = 4
	upgradeSlotsMiB = upgradeSlots * (upgradeMemMiB + clusterOverheadMiB)
)

// upgradeBox is one of the rolling upgrade's sandboxes and what it must
// keep.
type upgradeBox struct {
	id   string
	pid  int    // a process it runs
	note string // a file it holds
}

// TestClusterRollingUpgrade restarts each node of a three-node cluster in
// turn as a rolling upgrade does (SIGTERM: the node moves its running
// sandboxes to the others, stops, and starts again), while a client calls
// each of six running sandboxes every 100 ms through a node that is not
// stopping. At the end every sandbox runs with the same process, web
// server, files and egress policy, a terminal left open reattaches to the
// same program, and every call was a success or the retryable
// sandbox_moving (or, for the instant a node's channel closes,
// node_unreachable); the longest pause each client saw is stated.
func TestClusterRollingUpgrade(t *testing.T) {
	needVMs(t)
	nodes := startClusterNodes(t, 1_600_000, upgradeSlotsMiB, "--stop-drain-timeout", "3m")
	key := nodes[0].s.AdminKey
	via := func(n *clusterNode) *client { return n.s.client(key) }
	waitUp := func() {
		t.Helper()
		if !waitUntil(2*time.Minute, 200*time.Millisecond, func() bool {
			up := 0
			for _, n := range listClusterNodes(t, via(nodes[0])) {
				if n.State == "up" {
					up++
				}
			}
			return up == len(nodes)
		}) {
			t.Fatalf("the nodes never were all up: %+v", listClusterNodes(t, via(nodes[0])))
		}
	}
	waitUp()

	// Six sandboxes, two a node, each with a process, a web server, a
	// file and an egress policy.
	var boxes []*upgradeBox
	for i := range 6 {
		var spread []string
		for _, b := range boxes[i-i%3:] {
			spread = append(spread, b.id) // a node of its own in each three
		}
		body := map[string]any{"memoryMiB": upgradeMemMiB, "vcpu": 1, "timeoutSeconds": 3600,
			"network": map[string]any{"allow": []string{"pypi.org"}}}
		if len(spread) > 0 {
			body["spreadFrom"] = spread
		}
		sb := via(nodes[0]).createRunning(t, body)
		b := &upgradeBox{id: sb.ID, note: fmt.Sprintf("box %d before the upgrade", i)}
		c := via(nodes[0])
		c.writeFile(t, b.id, "/workspace/note.txt", []byte(b.note+"\n"))
		b.pid = c.spawn(t, b.id, "sleep 3600").PID
		serveHTTP(t, c, b.id)
		boxes = append(boxes, b)
	}
	// Gone before the nodes stop at the end (a deferred call runs before
	// the cleanups that stop them), or each would move them to the others
	// first.
	defer func() {
		for _, b := range boxes {
			via(nodes[0]).delete(t, b.id)
		}
	}()
	placed := map[string]int{}
	for _, b := range boxes {
		placed[via(nodes[0]).get(t, b.id).Node]++
	}
	t.Logf("placement before the upgrade: %v", placed)
	// A terminal on box 0, left open: its program outlives the moves, and
	// a client reattaches to it after them.
	tctx, tcancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer tcancel()
	term := dialTerminal(t, tctx, via(nodes[0]), boxes[0].id, url.Values{"command": {"python3 -i"}, "cols": {"80"}, "rows": {"24"}})
	termPID := terminalReady(t, tctx, term)
	terminalUntil(t, tctx, term, ">>> ")
	if err := term.Write(tctx, websocket.MessageBinary, []byte("x = 41\n")); err != nil {
		t.Fatal(err)
	}
	terminalUntil(t, tctx, term, ">>> ")
	term.Close(websocket.StatusNormalClosure, "")
	refusedBefore := egressRefusal(t, via(nodes[0]), boxes[0].id)
	if refusedBefore != "rule-not-allowed" {
		t.Fatalf("a host outside the egress policy before the upgrade: %s, want rule-not-allowed", refusedBefore)
	}

	// A client per sandbox, through any node but the one stopping.
	var stopping atomic.Int32 // index of the node stopping; -1 none
	stopping.Store(-1)
	type clientLog struct {
		maxGap  time.Duration
		calls   int
		moving  int
		other   []string
		refused []string
	}
	logs := make([]clientLog, len(boxes))
	done := make(chan struct{})
	var wg sync.WaitGroup
	for i, b := range boxes {
		wg.Go(func() {
			l := &logs[i]
			last := time.Now()
			for k := 0; ; k++ {
				select {
				case <-done:
					l.maxGap = max(l.maxGap, time.Since(last))
					return
				case <-time.After(100 * time.Millisecond):
				}
				n := nodes[k%len(nodes)]
				if int(stopping.Load()) == k%len(nodes) {
					n = nodes[(k+1)%len(nodes)]
				}
				r := via(n).raw(t, "POST", "/v1/sandboxes/"+b.id+":exec", execReq{Command: "true"}, nil, requestTimeout)
				var res execResult
				l.calls++
				switch {
				case r.err == nil && r.Status == http.StatusOK && json.Unmarshal(r.Body, &res) == nil && exited0(res):
					l.maxGap = max(l.maxGap, time.Since(last))
					last = time.Now()
				case r.Status == http.StatusServiceUnavailable && r.errorCode() == "sandbox_moving":
					l.moving++
				case r.Status == http.StatusServiceUnavailable && r.errorCode() == "node_unreachable", r.err != nil:
					l.other = append(l.other, fmt.Sprintf("via %s: %d %s %v", n.id, r.Status, r.errorCode(), r.err))
				default:
					l.refused = append(l.refused, fmt.Sprintf("via %s: %d %s", n.id, r.Status, r.errorCode()))
				}
			}
		})
	}

	for i, n := range nodes {
		stopping.Store(int32(i))
		time.Sleep(300 * time.Millisecond) // calls in flight through it end
		began := time.Now()
		if err := n.s.cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		select {
		case <-n.s.exited:
		case <-time.After(5 * time.Minute):
			t.Fatalf("node %s did not stop within 5 minutes of SIGTERM:\n%s", n.id, n.s.logTail(30))
		}
		t.Logf("node %s: stopped %s after SIGTERM", n.id, time.Since(began).Round(10*time.Millisecond))
		for _, line := range movedLines(n) {
			t.Logf("node %s: %s", n.id, line)
		}
		n.start(t) // the "new binary": the node takes sandboxes again once it serves
		waitUp()
		stopping.Store(-1)
		for _, b := range boxes {
			if got := via(nodes[(i+1)%len(nodes)]).get(t, b.id); got.State != "running" || got.Node == "" {
				t.Errorf("after node %s's restart sandbox %s is %s on %q, want running", n.id, b.id, got.State, got.Node)
			}
		}
	}
	close(done)
	wg.Wait()

	c := via(nodes[0])
	placed = map[string]int{}
	for i, b := range boxes {
		sb := c.get(t, b.id)
		placed[sb.Node]++
		if got := c.sh(t, b.id, "cat /workspace/note.txt; curl -sf -o /dev/null -w '%{http_code}' localhost:8000/"); got != b.note+"\n200" {
			t.Errorf("box %d after the upgrade: file and server answer %q", i, got)
		}
		alive := slices.ContainsFunc(c.processes(t, b.id), func(p processJSON) bool { return p.PID == b.pid && p.State == "running" })
		if !alive {
			t.Errorf("box %d: process %d did not survive the upgrade", i, b.pid)
		}
		var n networkJSON
		if r := c.raw(t, "GET", "/v1/sandboxes/"+b.id+"/network", nil, nil, requestTimeout); r.Status != http.StatusOK || json.Unmarshal(r.Body, &n) != nil ||
			!slices.Equal(n.Allow, []string{"pypi.org"}) || !n.Enforced {
			t.Errorf("box %d: egress policy after the upgrade %s", i, r.Body)
		}
		l := logs[i]
		t.Logf("box %d: %d calls, %d answered sandbox_moving, longest pause %s", i, l.calls, l.moving, l.maxGap.Round(10*time.Millisecond))
		if len(l.other) > 0 {
			t.Logf("box %d: calls that met a node going away: %v", i, l.other)
		}
		if len(l.refused) > 0 {
			t.Errorf("box %d: calls answered other than sandbox_moving: %v", i, l.refused)
		}
	}
	term = dialTerminal(t, tctx, c, boxes[0].id, url.Values{"processId": {termPID}})
	if again := terminalReady(t, tctx, term); again != termPID {
		t.Fatalf("reattached to terminal %s after the upgrade, want %s", again, termPID)
	}
	if err := term.Write(tctx, websocket.MessageBinary, []byte("x + 1\n")); err != nil {
		t.Fatal(err)
	}
	terminalUntil(t, tctx, term, "42\r\n>>> ")
	if got := egressRefusal(t, c, boxes[0].id); got != refusedBefore {
		t.Errorf("a host outside the egress policy after the upgrade: %s, want %s", got, refusedBefore)
	}
	t.Logf("placement after the upgrade: %v", placed)
}

// egressRefusal is what the sandbox's gate answers a request to a host
// outside its policy: its X-Emberbox-Egress value, or the failure.
func egressRefusal(t testing.TB, c *client, id string) string {
	t.Helper()
	out := c.sh(t, id, fmt.Sprintf(curlCmd, "http://denied.test/")+"; true")
	lower := strings.ToLower(out)
	if i := strings.Index(lower, "x-emberbox-egress: "); i >= 0 {
		return strings.Fields(out[i+len("x-emberbox-egress: "):])[0]
	}
	return "failed: " + strings.TrimSpace(out)
}

// movedLines are a stopped node's log lines about sandboxes it moved.
func movedLines(n *clusterNode) []string {
	var out []string
	b, _ := os.ReadFile(n.s.LogPath)
	for _, line := range strings.Split(string(b), "\n") {
		if strings.Contains(line, "moved a running sandbox") {
			out = append(out, line)
		}
	}
	return out
}

// startClusterNodes starts nodes a, b and c of a cluster on 127.0.0.1–3
// and one fresh database, each promising maxMemMiB to sandboxes, with the
// tests' heartbeat and timeout, no templates and no quota, VM uids from
// uidBase, and the extra flags.
func startClusterNodes(t testing.TB, uidBase, maxMemMiB int, extra ...string) []*clusterNode {
	t.Helper()
	dsn := pgtest.Start(t).NewDatabase(t)
	nodes := []*clusterNode{{id: "a", host: "127.0.0.1"}, {id: "b", host: "127.0.0.2"}, {id: "c", host: "127.0.0.3"}}
	for i, n := range nodes {
		n.dataDir = t.TempDir()
		n.channel = fmt.Sprintf("%s:%d", n.host, freePort(t))
		n.args = append([]string{"--store", dsn, "--node-id", n.id, "--cluster-listen", n.channel,
			"--node-heartbeat", clusterHeartbeat.String(), "--node-timeout", clusterTimeout.String(),
			"--max-memory-mib", fmt.Sprint(maxMemMiB), "--vm-overhead-mib", fmt.Sprint(clusterOverheadMiB),
			"--quota-sandboxes", "0", "--templates=false", "--memory-floor-mib", "0",
			"--vm-uid-base", fmt.Sprint(uidBase + i*10_000), "--vm-uid-count", "10000"}, extra...)
		n.start(t)
	}
	return nodes
}
