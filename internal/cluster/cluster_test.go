package cluster

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/tls"
	"encoding/binary"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/emberbox/emberbox/internal/errdefs"
	"github.com/emberbox/emberbox/internal/sandbox"
)

func TestChooseBestFit(t *testing.T) {
	now := time.Now()
	n := func(id, state string, mem, used int64, beat time.Time, images ...string) *Node {
		return &Node{ID: id, State: state, MemoryMiB: mem, CommittedMiB: used, OverheadMiB: 100, HeartbeatAt: beat, Images: images}
	}
	list := []*Node{
		n("big", StateUp, 8000, 0, now, "img"),
		n("tight", StateUp, 2000, 1000, now, "img"),
		n("tie", StateUp, 2000, 1000, now),
		n("full", StateUp, 1000, 500, now, "img"),
		n("draining", StateDraining, 9000, 0, now, "img"),
		n("down", StateDown, 9000, 0, now, "img"),
		n("silent", StateUp, 9000, 0, now.Add(-time.Minute), "img"),
	}
	ids := func(ns []*Node) string {
		var s []string
		for _, n := range ns {
			s = append(s, n.ID)
		}
		return strings.Join(s, ",")
	}
	alive := now.Add(-10 * time.Second)
	if got := ids(Choose(list, Placement{MemoryMiB: 800, Alive: alive})); got != "tie,tight,big" {
		t.Errorf("best fit: %s; want the tightest first (by id on a tie), never draining, down, silent or full", got)
	}
	if got := ids(Choose(list, Placement{MemoryMiB: 800, Alive: alive, Exclude: []string{"tight", "tie"}})); got != "big" {
		t.Errorf("spread: %s", got)
	}
	if got := ids(Choose(list, Placement{MemoryMiB: 800, Alive: alive, Require: "tight"})); got != "tight" {
		t.Errorf("require: %s", got)
	}
	if got := ids(Choose(list, Placement{MemoryMiB: 800, Alive: alive, Prefer: "big"})); got != "big,tie,tight" {
		t.Errorf("prefer: %s; want big first, then best fit", got)
	}
	if got := ids(Choose(list, Placement{MemoryMiB: 800, Alive: alive, Prefer: "full"})); got != "tie,tight,big" {
		t.Errorf("prefer a full node: %s; want the others by best fit", got)
	}
	if got := ids(Choose(list, Placement{MemoryMiB: 800, Alive: alive, Image: "img"})); got != "tight,big" {
		t.Errorf("image: %s", got)
	}
	list[0].VCPUs, list[0].CommittedVCPUs = 4, 3
	if got := ids(Choose(list, Placement{MemoryMiB: 800, VCPU: 2, Alive: alive})); got != "tie,tight" {
		t.Errorf("vCPUs: %s; want big left out (3 of 4 vCPUs held)", got)
	}
	if got := Choose(list, Placement{MemoryMiB: 9000, Alive: alive}); len(got) != 0 {
		t.Errorf("nothing fits 9000 MiB, got %s", ids(got))
	}
}

// fakeStore is an in-memory Store.
type fakeStore struct {
	mu        sync.Mutex
	nodes     map[string]*Node
	owners    map[string]string
	sandboxes map[string]*sandbox.Sandbox
	setting   map[string]string
}

func newFakeStore() *fakeStore {
	return &fakeStore{nodes: map[string]*Node{}, owners: map[string]string{}, sandboxes: map[string]*sandbox.Sandbox{}, setting: map[string]string{}}
}

