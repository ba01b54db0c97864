package egress

import (
	"container/list"
	"context"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// Gate enforces one sandbox's policy: every name lookup and connection of
// that sandbox goes through it. It tracks the connections it opened so a
// policy change can cut the ones the new policy refuses.
type Gate struct {
	op *Operator
	// OnRefuse, if set, is called (synchronously) for every refusal.
	OnRefuse func(*Refusal)

	mu      sync.Mutex
	pol     *Compiled
	version int64
	conns   map[*conn]struct{}
	// guests are the sandbox's connections served by intercept: between
	// requests they have no upstream connection for Close to cut.
	guests map[net.Conn]struct{}
	closed bool
	// Names the guest resolved get stand-in addresses from FakeRange, so
	// a program that connects to "the address" without the proxy is
	// captured and still checked, resolved and dialed by name on the host.
	// At most MaxStandIns names are kept, least recently used first out.
	fakeOf   map[string]*list.Element // of *standIn
	nameOf   map[netip.Addr]*list.Element
	fakeLRU  list.List // front: most recently used
	nextFake uint32

	// swapper, if set, names the hosts whose TLS the gate terminates
	// and rewrites their requests (egress secrets).
	swapper atomic.Pointer[Swapper]
	// trusted is the CA bundle the guest is known to trust (SetTrusted).
	trusted atomic.Pointer[string]

	bytesOut, bytesIn atomic.Int64 // to and from the outside
	refused           atomic.Int64
	dials             atomic.Int64
}

// NewGate returns a gate applying pol, within the operator's ceiling
// (version 1 until SetPolicy).
func NewGate(op *Operator, pol *Compiled) *Gate {
	return &Gate{op: op, pol: op.Limit(pol), version: 1, conns: map[*conn]struct{}{}, guests: map[net.Conn]struct{}{},
		fakeOf: map[string]*list.Element{}, nameOf: map[netip.Addr]*list.Element{}}
}

// MaxStandIns bounds the stand-in table of one sandbox.
const MaxStandIns = 4096

// standInIdle is how long a stand-in must go unused before it is given to
// another name: twice the answers' TTL, so a guest cache that still holds
// it has let it go.
const standInIdle = 2 * dnsTTL * time.Second

// clock is the stand-ins' time; tests move it.
var clock = time.Now

type standIn struct {
	name string
	addr netip.Addr
	used time.Time
}

// FakeRange holds the stand-in addresses the guest's DNS answers carry. It
// is inside 198.18.0.0/15, which the always-refused set covers, so a
// stand-in never reaches a real host.
var FakeRange = netip.MustParsePrefix("198.19.0.0/16")

// fakeAddr returns name's stand-in address, allocating one if needed. With
// MaxStandIns names held, the least recently used one gives up its
// address if it has been idle for standInIdle; otherwise there is none
// (the guest floods its own resolver, and gets SERVFAIL).
func (g *Gate) fakeAddr(name string) (netip.Addr, bool) {
	now := clock()
	g.mu.Lock()
	defer g.mu.Unlock()
	if e, ok := g.fakeOf[name]; ok {
		si := e.Value.(*standIn)
		si.used = now
		g.fakeLRU.MoveToFront(e)
		return si.addr, true
	}
	var a netip.Addr
	if g.fakeLRU.Len() < MaxStandIns {
		g.nextFake++
		base := FakeRange.Addr().As4()
		a = netip.AddrFrom4([4]byte{base[0], base[1], byte(g.nextFake >> 8), byte(g.nextFake)})
	} else {
		e := g.fakeLRU.Back()
		old := e.Value.(*standIn)
		if now.Sub(old.used) < standInIdle {
			return netip.Addr{}, false
		}
		g.fakeLRU.Remove(e)
		delete(g.fakeOf, old.name)
		delete(g.nameOf, old.addr)
		a = old.addr
	}
	e := g.fakeLRU.PushFront(&standIn{name: name, addr: a, used: now})
	g.fakeOf[name], g.nameOf[a] = e, e
	return a, true
}

// fakeName returns the name a stand-in address stands for.
func (g *Gate) fakeName(a netip.Addr) (string, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	e, ok := g.nameOf[a.Unmap()]
	if !ok {
		return "", false
	}
	si := e.Value.(*standIn)
	si.used = clock()
	g.fakeLRU.MoveToFront(e)
	return si.name, true
}

// Policy returns the policy in force and its version.
func (g *Gate) Policy() (*Compiled, int64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.pol, g.version
}

// Counters are a gate's totals.
type Counters struct {
	BytesOut int64 `json:"bytesOut"` // sent by the sandbox
	BytesIn  int64 `json:"bytesIn"`  // received by the sandbox
	Refused  int64 `json:"refused"`
	Dials    int64 `json:"dials"` // connections the host opened
	Open     int   `json:"open"`  // connections open now
}

// Counters returns the gate's totals.
func (g *Gate) Counters() Counters {
	g.mu.Lock()
	n := len(g.conns)
	g.mu.Unlock()
	return Counters{BytesOut: g.bytesOut.Load(), BytesIn: g.bytesIn.Load(), Refused: g.refused.Load(), Dials: g.dials.Load(), Open: n}
}

// SetPolicy puts pol, within the operator's ceiling, in force at version.
// New connections see it at once; open connections that it refuses are
// cut.
func (g *Gate) SetPolicy(pol *Compiled, version int64) {
	pol = g.op.Limit(pol)
	g.mu.Lock()
	g.pol, g.version = pol, version
	var cut []*conn
	for c := range g.conns {
		if g.check(pol, c.host, c.addr, c.port) != nil {
			cut = append(cut, c)
		}
	}
	g.mu.Unlock()
	for _, c := range cut {
		c.cut()
	}
}

// Close cuts every connection and refuses new ones (the sandbox stopped).
func (g *Gate) Close() {
	g.mu.Lock()
	g.closed = true
	g.pol = MustCompile(Policy{Internet: false})
	cs := make([]*conn, 0, len(g.conns))
	for c := range g.conns {
		cs = append(cs, c)
	}
	guests := make([]net.Conn, 0, len(g.guests))
	for c := range g.guests {
		guests = append(guests, c)
	}
	g.mu.Unlock()
	for _, c := range cs {
		c.cut()
	}
	for _, c := range guests {
		c.Close()
	}
}

func (g *Gate) refuse(err error) error {
	if r, ok := AsRefusal(err); ok {
		g.refused.Add(1)
		if g.OnRefuse != nil {
			g.OnRefuse(r)
		}
	}
	return err
}

// check applies pol and the operator's refused set to one destination.
// host is "" for a connection asked for by address.
func (g *Gate) check(pol *Compiled, host string, a netip.Addr, port int) error {
	target := net.JoinHostPort(a.String(), strconv.Itoa(port))
	if host != "" {
		target = net.JoinHostPort(host, strconv.Itoa(port))
	}
	if !pol.Internet {
		return &Refusal{ReasonInternetOff, target}
	}
	if g.op.PortForbidden(port) {
		return &Refusal{ReasonPortForbidden, target}
	}
	if host != "" {
		if err := pol.CheckName(host); err != nil {
			return &Refusal{err.(*Refusal).Reason, target}
		}
	}
	if g.op.Forbidden(a) || g.op.closed(a, port) {
		return &Refusal{ReasonAddressForbidden, target}
	}
	if err := pol.CheckAddr(a, host != ""); err != nil {
		return &Refusal{err.(*Refusal).Reason, target}
	}
	return nil
}

// Resolve looks host up for the sandbox: refused names are never looked up
// and addresses the policy refuses are left out. An IP literal is checked as
// an address. The error is a *Refusal if the name or every address was
// refused.
func (g *Gate) Resolve(ctx context.Context, host string) ([]netip.Addr, error) {
	pol, _ := g.Policy()
	host = normalizeHost(host)
	if !pol.Internet {
		return nil, g.refuse(&Refusal{ReasonInternetOff, host})
	}
	literal := false
	if a, err := netip.ParseAddr(host); err == nil {
		literal, host = true, a.Unmap().String()
	} else if err := pol.CheckName(host); err != nil {
		return nil, g.refuse(err)
	}
	addrs, err := g.op.lookup(ctx, host)
	if err != nil {
		return nil, err
	}
	var ok []netip.Addr
	var first error
	for _, a := range addrs {
		name := host
		if literal {
			name = ""
		}
		// Port 443 stands for "some allowed port": the DNS answer does not
		// know the port; connections are checked again when made.
		if err := g.check(pol, name, a, 443); err != nil {
			if first == nil {
				first = err
			}
			continue
		}
		ok = append(ok, a)
	}
	if len(ok) == 0 {
		if first == nil {
			return nil, fmt.Errorf("no addresses for %s", host)
		}
		r, _ := AsRefusal(first)
		return nil, g.refuse(&Refusal{r.Reason, host})
	}
	return ok, nil
}

// Dial connects to host:port for the sandbox: it resolves host on the host,
// checks the name and every address, and connects only to an address it
// checked. The connection is tracked until closed.
func (g *Gate) Dial(ctx context.Context, host string, port int) (net.Conn, error) {
	pol, _ := g.Policy()
	host = normalizeHost(host)
	name := host
	if a, err := netip.ParseAddr(host); err == nil {
		name, host = "", a.Unmap().String()
		if n, ok := g.fakeName(a); ok {
			name, host = n, n // a stand-in: dial the name it stands for
		}
	}
	target := net.JoinHostPort(host, strconv.Itoa(port))
	if !pol.Internet {
		return nil, g.refuse(&Refusal{ReasonInternetOff, target})
	}
	if g.op.PortForbidden(port) {
		return nil, g.refuse(&Refusal{ReasonPortForbidden, target})
	}
	if name != "" {
		if err := pol.CheckName(name); err != nil {
			return nil, g.refuse(&Refusal{err.(*Refusal).Reason, target})
		}
	}
	addrs, err := g.op.lookup(ctx, host)
	if err != nil {
		return nil, fmt.Errorf("resolving %s: %w", host, err)
	}
	// Every address must pass: a name that resolves to a forbidden address
	// among public ones is refused outright rather than half used.
	for _, a := range addrs {
		if err := g.check(pol, name, a, port); err != nil {
			return nil, g.refuse(err)
		}
	}
	var lastErr error = fmt.Errorf("no addresses for %s", host)
	for _, a := range addrs {
		g.dials.Add(1)
		dctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		nc, err := g.op.Dial(dctx, "tcp", netip.AddrPortFrom(a, uint16(port)).String())
		cancel()
		if err != nil {
			lastErr = err
			continue
		}
		// The host's addresses were read at startup; one added since is
		// not in HostAddrs. Linux picks a local destination itself as the
		// source, so a connection whose two ends share an address went to
		// the host (unless the operator opened that address).
		if selfConnected(nc) && !g.op.opened(a) {
			nc.Close()
			return nil, g.refuse(&Refusal{ReasonAddressForbidden, target})
		}
		c := &conn{Conn: nc, g: g, host: name, addr: a, port: port}
		g.mu.Lock()
		// The policy may have changed while dialing: check again under the lock.
		if err := g.check(g.pol, name, a, port); err != nil || g.closed {
			g.mu.Unlock()
			nc.Close()
			if err == nil {
				err = &Refusal{ReasonInternetOff, target}
			}
			return nil, g.refuse(err)
		}
		g.conns[c] = struct{}{}
		g.mu.Unlock()
		return c, nil
	}
	return nil, lastErr
}

// selfConnected reports whether nc's local and remote IP addresses are the
// same: the connection stayed on this host.
func selfConnected(nc net.Conn) bool {
	return sameIP(nc.LocalAddr(), nc.RemoteAddr())
}

// sameIP reports whether two TCP addresses have the same IP. Addresses of
// other kinds are never the same.
func sameIP(local, remote net.Addr) bool {
	l, ok1 := local.(*net.TCPAddr)
	r, ok2 := remote.(*net.TCPAddr)
	if !ok1 || !ok2 || l == nil || r == nil {
		return false
	}
	la, ok1 := netip.AddrFromSlice(l.IP)
	ra, ok2 := netip.AddrFromSlice(r.IP)
	return ok1 && ok2 && la.Unmap() == ra.Unmap()
}

// conn is a tracked, counted connection to the outside.
type conn struct {
	net.Conn
	g    *Gate
	host string
	addr netip.Addr
	port int

	once  sync.Once
	onCut atomic.Pointer[func()]
}

func (c *conn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	c.g.bytesIn.Add(int64(n))
	return n, err
}

func (c *conn) Write(b []byte) (int, error) {
	n, err := c.Conn.Write(b)
	c.g.bytesOut.Add(int64(n))
	return n, err
}

// Close closes the connection.
func (c *conn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() {
		c.g.mu.Lock()
		delete(c.g.conns, c)
		c.g.mu.Unlock()
	})
	return err
}

// cut closes the connection for the gate (a policy change refuses it, the
// sandbox stopped) and whatever was tied to it with tie. An ordinary Close
// does not run what was tied: a proxy client that moves to another target,
// or a transport dropping an idle connection, leaves the sandbox's side
// open.
func (c *conn) cut() {
	c.Close()
	if f := c.onCut.Swap(nil); f != nil {
		(*f)()
	}
}

// tie makes the gate's cutting nc (by a policy change, say) also run f,
// which closes the sandbox's side.
func tie(nc net.Conn, f func()) {
	if c, ok := nc.(*conn); ok {
		c.onCut.Store(&f)
	}
}
