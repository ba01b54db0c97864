package cluster

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"

	"github.com/emberbox/emberbox/internal/sandbox"
)

// HeaderForwardedBy marks a request a peer forwarded; it is honoured only
// on the node-to-node channel (a tenant sending it gets the normal
// routing).
const HeaderForwardedBy = "X-Emberbox-Forwarded-By"

// HeaderClientAddr carries, on the node-to-node channel, the IP address of
// the client a forwarded request came from, so that the serving node's
// per-address limits count that client and not the peer. The serving node
// believes it only from a peer with a cluster certificate (Serve); the
// entry node drops it from every request a client sends (Handler).
const HeaderClientAddr = "X-Emberbox-Client-Addr"

// maxCreateBody bounds the create body the router reads to place it.
const maxCreateBody = 1 << 20

// Target names the sandbox a request outside the Runtime API's sandbox
// and snapshot routes is for (E2B's traffic and control plane, a
// preview, a signed link), or says it creates one; "" and false route it
// nowhere.
type Target func(r *http.Request) (sandboxID string, create bool)

// Admit gates a request at the entry node before it is forwarded to
// another node (authentication and rate limits, api.Admit): it answers
// and returns false when the request may not pass.
type Admit func(w http.ResponseWriter, r *http.Request) bool

// SetAdmit sets the gate Handler runs on a client's request before it
// forwards it to another node. Call it before serving.
func (c *Cluster) SetAdmit(a Admit) { c.admit.Store(&a) }

// fromClient marks a request Handler received from a client: only those
// are gated before a forward (a caller that routes a request itself gates
// it its own way).
type fromClient struct{}

// admitted runs the entry gate on r before it goes to another node.
func (c *Cluster) admitted(w http.ResponseWriter, r *http.Request) bool {
	a := c.admit.Load()
	if a == nil || r.Context().Value(fromClient{}) == nil {
		return true
	}
	return (*a)(w, r)
}

// Handler routes the server in front of next (this node's API, and
// whatever next serves beside it): a create is placed on a node and sent
// there; a call for a sandbox or snapshot of another node that is not
// down is proxied to it, once SetAdmit's gate let it pass here;
// everything else is next's. targets name the sandboxes of the calls the
// Runtime API's paths do not (tried in order, the first that names one
// wins).
func (c *Cluster) Handler(next http.Handler, targets ...Target) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// Only a peer says where a request came from.
		r.Header.Del(HeaderClientAddr)
		r = r.WithContext(context.WithValue(r.Context(), fromClient{}, true))
		switch {
		case r.Method == http.MethodPost && strings.TrimSuffix(r.URL.Path, "/") == "/v1/sandboxes":
			c.place(w, r, next)
			return
		case strings.HasPrefix(r.URL.Path, "/v1/sandboxes/"):
			c.routeOwned(w, r, next, "sandboxes", resourceID(r.URL.Path, "/v1/sandboxes/"))
			return
		case strings.HasPrefix(r.URL.Path, "/v1/snapshots/"):
			c.routeOwned(w, r, next, "snapshots", resourceID(r.URL.Path, "/v1/snapshots/"))
			return
		}
		for _, t := range targets {
			id, create := t(r)
			if create {
				c.place(w, r, next)
				return
			}
			if id != "" {
				c.routeOwned(w, r, next, "sandboxes", id)
				return
			}
		}
		next.ServeHTTP(w, r)
	})
}

// RouteSandbox serves r, a call for sandbox id that no path names (a
// preview's host): with next here, or on the node that runs id.
func (c *Cluster) RouteSandbox(w http.ResponseWriter, r *http.Request, next http.Handler, id string) {
	c.routeOwned(w, r, next, "sandboxes", id)
}

// resourceID is the id after prefix, up to a '/' or a ':verb'.
func resourceID(path, prefix string) string {
	id := strings.TrimPrefix(path, prefix)
	if i := strings.IndexAny(id, "/:"); i >= 0 {
		id = id[:i]
	}
	return id
}

// routeOwned serves a call for resource id of table: here if it is this
// node's, unknown, or its node is down (the store answers for it);
// otherwise on its node, once admitted here.
func (c *Cluster) routeOwned(w http.ResponseWriter, r *http.Request, next http.Handler, table, id string) {
	owner, err := c.cfg.Store.OwnerNode(r.Context(), table, id)
	if err != nil || owner == "" || owner == c.ID() {
		next.ServeHTTP(w, r)
		return
	}
	n, err := c.cfg.Store.GetNode(r.Context(), owner)
	if err != nil || n.State == StateDown {
		next.ServeHTTP(w, r)
		return
	}
	if !c.admitted(w, r) {
		return
	}
	// The proxy's error handler sees the outgoing request; a fallback
	// serves the incoming one.
	c.proxy(n, next).ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), incomingKey{}, r)))
}