func (f *fakeStore) RegisterNode(_ context.Context, n *Node) (int64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	c := *n
	if old := f.nodes[n.ID]; old != nil {
		c.Epoch = old.Epoch + 1
	} else {
		c.Epoch = 1
	}
	c.State, c.HeartbeatAt = StateUp, time.Now()
	f.nodes[n.ID] = &c
	return c.Epoch, nil
}
func (f *fakeStore) SetNode(string, int64) {}
func (f *fakeStore) Heartbeat(_ context.Context, id string, epoch int64) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := f.nodes[id]
	if n == nil || n.Epoch != epoch || n.State == StateDown {
		return errdefs.New(errdefs.ErrConflict, "node_fenced", "fenced")
	}
	n.HeartbeatAt = time.Now()
	return nil
}
func (f *fakeStore) ListNodes(context.Context) ([]*Node, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []*Node
	for _, n := range f.nodes {
		c := *n
		out = append(out, &c)
	}
	return out, nil
}
func (f *fakeStore) GetNode(_ context.Context, id string) (*Node, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if n := f.nodes[id]; n != nil {
		c := *n
		return &c, nil
	}
	return nil, errdefs.ErrNotFound
}
func (f *fakeStore) Place(ctx context.Context, p Placement) ([]*Node, error) {
	list, _ := f.ListNodes(ctx)
	return Choose(list, p), nil
}
func (f *fakeStore) StaleNodes(_ context.Context, cutoff time.Time) ([]string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var ids []string
	for _, n := range f.nodes {
		if n.State != StateDown && n.HeartbeatAt.Before(cutoff) {
			ids = append(ids, n.ID)
		}
	}
	return ids, nil
}
func (f *fakeStore) DeclareLost(_ context.Context, id string, cutoff time.Time, _ string) ([]string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := f.nodes[id]
	if n == nil || n.State == StateDown || !n.HeartbeatAt.Before(cutoff) {
		return nil, nil
	}
	n.State, n.Epoch = StateDown, n.Epoch+1
	return nil, nil
}
func (f *fakeStore) SetNodeDraining(ctx context.Context, id string, d bool) (*Node, error) {
	f.mu.Lock()
	if d {
		f.nodes[id].State = StateDraining
	} else {
		f.nodes[id].State = StateUp
	}
	f.mu.Unlock()
	return f.GetNode(ctx, id)
}
func (f *fakeStore) MoveSandbox(_ context.Context, id, from, to string, _ []string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	sb := f.sandboxes[id]
	if sb == nil || sb.NodeID != from || sb.State != sandbox.StatePaused {
		return errdefs.New(errdefs.ErrConflict, "not_movable", "no")
	}
	sb.NodeID, f.owners[id] = to, to
	return nil
}
func (f *fakeStore) OwnerNode(_ context.Context, _, id string) (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.owners[id], nil
}
func (f *fakeStore) ClusterSetting(_ context.Context, name string, put func() (string, error)) (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if v, ok := f.setting[name]; ok {
		return v, nil
	}
	v, err := put()
	f.setting[name] = v
	return v, err
}
func (f *fakeStore) GetSandbox(_ context.Context, id string) (*sandbox.Sandbox, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if sb := f.sandboxes[id]; sb != nil {
		c := *sb
		return &c, nil
	}
	return nil, errdefs.ErrNotFound
}
func (f *fakeStore) ListSandboxes(context.Context, sandbox.ListOptions) ([]*sandbox.Sandbox, string, error) {
	return nil, "", nil
}

// testNode joins st as id with a channel on a loopback listener serving
// local, and returns it with its channel address.
func testNode(t *testing.T, st *fakeStore, ca *CA, id string, memMiB int64, local http.Handler) *Cluster {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	c, err := Join(context.Background(), Config{Store: Store{Nodes: st, Sandboxes: st}, CA: ca, Heartbeat: time.Second, Timeout: 5 * time.Second,
		Self: Node{ID: id, Address: ln.Addr().String(), MemoryMiB: memMiB}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = c.Serve(ctx, ln, local); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return c
}

func says(who string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		w.Header().Set("X-Served-By", who)
		w.Header().Set("X-Forwarded-By-Seen", r.Header.Get(HeaderForwardedBy))
		_, _ = w.Write(append([]byte(who+":"), body...))
	})
}

