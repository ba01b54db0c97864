package egress

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httputil"
	"net/netip"
	"slices"
	"strconv"
	"sync"
	"time"
)

// Swapper decides, for one sandbox, which connections its gate terminates
// and what the requests on them carry.
type Swapper interface {
	// Intercepts reports whether TLS to host:port is terminated at the gate
	// (a secret of the sandbox names host; port is 443 or any: take port as given).
	Intercepts(host string, port int) bool
	// Swap rewrites req, bound for host, in place before it goes upstream:
	// the real values for the placeholders the secrets' hosts and rules allow.
	// It is called once per request, on the request's goroutine.
	Swap(host string, req *http.Request)
}

// Refuser is a Swapper that may also answer a request itself, instead of
// sending it on: a secret's budget for the hour is spent, say.
type Refuser interface {
	// Refuse returns the answer to give the guest for req, bound for
	// host, or nil to send it on. It is called before Swap.
	Refuse(host string, req *http.Request) *Answer
}

// Answer is what a Refuser answers instead of the far end: a status (429
// unless set), when to try again, and a short text.
type Answer struct {
	Status     int
	RetryAfter time.Duration
	Message    string
}

// SetSwapper puts s in force for new connections, and for the requests
// still to come on connections already intercepted: a secret withdrawn is
// never swapped in again. Nil intercepts nothing.
func (g *Gate) SetSwapper(s Swapper) {
	if s == nil {
		g.swapper.Store(nil)
		return
	}
	g.swapper.Store(&s)
}

// SetTrusted records the PEM bundle the gate's guest is known to trust:
// its intercepted connections are answered with a leaf of the newest CA
// in the bundle (Authority.Signer). Until it is set, the oldest CA in
// force signs.
func (g *Gate) SetTrusted(bundle string) {
	g.trusted.Store(&bundle)
}

func (g *Gate) loadSwapper() Swapper {
	if p := g.swapper.Load(); p != nil {
		return *p
	}
	return nil
}

// interception returns the operator's interception settings if the gate
// terminates TLS to host:port, nil if the connection is to be piped.
func (g *Gate) interception(host string, port int) *Interception {
	ic := g.op.Intercept
	if ic == nil || ic.Authority == nil {
		return nil
	}
	s := g.loadSwapper()
	if s == nil || !s.Intercepts(host, port) {
		return nil
	}
	return ic
}

// interceptHost is the host TLS on nc (from Dial) would be terminated
// for: the name it was dialled for, a stand-in's name included, or, if
// byAddress, the address a connection asked for by address went to; ""
// if none.
func interceptHost(nc net.Conn, byAddress bool) string {
	c, ok := nc.(*conn)
	switch {
	case !ok:
		return ""
	case c.host != "":
		return c.host
	case byAddress:
		return c.addr.String()
	}
	return ""
}

const (
	// guestHandshakeTimeout bounds the guest's TLS handshake; one that
	// does not trust the CA fails at once.
	guestHandshakeTimeout = 30 * time.Second
	// upstreamHandshakeTimeout bounds the gate's own TLS handshake with
	// the real host.
	upstreamHandshakeTimeout = 15 * time.Second
	// maxUpstreamConns bounds the connections one intercepted guest
	// connection makes (HTTP/2 streams to an HTTP/1.1 host need several).
	maxUpstreamConns = 32
)

// interceptProtos are offered to the guest: HTTP/2 first, as the host
// would.
var interceptProtos = []string{"h2", "http/1.1"}

// discardLog silences net/http's own logging of guests' and hosts'
// errors: they are the sandbox's business, and the guest sees them.
var discardLog = log.New(io.Discard, "", 0)

// intercept serves gc, a guest's connection to host:port, at the gate:
// it terminates the guest's TLS with the CA's leaf for host and sends each
// request on to host itself over TLS it verifies, through the gate's
// policy, after the swapper has rewritten it. nc is the connection Dial
// already made to host; it carries the first upstream connection. It
// returns when the guest's connection ends or ctx is done.
func (g *Gate) intercept(ctx context.Context, ic *Interception, host string, port int, gc, nc net.Conn) {
	guest := &watchedConn{Conn: gc, closed: make(chan struct{})}
	defer guest.Close()
	if !g.trackGuest(guest) {
		return
	}
	defer g.untrackGuest(guest)
	ups := &upstreams{g: g, host: host, port: port, guest: guest, first: nc, open: map[*upstreamConn]struct{}{}}
	defer ups.closeAll()
	tie(nc, func() { guest.Close() })
	var trusted string
	if p := g.trusted.Load(); p != nil {
		trusted = *p
	}
	ca := ic.Authority.Signer(trusted)
	if ca == nil {
		return
	}
	leaf, err := ca.Leaf(host)
	if err != nil {
		return
	}
	tc := tls.Server(guest, &tls.Config{
		Certificates: []tls.Certificate{*leaf},
		NextProtos:   interceptProtos,
		MinVersion:   tls.VersionTLS12,
	})
	hctx, cancel := context.WithTimeout(ctx, guestHandshakeTimeout)
	err = tc.HandshakeContext(hctx)
	cancel()
	if err != nil {
		return // the guest does not trust the CA, or does not speak TLS
	}
	tr := ups.transport(ic.Roots)
	defer tr.CloseIdleConnections()
	srv := g.interceptServer(ctx, host, port, tr)
	served := make(chan struct{})
	go func() {
		defer close(served)
		_ = srv.Serve(newOneConnListener(tc))
	}()
	select {
	case <-guest.closed:
	case <-ctx.Done():
	}
	_ = srv.Close()
	guest.Close()
	<-served
}

