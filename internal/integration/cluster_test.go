package integration

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/emberbox/emberbox/internal/pgtest"
	"github.com/emberbox/emberbox/internal/secrets"
)

// The cluster under test: three nodes on three loopback addresses sharing
// one PostgreSQL database. Their memory is set so that six sandboxes of
// clusterMemMiB fill the cluster exactly (a: 3, b: 2, c: 1) and a
// default-size sandbox fits on an empty node a.
const (
	clusterMemMiB      = 1536
	clusterOverheadMiB = 256
	clusterSlotMiB     = clusterMemMiB + clusterOverheadMiB
	clusterHeartbeat   = time.Second
	clusterTimeout     = 6 * time.Second
)

type clusterNode struct {
	id, host, dataDir, channel string
	slots                      int
	s                          *server
	args                       []string
}

func (n *clusterNode) start(t testing.TB) {
	t.Helper()
	n.s = startServerArgs2(t, n.host, n.dataDir, n.args)
}

// startServerArgs2 is startServerArgs on another loopback address.
func startServerArgs2(t testing.TB, host, dataDir string, args []string) *server {
	t.Helper()
	needVMs(t)
	var lastErr error
	for range 3 {
		s, err := launch(t, host, dataDir, args, nil)
		if err == nil {
			return s
		}
		lastErr = err
	}
	t.Fatalf("starting node on %s: %v", host, lastErr)
	return nil
}