func TestRouterProxiesToTheOwner(t *testing.T) {
	ca, err := NewCA()
	if err != nil {
		t.Fatal(err)
	}
	st := newFakeStore()
	a := testNode(t, st, ca, "a", 4096, says("a-channel"))
	testNode(t, st, ca, "b", 4096, says("b"))
	st.owners["sbx_on_b"], st.owners["sbx_on_a"] = "b", "a"
	front := a.Handler(says("a"))

	get := func(path string) *httptest.ResponseRecorder {
		rec := httptest.NewRecorder()
		front.ServeHTTP(rec, httptest.NewRequest("GET", path, nil))
		return rec
	}
	if rec := get("/v1/sandboxes/sbx_on_b:exec"); rec.Header().Get("X-Served-By") != "b" || rec.Header().Get("X-Forwarded-By-Seen") != "a" {
		t.Errorf("b's sandbox: served by %q (forwarded by %q), want b, forwarded by a", rec.Header().Get("X-Served-By"), rec.Header().Get("X-Forwarded-By-Seen"))
	}
	for _, p := range []string{"/v1/sandboxes/sbx_on_a/files?path=/x", "/v1/sandboxes/sbx_unknown", "/v1/keys"} {
		if rec := get(p); rec.Header().Get("X-Served-By") != "a" {
			t.Errorf("%s: served by %q, want a (here)", p, rec.Header().Get("X-Served-By"))
		}
	}
	// A node that does not answer: a record read is answered here, from
	// the store; anything else is node_unreachable.
	st.mu.Lock()
	st.nodes["gone"] = &Node{ID: "gone", State: StateUp, Address: "127.0.0.1:1", HeartbeatAt: time.Now()}
	st.owners["sbx_on_gone"] = "gone"
	st.mu.Unlock()
	if rec := get("/v1/sandboxes/sbx_on_gone"); rec.Header().Get("X-Served-By") != "a" {
		t.Errorf("read of an unreachable node's sandbox: %d served by %q, want a", rec.Code, rec.Header().Get("X-Served-By"))
	}
	if rec := get("/v1/sandboxes/sbx_on_gone/files?path=/x"); rec.Code != http.StatusServiceUnavailable || errorCode(rec.Body.Bytes()) != "node_unreachable" {
		t.Errorf("files of an unreachable node's sandbox: %d %s", rec.Code, rec.Body.String())
	}
	// A down node's sandboxes are answered here, from the store.
	st.mu.Lock()
	st.nodes["b"].State = StateDown
	st.mu.Unlock()
	if rec := get("/v1/sandboxes/sbx_on_b"); rec.Header().Get("X-Served-By") != "a" {
		t.Errorf("down node's sandbox served by %q, want a", rec.Header().Get("X-Served-By"))
	}
}

func TestPlaceTriesTheNextNodeAndSaysNoCapacity(t *testing.T) {
	ca, err := NewCA()
	if err != nil {
		t.Fatal(err)
	}
	st := newFakeStore()
	full := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusConflict, "no_capacity", "full", "")
	})
	a := testNode(t, st, ca, "a", 8192, says("a-channel"))
	testNode(t, st, ca, "b", 2048, full) // the tightest fit, but its ledger says no
	create := func(front http.Handler, body string) *httptest.ResponseRecorder {
		rec := httptest.NewRecorder()
		front.ServeHTTP(rec, httptest.NewRequest("POST", "/v1/sandboxes", strings.NewReader(body)))
		return rec
	}
	rec := create(a.Handler(says("a")), `{"memoryMiB": 1024}`)
	if rec.Code != 200 || rec.Body.String() != `a:{"memoryMiB": 1024}` {
		t.Errorf("create: %d %q; want a's answer, the body passed on whole", rec.Code, rec.Body.String())
	}
	rec = create(a.Handler(full), `{"memoryMiB": 1024}`)
	if rec.Code != http.StatusConflict || errorCode(rec.Body.Bytes()) != "no_capacity" || rec.Header().Get("X-Request-Id") == "" {
		t.Errorf("all full: %d %s", rec.Code, rec.Body.String())
	}
	rec = create(a.Handler(says("a")), `{"memoryMiB": 65536}`)
	if rec.Code != http.StatusConflict || errorCode(rec.Body.Bytes()) != "no_capacity" {
		t.Errorf("too big for any node: %d %s", rec.Code, rec.Body.String())
	}
}