type incomingKey struct{}

// isRecordRead reports whether r only reads the record of a sandbox or
// snapshot (GET /v1/sandboxes/{id} without a wait): the store answers it
// as well as the owner, if not as fresh.
func isRecordRead(r *http.Request) bool {
	if r.Method != http.MethodGet || r.URL.Query().Has("waitFor") {
		return false
	}
	for _, prefix := range []string{"/v1/sandboxes/", "/v1/snapshots/"} {
		if rest, ok := strings.CutPrefix(r.URL.Path, prefix); ok && rest != "" && !strings.ContainsAny(rest, "/:") {
			return true
		}
	}
	return false
}

// proxy forwards requests to node n over the channel, streaming both ways
// (NDJSON is flushed as it comes; upgrades pass through). If n does not
// answer, a read of a record is answered by local (from the store: a node
// that just died is not yet declared lost), anything else 503.
func (c *Cluster) proxy(n *Node, local http.Handler) http.Handler {
	target, _ := url.Parse(peerURL(n))
	return &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(target)
			pr.Out.Host = pr.In.Host // previews and links are made from it
			pr.SetXForwarded()
			pr.Out.Header.Set(HeaderForwardedBy, c.ID())
			if ip := remoteIP(pr.In); ip.IsValid() {
				pr.Out.Header.Set(HeaderClientAddr, ip.String())
			}
		},
		Transport:     c.client.Transport,
		FlushInterval: -1,
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			c.log.Warn("proxying to a node", "to", n.ID, "path", r.URL.Path, "err", err)
			if in, ok := r.Context().Value(incomingKey{}).(*http.Request); ok && local != nil && isRecordRead(in) && r.Context().Err() == nil {
				local.ServeHTTP(w, in)
				return
			}
			writeError(w, http.StatusServiceUnavailable, "node_unreachable",
				"the node that runs this sandbox ("+n.ID+") does not answer", "retry; if the node is lost, the sandbox is stopped within the node timeout")
		},
	}
}

// createFields are what placement reads of a create.
type createFields struct {
	MemoryMiB  *int            `json:"memoryMiB"`
	VCPU       *int            `json:"vcpu"`
	Snapshot   string          `json:"snapshot"`
	SpreadFrom json.RawMessage `json:"spreadFrom"`
}

// place sends a create to the best node that takes it: candidates from
// the store, best fit first; one that answers no_capacity (its ledger had
// less room than the store showed: a race) passes it to the next.
func (c *Cluster) place(w http.ResponseWriter, r *http.Request, next http.Handler) {
	body, err := io.ReadAll(io.LimitReader(r.Body, maxCreateBody+1))
	if err != nil || len(body) > maxCreateBody {
		next.ServeHTTP(w, withBody(r, body)) // the API answers what is wrong
		return
	}
	var f createFields
	if json.Unmarshal(body, &f) != nil {
		next.ServeHTTP(w, withBody(r, body))
		return
	}
	p, ok := c.placement(r.Context(), f)
	if !ok {
		next.ServeHTTP(w, withBody(r, body)) // the API refuses it
		return
	}
	cands, err := c.cfg.Store.Place(r.Context(), p)
	if err != nil {
		c.log.Warn("placing a create", "err", err)
		writeError(w, http.StatusServiceUnavailable, "unavailable", "The service is unavailable right now.", "")
		return
	}
	refused, answered := c.offer(w, r, next, body, cands)
	if answered {
		return
	}
	if refused != nil {
		copyRecorded(w, refused) // in the shape of the protocol asked
		return
	}
	writeNoRoom(w, r)
}