// TestCluster runs PostgreSQL and three `emberbox serve` nodes on it, each
// booting real VMs, and checks placement, proxying (plain, files,
// processes, streams), capacity across the cluster, drain moving a paused
// sandbox, node loss and a lost node's return, and the withruntime SDK's
// flow through a round-robin front like a Kubernetes Service.
func TestCluster(t *testing.T) {
	needVMs(t)
	dsn := pgtest.Start(t).NewDatabase(t)
	nodes := []*clusterNode{{id: "a", host: "127.0.0.1", slots: 3}, {id: "b", host: "127.0.0.2", slots: 2}, {id: "c", host: "127.0.0.3", slots: 1}}
	// One secrets key for every node, as docs/cluster.md asks: they share
	// the egress secrets and CAs.
	secretsKey := filepath.Join(t.TempDir(), "secrets.key")
	if _, err := secrets.LoadOrCreateKey(secretsKey); err != nil {
		t.Fatal(err)
	}
	for i, n := range nodes {
		n.dataDir = t.TempDir()
		n.channel = fmt.Sprintf("%s:%d", n.host, freePort(t))
		n.args = []string{"--store", dsn, "--node-id", n.id, "--cluster-listen", n.channel,
			"--node-heartbeat", clusterHeartbeat.String(), "--node-timeout", clusterTimeout.String(),
			"--max-memory-mib", fmt.Sprint(n.slots * clusterSlotMiB), "--vm-overhead-mib", fmt.Sprint(clusterOverheadMiB),
			"--quota-sandboxes", "0", "--templates=false", "--memory-floor-mib", "0", "--secrets-key-file", secretsKey,
			// A stop moves nothing (the test's end stops every node) but
			// where StopMovesRunningSandbox asks for it.
			"--stop-drain-timeout", "0",
			// Failed authentications: 10 at once, then one per 20 s.
			"--rate-auth-fail", "0.05", "--rate-auth-fail-burst", "10",
			// Nodes on one host take their VMs' uids from ranges of their own.
			"--vm-uid-base", fmt.Sprint(1_500_000 + i*10_000), "--vm-uid-count", "10000"}
	}
	for _, n := range nodes {
		n.start(t)
	}
	a, b, c := nodes[0], nodes[1], nodes[2]
	key := a.s.AdminKey // keys live in the shared store: any node's works everywhere
	via := func(n *clusterNode) *client { return n.s.client(key) }

	waitNodes := func(want map[string]string) []nodeRowJSON {
		t.Helper()
		var got []nodeRowJSON
		ok := waitUntil(2*time.Minute, 200*time.Millisecond, func() bool {
			got = listClusterNodes(t, via(a))
			seen := map[string]string{}
			for _, n := range got {
				seen[n.ID] = n.State
			}
			for id, st := range want {
				if seen[id] != st {
					return false
				}
			}
			return true
		})
		if !ok {
			t.Fatalf("nodes never became %v: %+v", want, got)
		}
		return got
	}
	waitNodes(map[string]string{"a": "up", "b": "up", "c": "up"})
	// The operator's view: emberbox node list, through any node.
	out, err := exec.Command(filepath.Join(binDir, "emberbox"), "node", "list", "--server", c.s.URL, "--key", key).CombinedOutput()
	if err != nil {
		t.Fatalf("emberbox node list: %v\n%s", err, out)
	}
	for _, id := range []string{"a", "b", "c"} {
		if !regexp.MustCompile(`(?m)^` + id + `\s+up\s`).Match(out) {
			t.Fatalf("emberbox node list shows no node %s up:\n%s", id, out)
		}
	}

	// An egress CA rotated through b is in force on a within seconds.
	rotated, _ := via(b).rotateCA(t, 3600)
	if !waitUntil(30*time.Second, 200*time.Millisecond, func() bool {
		cas := via(a).egressCAs(t)
		return len(cas) == 2 && cas[1].ID == rotated.ID && cas[1].Newest && cas[0].RetireAt != nil
	}) {
		t.Errorf("node a's egress CAs after a rotation on b: %+v, want the new one newest beside the old", via(a).egressCAs(t))
	}

	// Six creates through a: best fit by memory fills c, then b, then a.
	var boxes []sandboxJSON
	for i := range 6 {
		sb := via(a).createRunning(t, map[string]any{"memoryMiB": clusterMemMiB, "vcpu": 1, "name": fmt.Sprintf("spread-%d", i)})
		boxes = append(boxes, sb)
	}
	perNode := map[string][]string{}
	for _, sb := range boxes {
		got := via(a).get(t, sb.ID)
		perNode[got.Node] = append(perNode[got.Node], sb.ID)
	}
	for _, n := range nodes {
		if len(perNode[n.id]) != n.slots {
			t.Fatalf("sandboxes per node %v; want a: 3, b: 2, c: 1 (best fit by memory)", perNode)
		}
		// Each runs where the store says: its VM is under that node's data dir.
		for _, id := range perNode[n.id] {
			if !vmUnder(n.dataDir, id) {
				t.Errorf("sandbox %s of node %s has no VM under %s", id, n.id, n.dataDir)
			}
		}
	}
	t.Logf("placement: %v", perNode)

	t.Run("NoCapacityOnlyWhenFull", func(t *testing.T) {
		r := via(c).raw(t, "POST", "/v1/sandboxes", map[string]any{"memoryMiB": clusterMemMiB, "vcpu": 1}, nil, requestTimeout)
		if r.Status != http.StatusConflict || r.errorCode() != "no_capacity" {
			t.Fatalf("7th create: %v; want 409 no_capacity", r)
		}
		// spreadFrom a sandbox of each node leaves nowhere either; of
		// none but a's, still nowhere (all full).
		r = via(b).raw(t, "POST", "/v1/sandboxes", map[string]any{"memoryMiB": 128, "vcpu": 1, "spreadFrom": []string{perNode["a"][0], perNode["b"][0], perNode["c"][0]}}, nil, requestTimeout)
		if r.Status != http.StatusConflict || r.errorCode() != "no_capacity" {
			t.Fatalf("create spread from every node: %v; want 409 no_capacity", r)
		}
	})

	onB := perNode["b"][0]
	t.Run("ProxiedThroughAnotherNode", func(t *testing.T) {
		cc := via(c)
		if out := cc.sh(t, onB, "echo hello from $(hostname)"); !strings.HasPrefix(out, "hello from") {
			t.Fatalf("exec through c: %q", out)
		}
		cc.writeFile(t, onB, "/workspace/via-c.txt", []byte("written through node c\n"))
		if got, r := via(a).readFile(t, onB, "/workspace/via-c.txt"); string(got) != "written through node c\n" {
			t.Fatalf("read through a: %q %v", got, r)
		}
		if got := via(b).sh(t, onB, "cat /workspace/via-c.txt"); got != "written through node c\n" {
			t.Fatalf("read on the owner: %q", got)
		}
		// A signed link made through c opens through a: the nodes share
		// the link key.
		l, _ := call[struct{ URL string }](t, cc, "POST", "/v1/sandboxes/"+onB+"/files:link",
			map[string]any{"path": "/workspace/via-c.txt", "method": "GET", "expiresInSeconds": 600}, nil)
		lu, err := url.Parse(l.URL)
		if err != nil || !strings.HasPrefix(lu.Path, "/v1/links/") {
			t.Fatalf("link: %q %v", l.URL, err)
		}
		if r := a.s.client("").raw(t, "GET", lu.Path, nil, nil, requestTimeout); r.Status != http.StatusOK || string(r.Body) != "written through node c\n" {
			t.Fatalf("link made through c, opened through a: %v", r)
		}
		// E2B's protocol: a connect through a answers envd's token (b
		// signs it), and envd through c takes it.
		var conn struct{ SandboxID, EnvdAccessToken string }
		r := a.s.client("").raw(t, "POST", "/sandboxes/"+onB+"/connect", map[string]any{"timeout": 900},
			http.Header{"X-API-KEY": {key}}, requestTimeout)
		if r.Status/100 != 2 || json.Unmarshal(r.Body, &conn) != nil || conn.SandboxID != onB || conn.EnvdAccessToken == "" {
			t.Fatalf("E2B connect through a: %v", r)
		}
		envd := http.Header{"E2b-Sandbox-Id": {onB}, "X-Access-Token": {conn.EnvdAccessToken}}
		if r := c.s.client("").raw(t, "POST", "/filesystem.Filesystem/Stat", map[string]any{"path": "/workspace/via-c.txt"},
			envd, requestTimeout); r.Status != http.StatusOK || !strings.Contains(string(r.Body), `"name":"via-c.txt"`) {
			t.Fatalf("envd Stat through c: %v", r)
		}
		// A preview made through c serves through a.
		cc.spawn(t, onB, "cd /workspace && exec python3 -m http.server 8000")
		pv, _ := call[struct{ URL string }](t, cc, "POST", "/v1/sandboxes/"+onB+"/previews",
			map[string]any{"port": 8000, "visibility": "public"}, nil)
		// Its host names the sandbox; any node serves it, a's included.
		pu, err := url.Parse(pv.URL)
		if err != nil || pu.Hostname() != "8000-"+strings.TrimPrefix(onB, "sbx_")+".localhost" || pu.Path != "/" {
			t.Fatalf("preview: %q %v", pv.URL, err)
		}
		au, _ := url.Parse(a.s.URL)
		viaA := "http://" + net.JoinHostPort(pu.Hostname(), au.Port()) + "/via-c.txt"
		var last string
		if !waitUntil(time.Minute, 500*time.Millisecond, func() bool {
			resp, err := previewClient.Get(viaA)
			if err != nil {
				last = err.Error()
				return false
			}
			defer resp.Body.Close()
			body, _ := io.ReadAll(resp.Body)
			last = fmt.Sprintf("HTTP %d %s", resp.StatusCode, body)
			return resp.StatusCode == http.StatusOK && string(body) == "written through node c\n"
		}) {
			t.Fatalf("preview made through c, fetched through a (%s): %s", viaA, last)
		}
		// The API's host of a node serves no preview.
		if r := a.s.client("").raw(t, "GET", "/preview/"+onB+"/", nil, nil, requestTimeout); r.Status != http.StatusMisdirectedRequest {
			t.Fatalf("/preview/ on the API's host: %v", r)
		}

		p := cc.spawn(t, onB, "sleep 300")
		found := false
		for _, q := range cc.processes(t, onB) {
			found = found || q.ID == p.ID && q.State == "running"
		}
		if !found {
			t.Fatalf("process %s not listed running through c", p.ID)
		}
		// A terminal (a WebSocket upgrade) through c.
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		term := dialTerminal(t, ctx, cc, onB, url.Values{"command": {"bash"}, "cols": {"80"}, "rows": {"24"}})
		terminalReady(t, ctx, term)
		if err := term.Write(ctx, websocket.MessageBinary, []byte("echo term-$((6*7))\n")); err != nil {
			t.Fatal(err)
		}
		terminalUntil(t, ctx, term, "term-42")
		term.Close(websocket.StatusNormalClosure, "")
		// A stream is proxied as it comes, not when the command ends.
		first, end := streamTimes(t, cc, onB, "echo first; sleep 4; echo second")
		if end.Sub(first) < 2*time.Second {
			t.Fatalf("first line read %s before the end; want the stream passed through as it came", end.Sub(first))
		}
	})

	t.Run("AuthLimitedPerClientThroughAPeer", func(t *testing.T) {
		// Two clients on their own loopback addresses reach a's sandbox
		// through b. One keeps sending a wrong key: b, where it
		// connects, limits it; the other, behind the same node, is not.
		onA := perNode["a"][0]
		from := func(ip, key string) *client {
			d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}}
			return &client{s: b.s, key: key, hc: &http.Client{Transport: &http.Transport{Proxy: nil, DialContext: d.DialContext}}}
		}
		flooder := from("127.0.0.5", "ebx_wrong_key")
		var last *response
		for range 30 {
			if last = flooder.raw(t, "GET", "/v1/sandboxes/"+onA, nil, nil, requestTimeout); last.Status != http.StatusUnauthorized {
				break
			}
		}
		if last.Status != http.StatusTooManyRequests || last.errorCode() != "rate_limited" {
			t.Fatalf("a client sending wrong keys through b: %v; want 429 rate_limited after its burst", last)
		}
		if r := from("127.0.0.5", key).raw(t, "GET", "/v1/sandboxes/"+onA, nil, nil, requestTimeout); r.Status != http.StatusTooManyRequests {
			t.Errorf("the limited client with a good key: %v; want it still limited", r)
		}
		other := from("127.0.0.6", key)
		if r := other.raw(t, "GET", "/v1/sandboxes/"+onA, nil, nil, requestTimeout); r.Status != http.StatusOK {
			t.Errorf("another client through b: %v; want 200", r)
		}
		if out := other.sh(t, onA, "echo fine"); out != "fine\n" {
			t.Errorf("another client's exec through b: %q", out)
		}
		if r := from("127.0.0.6", "ebx_another_wrong_key").raw(t, "GET", "/v1/sandboxes/"+onA, nil, nil, requestTimeout); r.Status != http.StatusUnauthorized {
			t.Errorf("another client's own wrong key through b: %v; want 401, its own bucket untouched", r)
		}
	})

	t.Run("ExecLatency", func(t *testing.T) {
		direct := execMillis(t, via(b), onB, 20)
		proxied := execMillis(t, via(c), onB, 20)
		t.Logf("exec of `true` on b's sandbox: through b (owner) p50 %.1f ms, through c (proxied) p50 %.1f ms",
			percentile(direct, 50), percentile(proxied, 50))
	})

	t.Run("DrainMovesPausedSandbox", func(t *testing.T) {
		onC := perNode["c"][0]
		via(a).writeFile(t, onC, "/workspace/keep.txt", []byte("kept across the move\n"))
		via(b).sh(t, onC, "sudo mkdir -p /opt/state && echo 42 | sudo tee /opt/state/answer >/dev/null")
		r := via(a).raw(t, "POST", "/v1/sandboxes/"+onC+":pause", map[string]any{}, http.Header{"Prefer": {"wait=120"}}, requestTimeout)
		if r.Status != http.StatusOK {
			t.Fatalf("pause: %v", r)
		}
		via(a).waitState(t, onC, "paused")
		// Room for it to wake: one of a's sandboxes goes.
		via(a).delete(t, perNode["a"][2])
		r = via(b).raw(t, "POST", "/v1/nodes/c:drain", map[string]any{}, nil, requestTimeout)
		if r.Status != http.StatusOK {
			t.Fatalf("drain c: %v", r)
		}
		var moved sandboxJSON
		if !waitUntil(3*time.Minute, 500*time.Millisecond, func() bool {
			moved = via(b).get(t, onC)
			return moved.Node == "a"
		}) {
			t.Fatalf("paused sandbox never moved to a: %+v\nc's log:\n%s", moved, c.s.logTail(30))
		}
		if moved.State != "paused" {
			t.Fatalf("moved sandbox is %s, want paused", moved.State)
		}
		// c lets go of it once a has it (the owner switches first).
		if !waitUntil(time.Minute, 100*time.Millisecond, func() bool {
			return !vmUnder(c.dataDir, onC) && !dirExists(filepath.Join(c.dataDir, "sandboxes", onC))
		}) {
			t.Errorf("c kept files or a VM of the moved sandbox")
		}
		// No new sandbox goes to the draining node (it has room now).
		r = via(c).raw(t, "POST", "/v1/sandboxes", map[string]any{"memoryMiB": clusterMemMiB, "vcpu": 1, "spreadFrom": []string{perNode["a"][0]}}, nil, requestTimeout)
		if r.Status != http.StatusConflict || r.errorCode() != "no_capacity" {
			t.Fatalf("create with only draining c free: %v; want no_capacity", r)
		}
		r = via(c).raw(t, "POST", "/v1/sandboxes/"+onC+":wake", map[string]any{}, http.Header{"Prefer": {"wait=120"}}, requestTimeout)
		if r.Status != http.StatusOK {
			t.Fatalf("wake after the move: %v", r)
		}
		via(c).waitState(t, onC, "running")
		if got := via(c).sh(t, onC, "cat /workspace/keep.txt /opt/state/answer"); got != "kept across the move\n42\n" {
			t.Fatalf("files after the move: %q", got)
		}
		if !vmUnder(a.dataDir, onC) {
			t.Errorf("woken sandbox has no VM on a")
		}
		if r := via(a).raw(t, "POST", "/v1/nodes/c:undrain", map[string]any{}, nil, requestTimeout); r.Status != http.StatusOK {
			t.Fatalf("undrain: %v", r)
		}
	})

	t.Run("DrainMovesRunningSandbox", func(t *testing.T) {
		// c is empty (its sandbox moved to a above) and has the only room.
		sb := via(a).createRunning(t, map[string]any{"memoryMiB": clusterMemMiB, "vcpu": 1, "timeoutSeconds": 3600})
		defer via(a).delete(t, sb.ID)
		if sb = via(a).get(t, sb.ID); sb.Node != "c" {
			t.Fatalf("the new sandbox went to %s, want c (the only room)", sb.Node)
		}
		via(a).sh(t, sb.ID, "echo moved-running > /workspace/run.txt")
		// Its checkpoint goes with it.
		cp, _ := via(a).checkpoint(t, sb.ID, "before-drain")
		proc := via(a).spawn(t, sb.ID, "sleep 3600")
		serveHTTP(t, via(a), sb.ID)
		// Room on a for it to run: one of a's sandboxes goes.
		via(a).delete(t, perNode["a"][1])

		// A client keeps calling it through b while c drains: every
		// answer is a success or the retryable sandbox_moving.
		stop := make(chan struct{})
		type outcome struct {
			maxGap  time.Duration
			moving  int
			refused []string
		}
		done := make(chan outcome)
		go func() {
			var o outcome
			last := time.Now()
			for {
				select {
				case <-stop:
					done <- o
					return
				case <-time.After(100 * time.Millisecond):
				}
				r := via(b).raw(t, "POST", "/v1/sandboxes/"+sb.ID+":exec", execReq{Command: "true"}, nil, requestTimeout)
				var res execResult
				switch {
				case r.err == nil && r.Status == http.StatusOK && json.Unmarshal(r.Body, &res) == nil && res.ExitCode != nil && *res.ExitCode == 0:
					o.maxGap = max(o.maxGap, time.Since(last))
					last = time.Now()
				case r.Status == http.StatusServiceUnavailable && r.errorCode() == "sandbox_moving":
					o.moving++
				default:
					o.refused = append(o.refused, fmt.Sprintf("%d %s", r.Status, r.errorCode()))
				}
			}
		}()
		drained := time.Now()
		if r := via(b).raw(t, "POST", "/v1/nodes/c:drain", map[string]any{}, nil, requestTimeout); r.Status != http.StatusOK {
			t.Fatalf("drain c: %v", r)
		}
		var moved sandboxJSON
		if !waitUntil(3*time.Minute, 200*time.Millisecond, func() bool {
			moved = via(b).get(t, sb.ID)
			return moved.Node == "a" && moved.State == "running"
		}) {
			close(stop)
			<-done
			t.Fatalf("running sandbox never ran on a: %+v\nc's log:\n%s", moved, c.s.logTail(30))
		}
		tookAll := time.Since(drained)
		close(stop)
		o := <-done
		t.Logf("drain of a running sandbox from c to a: running on a %s after the drain was asked; the longest gap between successful calls %s, %d answers sandbox_moving",
			tookAll.Round(10*time.Millisecond), o.maxGap.Round(10*time.Millisecond), o.moving)
		if logb, err := os.ReadFile(c.s.LogPath); err == nil {
			for _, line := range strings.Split(string(logb), "\n") {
				if strings.Contains(line, "moved a running sandbox") {
					t.Logf("c's account of it: %s", line)
				}
			}
		}
		if len(o.refused) > 0 {
			t.Errorf("calls during the move answered other than sandbox_moving: %v", o.refused)
		}
		if got := via(b).sh(t, sb.ID, "cat /workspace/run.txt; curl -sf -o /dev/null -w '%{http_code}' localhost:8000/"); got != "moved-running\n200" {
			t.Errorf("files and server after the move: %q", got)
		}
		alive := false
		for _, p := range via(b).processes(t, sb.ID) {
			alive = alive || (p.PID == proc.PID && p.State == "running")
		}
		if !alive {
			t.Errorf("process %d did not survive the move: %+v", proc.PID, via(b).processes(t, sb.ID))
		}
		if sb.ExpiresAt == nil || moved.ExpiresAt == nil || !moved.ExpiresAt.Equal(*sb.ExpiresAt) {
			t.Errorf("lease after the move ends %v, want %v as before", moved.ExpiresAt, sb.ExpiresAt)
		}
		if !waitUntil(time.Minute, 100*time.Millisecond, func() bool {
			return !vmUnder(c.dataDir, sb.ID) && !dirExists(filepath.Join(c.dataDir, "sandboxes", sb.ID))
		}) {
			t.Errorf("c kept files or a VM of the moved sandbox")
		}
		// The checkpoint moved with it: restored on a, the sandbox is back
		// to the moment before the drain.
		if !dirExists(filepath.Join(a.dataDir, "snapshots", cp.ID)) || dirExists(filepath.Join(c.dataDir, "snapshots", cp.ID)) {
			t.Errorf("checkpoint %s's files did not move from c to a", cp.ID)
		}
		via(b).sh(t, sb.ID, "echo after-drain > /workspace/run.txt")
		took := via(b).restore(t, sb.ID, cp.ID, false)
		if got := via(b).sh(t, sb.ID, "cat /workspace/run.txt"); got != "moved-running\n" {
			t.Errorf("after restoring the moved checkpoint: %q, want the file as it was at the checkpoint", got)
		}
		t.Logf("restore of a checkpoint that moved with its sandbox: %s", took.Round(time.Millisecond))
		if r := via(a).raw(t, "POST", "/v1/nodes/c:undrain", map[string]any{}, nil, requestTimeout); r.Status != http.StatusOK {
			t.Fatalf("undrain: %v", r)
		}
	})

	top := t // the nodes a subtest starts again outlive it
	t.Run("StopMovesRunningSandbox", func(t *testing.T) {
		// c restarts as an upgrade restarts it: asked to stop, it moves its
		// running sandbox to another node first.
		plain := c.args
		c.s.terminate(t)
		c.args = append(append([]string(nil), plain...), "--stop-drain-timeout", "2m")
		c.start(top)
		defer func() {
			// Whatever happens here, the subtests after need c as it was.
			if !c.s.alive() {
				c.args = plain
				c.start(top)
			}
		}()
		waitNodes(map[string]string{"a": "up", "b": "up", "c": "up"})
		sb := via(a).createRunning(t, map[string]any{"memoryMiB": clusterMemMiB, "vcpu": 1, "spreadFrom": []string{perNode["a"][0]}})
		defer via(a).delete(t, sb.ID)
		if got := via(a).get(t, sb.ID); got.Node != "c" {
			t.Fatalf("the new sandbox went to %s, want c", got.Node)
		}
		via(a).sh(t, sb.ID, "echo outlives-its-node > /workspace/up.txt")
		proc := via(a).spawn(t, sb.ID, "sleep 3600")

		stopped := time.Now()
		if err := c.s.cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		select {
		case <-c.s.exited:
		case <-time.After(3 * time.Minute):
			t.Fatalf("c did not stop within 3 minutes of SIGTERM:\n%s", c.s.logTail(30))
		}
		took := time.Since(stopped)
		moved := via(a).get(t, sb.ID)
		t.Logf("c stopped %s after SIGTERM; its running sandbox is %s on %s", took.Round(10*time.Millisecond), moved.State, moved.Node)
		if moved.State != "running" || moved.Node != "a" {
			t.Fatalf("after c stopped its sandbox is %s on %s, want running on a; c's log:\n%s", moved.State, moved.Node, c.s.logTail(40))
		}
		if got := via(a).sh(t, sb.ID, "cat /workspace/up.txt"); got != "outlives-its-node\n" {
			t.Errorf("files after the stop: %q", got)
		}
		alive := false
		for _, p := range via(a).processes(t, sb.ID) {
			alive = alive || (p.PID == proc.PID && p.State == "running")
		}
		if !alive {
			t.Errorf("process %d did not outlive its node's stop", proc.PID)
		}
		// The new process takes sandboxes again once it serves.
		c.args = plain
		c.start(top)
		waitNodes(map[string]string{"c": "up"})
	})

	t.Run("NodeLostAndBack", func(t *testing.T) {
		lost := perNode["b"]
		pids := map[string]int{}
		for _, id := range lost {
			pids[id] = vmPID(id)
		}
		killed := time.Now()
		b.s.kill9(t)
		var detected time.Duration
		if !waitUntil(clusterTimeout+time.Minute, 200*time.Millisecond, func() bool {
			for _, id := range lost {
				sb := via(a).get(t, id)
				if sb.State != "stopped" || sb.stopReason() != "node_lost" {
					return false
				}
			}
			detected = time.Since(killed)
			return true
		}) {
			t.Fatalf("b's sandboxes not reported node_lost within %s", clusterTimeout+time.Minute)
		}
		t.Logf("node loss detected: b's sandboxes stopped node_lost %s after kill -9 (timeout %s, heartbeat %s)",
			detected.Round(10*time.Millisecond), clusterTimeout, clusterHeartbeat)
		// a and c keep serving, their sandboxes too.
		if out := via(c).sh(t, perNode["a"][0], "echo still"); out != "still\n" {
			t.Fatalf("a's sandbox through c while b is down: %q", out)
		}
		waitNodes(map[string]string{"b": "down"})

		// b comes back: the VMs its last process left are ended before it
		// serves, and nothing of it runs twice.
		stillRunning := 0
		for _, pid := range pids {
			if pid > 0 && processAlive(pid) {
				stillRunning++
			}
		}
		t.Logf("VMs of b still running while b was down: %d of %d", stillRunning, len(pids))
		b.start(top) // it serves the subtests after this one
		for id, pid := range pids {
			if pid > 0 && !waitUntil(30*time.Second, 100*time.Millisecond, func() bool { return !processAlive(pid) }) {
				t.Errorf("VM of lost sandbox %s (pid %d) still runs after b came back", id, pid)
			}
			if sb := via(b).get(t, id); sb.State != "stopped" || sb.stopReason() != "node_lost" {
				t.Errorf("lost sandbox %s after b's return: %s %s", id, sb.State, sb.stopReason())
			}
		}
		got := waitNodes(map[string]string{"b": "up"})
		for _, n := range got {
			if n.ID == "b" && n.Epoch < 3 {
				t.Errorf("b's epoch %d after a start, a loss and a start; want 3", n.Epoch)
			}
		}
		// b takes sandboxes again: one too big for c's room, away from a.
		sb := via(c).createRunning(t, map[string]any{"memoryMiB": clusterSlotMiB, "vcpu": 1, "spreadFrom": []string{perNode["a"][0]}})
		if got := via(a).get(t, sb.ID); got.Node != "b" {
			t.Errorf("create spread from a's sandbox, too big for c, went to %q; want b", got.Node)
		}
		via(a).delete(t, sb.ID)
		// The lost sandboxes' disks are still on b: deleting them (through
		// another node) removes them there.
		for _, id := range lost {
			via(c).delete(t, id)
			if dirExists(filepath.Join(b.dataDir, "sandboxes", id)) {
				t.Errorf("lost sandbox %s deleted, its directory still on b", id)
			}
		}
	})

	t.Run("WithruntimeThroughService", func(t *testing.T) {
		// Room for one default-size sandbox on a (DrainMovesRunningSandbox
		// deleted one of these already).
		for _, id := range []string{perNode["a"][0], perNode["a"][1], perNode["c"][0]} {
			if r := via(a).raw(t, "GET", "/v1/sandboxes/"+id, nil, nil, requestTimeout); r.Status != http.StatusNotFound {
				via(a).delete(t, id)
			}
		}
		front := roundRobin(t, a.s.URL, b.s.URL, c.s.URL)
		root, err := filepath.Abs("../..")
		if err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command("python3", "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/conformance/test_withruntime.py",
			"-k", "test_01 or test_03_file or test_05 or test_08 or test_09c or test_10 or test_11")
		cmd.Dir = root
		cmd.Env = append(os.Environ(), "EMBERBOX_TEST_URL="+front.url, "EMBERBOX_TEST_KEY="+key)
		out, err := cmd.CombinedOutput()
		t.Logf("withruntime seed flow through the round-robin front (%d connections spread over a, b, c):\n%s",
			front.conns.Load(), lastLines(string(out), 15))
		if err != nil {
			t.Fatalf("pytest: %v", err)
		}
	})

	t.Run("SnapshotCopiedOnAnotherNode", func(t *testing.T) {
		// A clean slate: what the subtests above left goes.
		for _, sb := range via(a).list(t, "?limit=100") {
			if sb.State != "deleted" {
				via(a).delete(t, sb.ID)
			}
		}
		src := via(b).createRunning(t, map[string]any{"memoryMiB": clusterMemMiB, "vcpu": 1, "timeoutSeconds": 600})
		defer via(a).delete(t, src.ID)
		src = via(a).get(t, src.ID)
		via(b).sh(t, src.ID, "echo from-the-snapshot > /workspace/snap.txt")
		r := via(b).raw(t, "POST", "/v1/sandboxes/"+src.ID+":snapshot", map[string]any{"name": "elsewhere"}, http.Header{"Prefer": {"wait=60"}}, requestTimeout)
		var sn struct {
			ID string `json:"id"`
		}
		if r.err != nil || r.Status != http.StatusOK || json.Unmarshal(r.Body, &sn) != nil || sn.ID == "" {
			t.Fatalf("snapshot: %v", r)
		}
		// spreadFrom keeps the copy off the snapshot's node: the node it
		// goes to fetches the snapshot first.
		start := time.Now()
		cp := via(c).createRunning(t, map[string]any{"snapshot": sn.ID, "spreadFrom": []string{src.ID}, "timeoutSeconds": 600})
		took := time.Since(start)
		defer via(a).delete(t, cp.ID)
		cp = via(a).get(t, cp.ID)
		if cp.Node == src.Node || cp.Node == "" {
			t.Fatalf("the copy runs on %q, the snapshot's node is %q: want another", cp.Node, src.Node)
		}
		if got := via(b).sh(t, cp.ID, "cat /workspace/snap.txt"); got != "from-the-snapshot\n" {
			t.Errorf("the copy on another node reads %q", got)
		}
		var to *clusterNode
		for _, n := range nodes {
			if n.id == cp.Node {
				to = n
			}
		}
		if !dirExists(filepath.Join(to.dataDir, "snapshots", sn.ID)) {
			t.Errorf("node %s has no copy of snapshot %s", to.id, sn.ID)
		}
		t.Logf("a copy of a snapshot held by node %s, made on node %s (fetching the snapshot first): running %s after the create was asked",
			src.Node, cp.Node, took.Round(time.Millisecond))
		if logb, err := os.ReadFile(to.s.LogPath); err == nil {
			for _, line := range strings.Split(string(logb), "\n") {
				if strings.Contains(line, "fetched a snapshot") {
					t.Logf("%s's account of it: %s", to.id, line)
				}
			}
		}
	})
}