func TestChannelRefusesStrangers(t *testing.T) {
	ca, err := NewCA()
	if err != nil {
		t.Fatal(err)
	}
	other, err := NewCA()
	if err != nil {
		t.Fatal(err)
	}
	st := newFakeStore()
	b := testNode(t, st, ca, "b", 4096, says("b"))
	n, _ := st.GetNode(context.Background(), "b")
	dial := func(cfg *tls.Config) error {
		hc := &http.Client{Transport: &http.Transport{TLSClientConfig: cfg}, Timeout: 10 * time.Second}
		resp, err := hc.Get(peerURL(n) + "/v1/keys")
		if err == nil {
			resp.Body.Close()
		}
		return err
	}
	peer, err := ca.Issue("peer", "127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	if err := dial(peer.Client); err != nil {
		t.Fatalf("a peer with the cluster's certificate: %v", err)
	}
	stranger, err := other.Issue("stranger", "127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	noCert := peer.Client.Clone()
	noCert.Certificates = nil
	strangerTrusting := stranger.Client.Clone()
	strangerTrusting.RootCAs = peer.Client.RootCAs // trusts b, but b does not trust it
	for name, cfg := range map[string]*tls.Config{"no certificate": noCert, "another CA's certificate": strangerTrusting} {
		if err := dial(cfg); err == nil {
			t.Errorf("%s: the channel answered", name)
		}
	}
	_ = b
}

func TestParseCARejectsMismatch(t *testing.T) {
	a, _ := NewCA()
	b, _ := NewCA()
	certA := a.PEM[:strings.Index(a.PEM, "-----BEGIN EC PRIVATE KEY")]
	keyB := b.PEM[strings.Index(b.PEM, "-----BEGIN EC PRIVATE KEY"):]
	if _, err := ParseCA([]byte(certA + keyB)); err == nil {
		t.Error("a CA whose key is another's was accepted")
	}
	if _, err := ParseCA([]byte(a.PEM)); err != nil {
		t.Errorf("round trip: %v", err)
	}
}

func TestUntarRefusesHostileNames(t *testing.T) {
	for _, name := range []string{"../escape", "sub/dir", ".hidden", "/abs"} {
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		_ = tw.WriteHeader(&tar.Header{Name: name, Size: 1, Mode: 0o600, Typeflag: tar.TypeReg})
		_, _ = tw.Write([]byte("x"))
		_ = tw.Close()
		dir := t.TempDir()
		if err := untarFiles(&buf, dir); err == nil {
			t.Errorf("%q accepted", name)
		}
	}
	// A plain file keeps its content and its zero runs read back as zeros.
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	data := append(append([]byte("head"), make([]byte, 200<<10)...), "tail"...)
	_ = tw.WriteHeader(&tar.Header{Name: "mem", Size: int64(len(data)), Mode: 0o600, Typeflag: tar.TypeReg})
	_, _ = tw.Write(data)
	_ = tw.Close()
	dir := t.TempDir()
	if err := untarFiles(&buf, dir); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(filepath.Join(dir, "mem"))
	if err != nil || !bytes.Equal(got, data) {
		t.Errorf("moved file differs (%v)", err)
	}
}

// Targets route what the Runtime API's paths do not name (E2B's traffic
// and control plane, previews, links): a sandbox of another node goes
// there, a create is placed, and a refusal of E2B's create keeps E2B's
// error shape.
func TestTargetsRouteOtherProtocols(t *testing.T) {
	ca, err := NewCA()
	if err != nil {
		t.Fatal(err)
	}
	st := newFakeStore()
	a := testNode(t, st, ca, "a", 8192, says("a-channel"))
	e2bFull := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusTooManyRequests)
		_, _ = w.Write([]byte(`{"code":429,"message":"full","error_code":"no_capacity"}`))
	})
	testNode(t, st, ca, "b", 6144, says("b")) // fits the default 4 GiB, tighter than a
	st.owners["sbx_on_b"] = "b"
	target := func(r *http.Request) (string, bool) {
		if id := r.Header.Get("E2b-Sandbox-Id"); id != "" {
			return id, false
		}
		return "", r.Method == "POST" && r.URL.Path == "/sandboxes"
	}
	front := a.Handler(says("a"), func(*http.Request) (string, bool) { return "", false }, target)
	serve := func(h http.Handler, r *http.Request) *httptest.ResponseRecorder {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, r)
		return rec
	}
	r := httptest.NewRequest("POST", "/process.Process/Start", nil)
	r.Header.Set("E2b-Sandbox-Id", "sbx_on_b")
	if rec := serve(front, r); rec.Header().Get("X-Served-By") != "b" {
		t.Errorf("E2B traffic for b's sandbox served by %q, want b", rec.Header().Get("X-Served-By"))
	}
	if rec := serve(front, httptest.NewRequest("GET", "/v1/keys", nil)); rec.Header().Get("X-Served-By") != "a" {
		t.Errorf("an untargeted call served by %q, want a", rec.Header().Get("X-Served-By"))
	}
	// An E2B create is placed (b is the tightest fit).
	if rec := serve(front, httptest.NewRequest("POST", "/sandboxes", strings.NewReader(`{"templateID":"base"}`))); rec.Header().Get("X-Served-By") != "b" {
		t.Errorf("E2B create served by %q, want b (best fit)", rec.Header().Get("X-Served-By"))
	}
	// Every node full: the last refusal, in E2B's shape, is the answer.
	full := a.Handler(e2bFull, target)
	st.mu.Lock()
	st.nodes["b"].State = StateDraining
	st.mu.Unlock()
	rec := serve(full, httptest.NewRequest("POST", "/sandboxes", strings.NewReader(`{}`)))
	if rec.Code != http.StatusTooManyRequests || !strings.Contains(rec.Body.String(), `"error_code":"no_capacity"`) {
		t.Errorf("E2B create with no room: %d %s", rec.Code, rec.Body.String())
	}
	// No node fits at all: E2B's shape too.
	rec = serve(full, httptest.NewRequest("POST", "/sandboxes", strings.NewReader(`{"memoryMiB": 65536}`)))
	var e struct {
		Code      int    `json:"code"`
		Message   string `json:"message"`
		ErrorCode string `json:"error_code"`
	}
	if rec.Code != http.StatusTooManyRequests || json.Unmarshal(rec.Body.Bytes(), &e) != nil || e.Code != 429 || e.ErrorCode != "no_capacity" || e.Message == "" {
		t.Errorf("E2B create too big for any node: %d %s", rec.Code, rec.Body.String())
	}
}