// trackGuest adds c to the connections Close closes, unless the gate is
// closed.
func (g *Gate) trackGuest(c net.Conn) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return false
	}
	g.guests[c] = struct{}{}
	return true
}

func (g *Gate) untrackGuest(c net.Conn) {
	g.mu.Lock()
	delete(g.guests, c)
	g.mu.Unlock()
}

// interceptServer is the HTTP server of one intercepted guest connection:
// HTTP/1.1 or HTTP/2 as the guest's TLS negotiated, each request proxied
// to host:port through tr.
func (g *Gate) interceptServer(ctx context.Context, host string, port int, tr http.RoundTripper) *http.Server {
	rp := &httputil.ReverseProxy{
		Rewrite:       g.rewrite(host, port),
		Transport:     tr,
		FlushInterval: -1, // stream: events, long polls and downloads arrive as sent
		ErrorHandler:  answerUpstreamFailure,
		ErrorLog:      discardLog,
	}
	return &http.Server{
		Handler: g.refusing(host, rp),
		// Serve speaks HTTP/2 on a *tls.Conn that negotiated h2 only if
		// these name it.
		TLSConfig:         &tls.Config{NextProtos: interceptProtos},
		MaxHeaderBytes:    MaxHeaderBytes,
		ReadHeaderTimeout: time.Minute,
		IdleTimeout:       5 * time.Minute, // as the proxy waits for a next request
		ErrorLog:          discardLog,
		BaseContext:       func(net.Listener) context.Context { return ctx },
	}
}

// refusing is next, behind the swapper in force's refusals: a request a
// Refuser answers never goes upstream.
func (g *Gate) refusing(host string, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if ref, ok := g.loadSwapper().(Refuser); ok {
			if a := ref.Refuse(host, r); a != nil {
				writeAnswer(w, a)
				return
			}
		}
		next.ServeHTTP(w, r)
	})
}

func writeAnswer(w http.ResponseWriter, a *Answer) {
	status := a.Status
	if status == 0 {
		status = http.StatusTooManyRequests
	}
	if a.RetryAfter > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(int((a.RetryAfter+time.Second-1)/time.Second)))
	}
	w.Header().Set("X-Emberbox-Egress", "secret-budget")
	http.Error(w, a.Message, status)
}

// forwardedHeaders are removed by ReverseProxy before Rewrite; the guest's
// own are put back, as everything but credentials passes unchanged.
var forwardedHeaders = []string{"X-Forwarded-For", "X-Forwarded-Host", "X-Forwarded-Proto"}

// rewrite sends a request to host:port with the guest's path, query and
// Host header, and lets the swapper in force rewrite it. A request whose
// Host names another host (a shared front end would route it there) is
// sent unchanged: secrets go only to the host they name.
func (g *Gate) rewrite(host string, port int) func(*httputil.ProxyRequest) {
	target := net.JoinHostPort(host, strconv.Itoa(port))
	return func(pr *httputil.ProxyRequest) {
		out := pr.Out
		out.URL.Scheme, out.URL.Host = "https", target
		out.URL.RawQuery = pr.In.URL.RawQuery // ReverseProxy drops what it cannot parse
		for _, h := range forwardedHeaders {
			if v, ok := pr.In.Header[h]; ok {
				out.Header[h] = slices.Clone(v)
			}
		}
		if s := g.loadSwapper(); s != nil && s.Intercepts(host, port) && sameHost(out.Host, host) {
			s.Swap(host, out)
		}
	}
}

// sameHost reports whether the Host header hostport names host (a
// normalized name or canonical address), whatever port it gives.
func sameHost(hostport, host string) bool {
	h, _, err := net.SplitHostPort(hostport)
	if err != nil {
		h = hostport
		if len(h) > 1 && h[0] == '[' && h[len(h)-1] == ']' {
			h = h[1 : len(h)-1]
		}
	}
	if a, err := netip.ParseAddr(h); err == nil {
		return a.Zone() == "" && a.Unmap().String() == host
	}
	return h != "" && normalizeHost(h) == host
}

// answerUpstreamFailure answers a request that got no response from the
// host: 403 with the reason if the gate refused a new connection to it,
// 502 otherwise, saying only what kind of failure it was.
func answerUpstreamFailure(w http.ResponseWriter, _ *http.Request, err error) {
	code, msg := http.StatusBadGateway, "upstream: "+upstreamFailure(err)
	h := w.Header()
	if r, ok := AsRefusal(err); ok {
		code, msg = http.StatusForbidden, r.Error()
		h.Set(Header, string(r.Reason))
	}
	h.Set("Content-Type", "text/plain; charset=utf-8")
	w.WriteHeader(code)
	_, _ = io.WriteString(w, msg+"\n")
}