type nodeRowJSON struct {
	ID    string `json:"id"`
	State string `json:"state"`
	Epoch int64  `json:"epoch"`
}

func listClusterNodes(t testing.TB, c *client) []nodeRowJSON {
	t.Helper()
	out, r := call[struct {
		Data []nodeRowJSON `json:"data"`
	}](t, c, "GET", "/v1/nodes", nil, nil)
	if r.Status != http.StatusOK {
		t.Fatalf("GET /v1/nodes: %v", r)
	}
	return out.Data
}

// vmUnder reports whether sandbox id's VM runs under dataDir.
func vmUnder(dataDir, id string) bool {
	for _, p := range vmProcesses(dataDir) {
		if p.Name == "emberbox-"+id {
			return true
		}
	}
	return false
}

func dirExists(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.IsDir()
}

// streamTimes runs command as a streamed exec and returns when its first
// stdout line and its exit event were read.
func streamTimes(t *testing.T, c *client, id, command string) (first, end time.Time) {
	t.Helper()
	body, _ := json.Marshal(execReq{Command: command, Stream: true})
	req, _ := http.NewRequest("POST", c.s.URL+"/v1/sandboxes/"+id+":exec", strings.NewReader(string(body)))
	req.Header.Set("Authorization", "Bearer "+c.key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.hc.Do(req)
	if err != nil {
		t.Fatalf("streamed exec: %v", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("streamed exec: HTTP %d", resp.StatusCode)
	}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		var ev streamEvent
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			t.Fatalf("stream line %q: %v", sc.Text(), err)
		}
		switch ev.Type {
		case "stdout":
			if first.IsZero() {
				first = time.Now()
			}
		case "exit":
			end = time.Now()
			if ev.ExitCode == nil || *ev.ExitCode != 0 {
				t.Fatalf("streamed exec exit %v", ev.ExitCode)
			}
			return first, end
		case "error":
			t.Fatalf("streamed exec error: %+v", ev.Error)
		}
	}
	t.Fatalf("stream ended without exit: %v", sc.Err())
	return
}