// whoAsks answers with the address a request is counted under
// (RemoteAddr) and any client address header that reached it.
func whoAsks(who string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Served-By", who)
		w.Header().Set("X-Remote-Addr", r.RemoteAddr)
		w.Header().Set("X-Client-Addr-Seen", r.Header.Get(HeaderClientAddr))
	})
}

// A forwarded request is counted under the client's address on the node
// that serves it, not under the peer's; a client address a client sends
// is dropped at the entry node, whether the request is forwarded or served
// there, and a request on the channel is believed only with a cluster
// certificate.
func TestForwardedClientAddress(t *testing.T) {
	ca, err := NewCA()
	if err != nil {
		t.Fatal(err)
	}
	st := newFakeStore()
	a := testNode(t, st, ca, "a", 4096, whoAsks("a-channel"))
	testNode(t, st, ca, "b", 4096, whoAsks("b"))
	st.owners["sbx_on_b"], st.owners["sbx_on_a"] = "b", "a"
	front := a.Handler(whoAsks("a"))
	get := func(path, from, claimed string) *httptest.ResponseRecorder {
		r := httptest.NewRequest("GET", path, nil)
		r.RemoteAddr = from
		if claimed != "" {
			r.Header.Set(HeaderClientAddr, claimed)
		}
		rec := httptest.NewRecorder()
		front.ServeHTTP(rec, r)
		return rec
	}
	for _, from := range []string{"203.0.113.7:5555", "[2001:db8::7]:5555", "[::ffff:203.0.113.8]:5555"} {
		rec := get("/v1/sandboxes/sbx_on_b:exec", from, "198.51.100.99")
		want, _ := netip.ParseAddrPort(from)
		if rec.Header().Get("X-Served-By") != "b" || rec.Header().Get("X-Remote-Addr") != netip.AddrPortFrom(want.Addr().Unmap(), 0).String() {
			t.Errorf("from %s, forwarded: served by %q as from %q; want b, as from the client", from,
				rec.Header().Get("X-Served-By"), rec.Header().Get("X-Remote-Addr"))
		}
		if seen := rec.Header().Get("X-Client-Addr-Seen"); seen != "" {
			t.Errorf("from %s: the serving node's API saw a client address header %q", from, seen)
		}
	}
	rec := get("/v1/sandboxes/sbx_on_a:exec", "203.0.113.7:5555", "198.51.100.99")
	if rec.Header().Get("X-Served-By") != "a" || rec.Header().Get("X-Remote-Addr") != "203.0.113.7:5555" || rec.Header().Get("X-Client-Addr-Seen") != "" {
		t.Errorf("served at the entry: by %q as from %q, header %q; want a, the connection's address, no header",
			rec.Header().Get("X-Served-By"), rec.Header().Get("X-Remote-Addr"), rec.Header().Get("X-Client-Addr-Seen"))
	}

	// On the channel, a request without a peer certificate names no one.
	rec = httptest.NewRecorder()
	r := httptest.NewRequest("GET", "/v1/keys", nil)
	r.RemoteAddr = "10.0.0.2:7443"
	r.Header.Set(HeaderClientAddr, "198.51.100.99")
	fromPeer(whoAsks("b")).ServeHTTP(rec, r)
	if rec.Header().Get("X-Remote-Addr") != "10.0.0.2:7443" || rec.Header().Get("X-Client-Addr-Seen") != "" {
		t.Errorf("without a peer certificate: as from %q, header %q; want the connection's address, no header",
			rec.Header().Get("X-Remote-Addr"), rec.Header().Get("X-Client-Addr-Seen"))
	}
}