// upstreamFailure is what a guest is told of a request that failed.
func upstreamFailure(err error) string {
	var cv *tls.CertificateVerificationError
	var ua x509.UnknownAuthorityError
	var he x509.HostnameError
	switch {
	case errors.As(err, &cv), errors.As(err, &ua), errors.As(err, &he):
		return "certificate not trusted"
	case errors.Is(err, context.Canceled):
		return "request canceled"
	}
	return dialFailure(err)
}

// upstreams are the connections to host:port of one intercepted guest
// connection: first the one dialled when the guest connected, then more
// dialled through the gate, which checks the policy again, as the
// transport needs them. All are closed when the guest's connection ends,
// and the gate's cutting any of them closes the guest's.
type upstreams struct {
	g     *Gate
	host  string
	port  int
	guest net.Conn

	mu     sync.Mutex
	first  net.Conn // not yet handed to the transport
	open   map[*upstreamConn]struct{}
	closed bool
}

// transport is the HTTP client of the upstreams: TLS verified with roots
// (nil: the host's) for host, HTTP/2 if the host offers it, no proxy, no
// response header timeout (long polls), no compression of its own (the
// guest's Accept-Encoding passes as sent).
func (u *upstreams) transport(roots *x509.CertPool) *http.Transport {
	return &http.Transport{
		DialContext:            u.dial,
		TLSClientConfig:        &tls.Config{ServerName: u.host, RootCAs: roots, MinVersion: tls.VersionTLS12},
		TLSHandshakeTimeout:    upstreamHandshakeTimeout,
		ForceAttemptHTTP2:      true,
		IdleConnTimeout:        90 * time.Second,
		ExpectContinueTimeout:  time.Second,
		DisableCompression:     true,
		MaxResponseHeaderBytes: MaxHeaderBytes,
		MaxConnsPerHost:        maxUpstreamConns,
		MaxIdleConnsPerHost:    maxUpstreamConns,
	}
}

// dial gives the transport the connection made when the guest connected,
// then new ones to host:port through the gate; the address the transport
// asks for is always host:port, as the request's URL names it.
func (u *upstreams) dial(ctx context.Context, _, _ string) (net.Conn, error) {
	u.mu.Lock()
	nc := u.first
	u.first = nil
	u.mu.Unlock()
	if nc == nil {
		var err error
		if nc, err = u.g.Dial(ctx, u.host, u.port); err != nil {
			return nil, err
		}
		guest := u.guest
		tie(nc, func() { guest.Close() })
	}
	uc := &upstreamConn{Conn: nc, u: u}
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.closed {
		nc.Close()
		return nil, net.ErrClosed
	}
	u.open[uc] = struct{}{}
	return uc, nil
}

// closeAll closes every upstream connection, the unused first one too,
// and any dialled later.
func (u *upstreams) closeAll() {
	u.mu.Lock()
	u.closed = true
	cs := make([]net.Conn, 0, len(u.open)+1)
	if u.first != nil {
		cs = append(cs, u.first)
		u.first = nil
	}
	for c := range u.open {
		cs = append(cs, c)
	}
	u.mu.Unlock()
	for _, c := range cs {
		c.Close()
	}
}

// upstreamConn is an upstream connection that leaves its set when closed.
type upstreamConn struct {
	net.Conn
	u    *upstreams
	once sync.Once
}

func (c *upstreamConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() {
		c.u.mu.Lock()
		delete(c.u.open, c)
		c.u.mu.Unlock()
	})
	return err
}

// readerConn is a connection whose reads come from r, which holds bytes
// already read from it.
type readerConn struct {
	net.Conn
	r io.Reader
}

func (c *readerConn) Read(b []byte) (int, error) { return c.r.Read(b) }

// watchedConn is a connection that says when it was closed: by the HTTP
// server when the guest is done, by a handler that took it over for an
// upgrade when that ends, or by the gate.
type watchedConn struct {
	net.Conn
	once   sync.Once
	closed chan struct{}
}

func (c *watchedConn) Close() error {
	c.once.Do(func() { close(c.closed) })
	return c.Conn.Close()
}

// oneConnListener hands an http.Server one connection, then waits until it
// is closed.
type oneConnListener struct {
	conn chan net.Conn
	done chan struct{}
	once sync.Once
	addr net.Addr
}

func newOneConnListener(c net.Conn) *oneConnListener {
	l := &oneConnListener{conn: make(chan net.Conn, 1), done: make(chan struct{}), addr: c.LocalAddr()}
	l.conn <- c
	return l
}

func (l *oneConnListener) Accept() (net.Conn, error) {
	select {
	case <-l.done:
		return nil, net.ErrClosed
	case c := <-l.conn:
		return c, nil
	}
}

func (l *oneConnListener) Close() error {
	l.once.Do(func() { close(l.done) })
	return nil
}

func (l *oneConnListener) Addr() net.Addr { return l.addr }