// execMillis runs `true` n times on id and returns each exec's time.
func execMillis(t testing.TB, c *client, id string, n int) []float64 {
	t.Helper()
	var ms []float64
	for range n {
		start := time.Now()
		res, r := c.exec(t, id, execReq{Command: "true"})
		if r.Status != http.StatusOK || res.exit() != "0" {
			t.Fatalf("exec: %v %v", r, res.exit())
		}
		ms = append(ms, float64(time.Since(start).Microseconds())/1000)
	}
	sort.Float64s(ms)
	return ms
}

// front is a TCP round-robin in front of the nodes, as a Kubernetes
// Service is: each connection goes to the next node.
type front struct {
	url   string
	conns atomic.Int64
}

func roundRobin(t *testing.T, urls ...string) *front {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	f := &front{url: "http://" + ln.Addr().String()}
	var hosts []string
	for _, u := range urls {
		hosts = append(hosts, strings.TrimPrefix(u, "http://"))
	}
	go func() {
		for {
			in, err := ln.Accept()
			if err != nil {
				return
			}
			to := hosts[int(f.conns.Add(1))%len(hosts)]
			go func() {
				defer in.Close()
				out, err := net.Dial("tcp", to)
				if err != nil {
					return
				}
				defer out.Close()
				go func() { _, _ = io.Copy(out, in); _ = out.(*net.TCPConn).CloseWrite() }()
				_, _ = io.Copy(in, out)
			}()
		}
	}()
	return f
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// errorCode is the code of an error answer ("" for none).
func (r *response) errorCode() string {
	if r.Err == nil {
		return ""
	}
	return r.Err.Code
}