// The entry node admits (authenticates, limits) a client's request before
// it forwards it, and only then: one it refuses never reaches the owner, a
// create placed on another node is admitted once, and what is served here
// is left to the local API's own gate.
func TestEntryAdmitsBeforeForwarding(t *testing.T) {
	ca, err := NewCA()
	if err != nil {
		t.Fatal(err)
	}
	st := newFakeStore()
	var reached sync.Map // path → true, as the owner saw them
	owner := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		reached.Store(r.Method+" "+r.URL.Path, true)
		w.Header().Set("X-Served-By", "b")
	})
	a := testNode(t, st, ca, "a", 1024, says("a-channel"))
	testNode(t, st, ca, "b", 8192, owner)
	st.owners["sbx_on_b"], st.owners["sbx_on_a"] = "b", "a"
	var admitted []string
	admit := func(w http.ResponseWriter, r *http.Request) bool {
		admitted = append(admitted, r.Method+" "+r.URL.Path)
		if r.Header.Get("Authorization") != "Bearer good" {
			writeError(w, http.StatusUnauthorized, "unauthorized", "no", "")
			return false
		}
		return true
	}
	a.SetAdmit(admit)
	front := a.Handler(says("a"))
	do := func(method, path, key, body string) *httptest.ResponseRecorder {
		r := httptest.NewRequest(method, path, strings.NewReader(body))
		if key != "" {
			r.Header.Set("Authorization", "Bearer "+key)
		}
		rec := httptest.NewRecorder()
		front.ServeHTTP(rec, r)
		return rec
	}
	if rec := do("POST", "/v1/sandboxes/sbx_on_b:exec", "wrong", ""); rec.Code != http.StatusUnauthorized {
		t.Errorf("wrong key for b's sandbox: %d %s", rec.Code, rec.Body)
	}
	if _, ok := reached.Load("POST /v1/sandboxes/sbx_on_b:exec"); ok {
		t.Error("a request the entry node refused reached the owner")
	}
	if rec := do("POST", "/v1/sandboxes/sbx_on_b:exec", "good", ""); rec.Header().Get("X-Served-By") != "b" {
		t.Errorf("good key for b's sandbox: %d served by %q", rec.Code, rec.Header().Get("X-Served-By"))
	}
	admitted = nil
	if rec := do("GET", "/v1/sandboxes/sbx_on_a", "wrong", ""); rec.Header().Get("X-Served-By") != "a" || len(admitted) != 0 {
		t.Errorf("a's own sandbox: served by %q, admitted here %v; want a's API to gate it alone", rec.Header().Get("X-Served-By"), admitted)
	}
	// b is the only node with room: the create goes there, admitted once.
	if rec := do("POST", "/v1/sandboxes", "good", `{"memoryMiB": 4096}`); rec.Header().Get("X-Served-By") != "b" || len(admitted) != 1 {
		t.Errorf("create placed on b: served by %q, admitted %v", rec.Header().Get("X-Served-By"), admitted)
	}
	if rec := do("POST", "/v1/sandboxes", "wrong", `{"memoryMiB": 4096}`); rec.Code != http.StatusUnauthorized {
		t.Errorf("create with a wrong key: %d", rec.Code)
	}
	// a fits best but its API, having let the request in, has no room:
	// the create goes on to b without a second gate here.
	full := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusConflict, "no_capacity", "full", "")
	})
	admitted = nil
	rec := httptest.NewRecorder()
	r := httptest.NewRequest("POST", "/v1/sandboxes", strings.NewReader(`{"memoryMiB": 512}`))
	r.Header.Set("Authorization", "Bearer good")
	a.Handler(full).ServeHTTP(rec, r)
	if rec.Header().Get("X-Served-By") != "b" || len(admitted) != 0 {
		t.Errorf("create a had no room for: served by %q, admitted again %v", rec.Header().Get("X-Served-By"), admitted)
	}
	// A request a caller routes itself, not a client's through Handler,
	// is its caller's to gate.
	rec = httptest.NewRecorder()
	a.routeOwned(rec, httptest.NewRequest("GET", "/v1/sandboxes/sbx_on_b/x", nil), says("a"), "sandboxes", "sbx_on_b")
	if rec.Header().Get("X-Served-By") != "b" || len(admitted) != 0 {
		t.Errorf("routed by a caller: served by %q, admitted %v; want b, not gated here", rec.Header().Get("X-Served-By"), admitted)
	}
}