// placement is what a create with fields f asks of its node; false when
// it spreads from more sandboxes than the API takes.
func (c *Cluster) placement(ctx context.Context, f createFields) (Placement, bool) {
	p := Placement{MemoryMiB: sandbox.DefaultMemoryMiB, VCPU: sandbox.DefaultVCPU, Alive: c.alive()}
	if f.MemoryMiB != nil {
		p.MemoryMiB = int64(*f.MemoryMiB)
	}
	if f.VCPU != nil {
		p.VCPU = *f.VCPU
	}
	if f.Snapshot != "" {
		// A copy of a snapshot runs where the snapshot's files are if
		// that node has room; another node fetches them first.
		if node, err := c.cfg.Store.OwnerNode(ctx, "snapshots", f.Snapshot); err == nil && node != "" {
			p.Prefer = node
		}
	}
	var spread []string
	if len(f.SpreadFrom) > 0 && json.Unmarshal(f.SpreadFrom, &spread) != nil {
		var one string
		if json.Unmarshal(f.SpreadFrom, &one) == nil {
			spread = []string{one}
		}
	}
	if len(spread) > 16 {
		return Placement{}, false
	}
	for _, id := range spread {
		p.Exclude = append(p.Exclude, c.nodeOf(ctx, id))
	}
	return p, true
}

// offer sends the create in body to cands in turn until one takes it or
// refuses it for good, which answered reports. A candidate that had no room
// or did not answer passes it on; refused is the last no_capacity answer.
func (c *Cluster) offer(w http.ResponseWriter, r *http.Request, next http.Handler, body []byte, cands []*Node) (refused *httptest.ResponseRecorder, answered bool) {
	gated := false // by this node's gate, or by its API's own when it said no_capacity
	for _, n := range cands {
		rec := httptest.NewRecorder()
		switch {
		case n.ID == c.ID():
			next.ServeHTTP(rec, withBody(r, body))
			gated = true
		case !gated && !c.admitted(w, r):
			return nil, true
		default:
			gated = true
			c.proxy(n, nil).ServeHTTP(rec, withBody(r, body))
		}
		if (rec.Code == http.StatusConflict || rec.Code == http.StatusTooManyRequests) && errorCode(rec.Body.Bytes()) == "no_capacity" {
			c.log.Info("a node had no room after all; trying the next", "node", n.ID)
			refused = rec
			continue
		}
		if rec.Code == http.StatusServiceUnavailable && errorCode(rec.Body.Bytes()) == "node_unreachable" {
			continue
		}
		copyRecorded(w, rec)
		return nil, true
	}
	return refused, false
}

// writeNoRoom answers a create no node has room for, in the error shape of
// the protocol it came in.
func writeNoRoom(w http.ResponseWriter, r *http.Request) {
	const msg = "no node of the cluster has room for this sandbox"
	if !strings.HasPrefix(r.URL.Path, "/v1/") {
		// Another protocol's create (E2B's): its error shape,
		// {code, message, error_code}, and its status for no room.
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusTooManyRequests)
		_ = json.NewEncoder(w).Encode(map[string]any{"code": http.StatusTooManyRequests, "message": msg, "error_code": "no_capacity"})
		return
	}
	writeError(w, http.StatusConflict, "no_capacity", msg, "wait for sandboxes to end, or ask for less memory")
}

// nodeOf is the node of a sandbox or snapshot by id ("" unknown).
func (c *Cluster) nodeOf(ctx context.Context, id string) string {
	table := "sandboxes"
	if strings.HasPrefix(id, "snap") {
		table = "snapshots"
	}
	node, _ := c.cfg.Store.OwnerNode(ctx, table, id)
	return node
}

func withBody(r *http.Request, body []byte) *http.Request {
	r2 := r.Clone(r.Context())
	r2.Body = io.NopCloser(bytes.NewReader(body))
	r2.ContentLength = int64(len(body))
	return r2
}

// errorCode is the code of an error answer: the Runtime API's
// {"error": {"code"}} or E2B's {"error_code"}.
func errorCode(body []byte) string {
	var e struct {
		Error struct {
			Code string `json:"code"`
		} `json:"error"`
		ErrorCode string `json:"error_code"`
	}
	_ = json.Unmarshal(body, &e)
	if e.Error.Code != "" {
		return e.Error.Code
	}
	return e.ErrorCode
}

func copyRecorded(w http.ResponseWriter, rec *httptest.ResponseRecorder) {
	for k, v := range rec.Header() {
		w.Header()[k] = v
	}
	w.WriteHeader(rec.Code)
	_, _ = w.Write(rec.Body.Bytes())
}

// writeError answers in the API's one error shape.
func writeError(w http.ResponseWriter, status int, code, msg, hint string) {
	var rid [8]byte
	_, _ = rand.Read(rid[:])
	id := "req_" + hex.EncodeToString(rid[:])
	b, _ := json.Marshal(map[string]any{"error": map[string]any{
		"code": code, "status": status, "message": msg, "hint": hint, "requestId": id,
	}})
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Request-Id", id)
	w.WriteHeader(status)
	_, _ = w.Write(b)
}
