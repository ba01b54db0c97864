package sandbox

import (
	"bufio"
	"context"
	"errors"
	"log/slog"
	"net"
	"net/netip"
	"reflect"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/emberbox/emberbox/internal/egress"
	"github.com/emberbox/emberbox/internal/errdefs"
	"github.com/emberbox/emberbox/internal/guest"
)

// Refusal events per sandbox: the first maxRefusalEvents one by one, then at
// most one every 10 s (each with the running count), and never more than
// maxRefusalEventsTotal, so a guest cannot grow the database without bound.
const (
	maxRefusalEvents      = 100
	maxRefusalEventsTotal = 1000
	maxEventTarget        = 256 // bytes of a refused target kept in its event
)

// truncate cuts s to at most n bytes at a UTF-8 boundary.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// gates makes, rebuilds and closes the per-VM egress gates of sandboxes.
type gates struct {
	host          gateHost
	egress        *egress.Operator // the operator's ceiling
	egressDefault egress.Policy    // the policy of a sandbox from before policies were stored
	records       Store
	obs           Observer
	vols          Volumes // serves volume streams; nil: none
	// swapper makes a gate's egress secrets (Config.Swapper); nil: none.
	swapper func(id string, event func(typ, msg string, data map[string]any)) egress.Swapper
	log     *slog.Logger
}

// gateHost is what gates need of the manager: goroutines it owns and
// sandbox events.
type gateHost interface {
	spawn(f func()) bool
	event(id, typ, msg string, data map[string]any)
}

// open returns the egress gate of a sandbox, whose refusals become events
// of the sandbox.
func (gs *gates) open(id string, pol *egress.Compiled, version int64) *egress.Gate {
	g := egress.NewGate(gs.egress, pol)
	if version > 1 {
		g.SetPolicy(pol, version)
	}
	if gs.swapper != nil {
		g.SetSwapper(gs.swapper(id, func(typ, msg string, data map[string]any) {
			gs.host.spawn(func() { gs.host.event(id, typ, msg, data) })
		}))
	}
	var n, recorded atomic.Int64
	var last atomic.Int64 // unix nanoseconds of the last recorded refusal
	g.OnRefuse = func(r *egress.Refusal) {
		gs.obs.EgressRefused(string(r.Reason))
		c := n.Add(1)
		if c > maxRefusalEvents {
			// A guest can refuse itself in a loop: past the first ones,
			// at most one event every 10 s and maxRefusalEventsTotal in all.
			now := time.Now().UnixNano()
			prev := last.Load()
			if recorded.Load() >= maxRefusalEventsTotal || now-prev < int64(10*time.Second) || !last.CompareAndSwap(prev, now) {
				return
			}
		} else {
			last.Store(time.Now().UnixNano())
		}
		recorded.Add(1)
		gs.host.spawn(func() {
			// The target is the guest's to choose: kept short.
			target := truncate(r.Target, maxEventTarget)
			gs.host.event(id, "egress_refused", "egress to "+target+" refused: "+string(r.Reason),
				map[string]any{"reason": string(r.Reason), "target": target, "refusals": c})
		})
	}
	return g
}

// restore rebuilds the gate of a reattached sandbox from the store.
func (gs *gates) restore(ctx context.Context, id string) *egress.Gate {
	n, err := gs.records.GetNetwork(ctx, id)
	if err == nil {
		c, cerr := egress.Compile(n.Policy)
		if cerr == nil {
			return gs.open(id, c, n.Version)
		}
		err = cerr
	}
	if errdefs.IsNotFound(err) {
		// A sandbox from before policies were stored gets the default.
		if c, err := egress.Compile(gs.egressDefault); err == nil {
			return gs.open(id, c, 1)
		}
	}
	// Any other failure fails closed: no egress until the policy is set again.
	gs.log.Error("restoring egress policy; the sandbox gets no egress", "sandbox_id", id, "err", err)
	return gs.open(id, egress.MustCompile(egress.Policy{}), 1)
}

func (in *instance) egressGate() *egress.Gate {
	in.mu.Lock()
	defer in.mu.Unlock()
	return in.gate
}

// close cuts the sandbox's connections and records the gate's totals (the
// counters live in memory only; the event keeps them for metering).
func (gs *gates) close(in *instance) {
	in.mu.Lock()
	g := in.gate
	in.gate = nil
	in.mu.Unlock()
	if g == nil {
		return
	}
	g.Close()
	c := g.Counters()
	in.egressOut.Store(c.BytesOut)
	in.egressIn.Store(c.BytesIn)
	if c.BytesIn+c.BytesOut+c.Refused > 0 {
		gs.host.event(in.id, "egress_totals", "egress totals of this run", map[string]any{
			"bytesIn": c.BytesIn, "bytesOut": c.BytesOut, "refused": c.Refused, "dials": c.Dials})
	}
}

// handler serves the streams a sandbox's guest opens with the sandbox's
// gate, looked up per stream: there is none once it stops.
func (gs *gates) handler(in *instance) guest.EgressHandler {
	return gateHandler{in: in, vols: gs.vols}
}