// TestSilentNodeThatAnswersIsNotLost: a node whose heartbeat is stale in
// the store but which answers on the channel is suspect, not lost; once
// it stops answering, it is declared lost and fenced.
func TestSilentNodeThatAnswersIsNotLost(t *testing.T) {
	st := newFakeStore()
	ca, err := NewCA()
	if err != nil {
		t.Fatal(err)
	}
	a := testNode(t, st, ca, "a", 4096, says("a"))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	b, err := Join(context.Background(), Config{Store: Store{Nodes: st, Sandboxes: st}, CA: ca, Heartbeat: time.Second, Timeout: 5 * time.Second,
		Self: Node{ID: "b", Address: ln.Addr().String(), MemoryMiB: 4096}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan struct{})
	go func() { _ = b.Serve(ctx, ln, says("b")); close(served) }()
	defer func() { cancel(); <-served }()

	// b's heartbeats stop reaching the store (a slow store), b runs on.
	st.mu.Lock()
	st.nodes["b"].HeartbeatAt = time.Now().Add(-time.Minute)
	st.mu.Unlock()
	a.declareSilent(t.Context())
	if n, _ := st.GetNode(t.Context(), "b"); n.State == StateDown {
		t.Fatal("a node that answers on the channel was declared lost")
	}
	if !a.suspect.has("b") {
		t.Error("the silent node that answered is not suspect")
	}
	// An operator's listing through a shows it.
	if list, err := a.ListNodes(t.Context()); err != nil {
		t.Fatal(err)
	} else {
		for _, n := range list {
			if (n.SuspectSince != nil) != (n.ID == "b") {
				t.Errorf("a's listing: node %s suspect since %v", n.ID, n.SuspectSince)
			}
		}
	}
	if cands, _ := st.Place(t.Context(), Placement{MemoryMiB: 1024, VCPU: 1, Alive: a.alive()}); len(cands) != 1 || cands[0].ID != "a" {
		t.Errorf("placement candidates with b suspect: %v, want a alone", cands)
	}

	// a cannot reach b itself (a cut between the two), c can: c's probe
	// keeps b suspect, not lost.
	testNode(t, st, ca, "c", 4096, says("c"))
	tr := a.transport()
	direct := tr.DialContext
	tr.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		if addr == ln.Addr().String() {
			return nil, errors.New("cut")
		}
		return direct(ctx, network, addr)
	}
	a.client = &http.Client{Transport: tr}
	if _, ok := a.askAlive(t.Context(), &Node{ID: "b", Address: ln.Addr().String()}); ok {
		t.Fatal("the cut between a and b lets a through")
	}
	a.declareSilent(t.Context())
	if n, _ := st.GetNode(t.Context(), "b"); n.State == StateDown || !a.suspect.has("b") {
		t.Fatalf("a node another node reaches is %s (suspect: %v), want suspect and up", n.State, a.suspect.has("b"))
	}

	// b's channel goes silent too: now it is lost.
	cancel()
	<-served
	a.declareSilent(t.Context())
	if n, _ := st.GetNode(t.Context(), "b"); n.State != StateDown {
		t.Fatalf("a node silent on every path is %s, want down", n.State)
	}
	if a.suspect.has("b") {
		t.Error("a lost node is still suspect")
	}
	if err := st.Heartbeat(t.Context(), "b", b.epoch); !errdefs.IsConflict(err) {
		t.Errorf("the lost node's heartbeat: %v, want it fenced", err)
	}
}

// TestExtentsCarryDataAlone: a sparse file moves as its data extents and
// arrives with the same bytes and its holes; hostile headers are refused.
func TestExtentsCarryDataAlone(t *testing.T) {
	src := t.TempDir()
	mem := filepath.Join(src, "mem")
	f, err := os.Create(mem)
	if err != nil {
		t.Fatal(err)
	}
	const size = 64 << 20
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	for _, off := range []int64{0, 8 << 20, size - 4096} {
		if _, err := f.WriteAt(bytes.Repeat([]byte{0xa5}, 4096), off); err != nil {
			t.Fatal(err)
		}
	}
	f.Close()
	if err := os.WriteFile(filepath.Join(src, "state"), []byte("device state"), 0o600); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := writeExtents(&buf, map[string]string{"mem": mem, "state": filepath.Join(src, "state")}); err != nil {
		t.Fatal(err)
	}
	if buf.Len() > 1<<20 {
		t.Errorf("a 64 MiB file with 12 KiB of data took %d bytes", buf.Len())
	}
	dst := t.TempDir()
	if err := readExtents(bytes.NewReader(buf.Bytes()), dst); err != nil {
		t.Fatal(err)
	}
	want, _ := os.ReadFile(mem)
	got, _ := os.ReadFile(filepath.Join(dst, "mem"))
	if !bytes.Equal(got, want) {
		t.Fatal("the moved file differs")
	}
	if st, _ := os.ReadFile(filepath.Join(dst, "state")); string(st) != "device state" {
		t.Errorf("the small file arrived as %q", st)
	}
	var stat unix.Stat_t
	if err := unix.Stat(filepath.Join(dst, "mem"), &stat); err == nil && stat.Blocks*512 > 1<<20 {
		t.Errorf("the moved file holds %d bytes on disk: its holes were filled", stat.Blocks*512)
	}

	for name, fe := range map[string]fileExtents{
		"a path":       {Name: "../mem", Size: 10},
		"hidden":       {Name: ".x", Size: 10},
		"overlap":      {Name: "mem", Size: 100, Extents: [][2]int64{{0, 50}, {40, 10}}},
		"past the end": {Name: "mem", Size: 100, Extents: [][2]int64{{90, 20}}},
		"empty extent": {Name: "mem", Size: 100, Extents: [][2]int64{{10, 0}}},
		"too large":    {Name: "mem", Size: maxMoveFileSize + 1},
	} {
		hdr, _ := json.Marshal(fe)
		var s bytes.Buffer
		binary.Write(&s, binary.BigEndian, uint32(len(hdr)))
		s.Write(hdr)
		s.Write(make([]byte, 200))
		if err := readExtents(&s, t.TempDir()); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}