type gateHandler struct {
	in   *instance
	vols Volumes // serves volume streams; nil: none
}

func (h gateHandler) ServeProxy(ctx context.Context, c net.Conn, br *bufio.Reader) {
	if g := h.in.egressGate(); g != nil {
		g.ServeProxy(ctx, c, br)
	}
}

func (h gateHandler) AnswerDNS(ctx context.Context, q []byte) []byte {
	if g := h.in.egressGate(); g != nil {
		return g.AnswerDNS(ctx, q)
	}
	return nil
}

func (h gateHandler) ServeTCP(ctx context.Context, dst netip.AddrPort, c net.Conn, br *bufio.Reader, accept func(error) error) {
	g := h.in.egressGate()
	if g == nil {
		_ = accept(errors.New("sandbox stopping"))
		return
	}
	g.ServeTCP(ctx, dst, c, br, func(err error) error {
		if r, ok := egress.AsRefusal(err); ok {
			err = &guest.RefusedError{Reason: string(r.Reason)}
		}
		return accept(err)
	})
}

// Networks keeps the egress policies of sandboxes and applies a change to
// a running one's gate at once. It reaches the manager through
// networkHost; Manager.Networks returns the manager's.
type Networks struct {
	host          networkHost
	records       Store
	egress        *egress.Operator // the operator's ceiling
	egressDefault egress.Policy    // the policy of a sandbox created without one

	mu sync.Mutex // serializes policy changes (version numbers)
}

// networkHost is what policies need of the manager: a sandbox as its owner
// sees it, its instance if it runs here, its events and the clock.
type networkHost interface {
	Get(ctx context.Context, owner, id string) (*Sandbox, error)
	liveInstance(id string) *instance
	event(id, typ, msg string, data map[string]any)
	now() time.Time
}

// Network returns a sandbox's egress policy and whether it is enforced.
func (nw *Networks) Network(ctx context.Context, owner, id string) (*NetworkStatus, error) {
	sb, err := nw.host.Get(ctx, owner, id)
	if err != nil {
		return nil, err
	}
	n, err := nw.records.GetNetwork(ctx, sb.ID)
	if errdefs.IsNotFound(err) {
		n = &Network{Policy: nw.egressDefault, Version: 1, UpdatedAt: sb.CreatedAt}
	} else if err != nil {
		return nil, err
	}
	return nw.networkStatus(sb.ID, n), nil
}

func (nw *Networks) networkStatus(id string, n *Network) *NetworkStatus {
	st := &NetworkStatus{SandboxID: id, Network: *n, Enforced: true, EnforcedVersion: n.Version}
	// The store keeps the policy asked for; what applies is that within
	// the operator's ceiling, which may have changed since.
	if c, err := egress.Compile(n.Policy); err == nil {
		eff := nw.egress.Limit(c).Policy
		st.Limited = !reflect.DeepEqual(eff, c.Policy)
		st.Network.Policy = eff
	}
	if in := nw.host.liveInstance(id); in != nil {
		if g := in.egressGate(); g != nil {
			_, v := g.Policy()
			st.EnforcedVersion, st.Enforced = v, v == n.Version
			st.Counters = g.Counters()
		}
	}
	if st.Network.Policy.Allow == nil {
		st.Network.Policy.Allow = []string{}
	}
	if st.Network.Policy.Deny == nil {
		st.Network.Policy.Deny = []string{}
	}
	return st
}

// SetNetwork replaces a sandbox's egress policy. It applies at once to new
// connections and cuts open ones it refuses.
func (nw *Networks) SetNetwork(ctx context.Context, owner, id string, p egress.Policy) (*NetworkStatus, error) {
	sb, err := nw.host.Get(ctx, owner, id)
	if err != nil {
		return nil, err
	}
	c, err := egress.Compile(p)
	if err != nil {
		return nil, errdefs.New(errdefs.ErrInvalidArgument, "invalid_request", "%v", err)
	}
	nw.mu.Lock()
	defer nw.mu.Unlock()
	version := int64(1)
	if cur, err := nw.records.GetNetwork(ctx, sb.ID); err == nil {
		version = cur.Version + 1
	} else if !errdefs.IsNotFound(err) {
		return nil, err
	}
	n := &Network{Policy: c.Policy, Version: version, UpdatedAt: nw.host.now()}
	if err := nw.records.PutNetwork(ctx, sb.ID, n); err != nil {
		return nil, err
	}
	if in := nw.host.liveInstance(sb.ID); in != nil {
		if g := in.egressGate(); g != nil {
			g.SetPolicy(c, version)
		}
	}
	// Versions and counts only: a policy can hold hundreds of rules, and
	// GET …/network shows the one in force.
	eff := nw.egress.Limit(c)
	nw.host.event(sb.ID, "network_changed", "egress policy changed", map[string]any{"version": version, "internet": eff.Internet,
		"allowRules": len(eff.Allow), "denyRules": len(eff.Deny)})
	return nw.networkStatus(sb.ID, n), nil
}
