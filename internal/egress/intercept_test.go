package egress

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"net/netip"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// testSwapper intercepts the hosts it lists and swaps PLACEHOLDER for
// real-value in the Authorization header only.
type testSwapper struct {
	hosts map[string]bool
}

func (s *testSwapper) Intercepts(host string, port int) bool { return s.hosts[host] }

func (s *testSwapper) Swap(host string, req *http.Request) {
	if a := req.Header.Get("Authorization"); strings.Contains(a, "PLACEHOLDER") {
		req.Header.Set("Authorization", strings.ReplaceAll(a, "PLACEHOLDER", "real-value"))
	}
}

// upstreamTLS serves every name a client asks for with a leaf of ca (and
// requests without a name with one for 127.0.0.1), as a real host with a
// certificate from a public CA would.
func upstreamTLS(t testing.TB, ca *CA) *tls.Config {
	ipLeaf, err := ca.Leaf("127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	return &tls.Config{
		Certificates: []tls.Certificate{*ipLeaf},
		GetCertificate: func(hello *tls.ClientHelloInfo) (*tls.Certificate, error) {
			return ca.Leaf(hello.ServerName)
		},
		NextProtos: []string{"h2", "http/1.1"},
	}
}

// startUpstream starts an HTTPS server (HTTP/2 and HTTP/1.1) with
// certificates from ca.
func startUpstream(t testing.TB, ca *CA, h http.Handler) *httptest.Server {
	srv := httptest.NewUnstartedServer(h)
	srv.EnableHTTP2 = true
	srv.TLS = upstreamTLS(t, ca)
	srv.Config.ErrorLog = discardLog // handshakes the gate refuses to finish
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return srv
}

func mustCA(t testing.TB) *CA {
	ca, err := NewCA()
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

func pool(cas ...*CA) *x509.CertPool {
	p := x509.NewCertPool()
	for _, ca := range cas {
		p.AddCert(ca.Certificate())
	}
	return p
}

// interceptEnv is a gate whose operator intercepts with gateCA and trusts
// hosts with certificates of upCA, and whose swapper intercepts api.test,
// untrusted.test and 127.0.0.1 (not plain.test); all of them are loopback
// servers.
type interceptEnv struct {
	*testEnv
	gateCA, upCA *CA
	swapper      *testSwapper
	up           *httptest.Server // api.test, plain.test, 127.0.0.1
	port         string
	reached      atomic.Int64  // requests the upstream handler saw
	release      chan struct{} // lets /stream send its second part
}

func newInterceptEnv(t testing.TB) *interceptEnv {
	e := &interceptEnv{gateCA: mustCA(t), upCA: mustCA(t), release: make(chan struct{}),
		swapper: &testSwapper{hosts: map[string]bool{"api.test": true, "untrusted.test": true, "127.0.0.1": true}}}
	e.up = startUpstream(t, e.upCA, e.handler())
	_, e.port, _ = net.SplitHostPort(e.up.Listener.Addr().String())
	lo := "127.0.0.1"
	e.testEnv = newTestEnv(t, Policy{Internet: true}, map[string]string{"api.test": lo, "plain.test": lo, "untrusted.test": lo},
		func(o *Operator) { o.Intercept = &Interception{Authority: NewAuthority(e.gateCA), Roots: pool(e.upCA)} })
	e.gate.SetSwapper(e.swapper)
	return e
}

// handler answers /echo with what it received, /stream in two parts (the
// second once the test releases it), and /ws with an upgrade that echoes.
func (e *interceptEnv) handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/echo", func(w http.ResponseWriter, r *http.Request) {
		e.reached.Add(1)
		body, _ := io.ReadAll(r.Body)
		fmt.Fprintf(w, "auth=%s\nquery=%s\nbody=%s\nother=%s\nproto=%d\nhost=%s\nremote=%s\n",
			r.Header.Get("Authorization"), r.URL.RawQuery, body, r.Header.Get("X-Other"), r.ProtoMajor, r.Host, r.RemoteAddr)
	})
	mux.HandleFunc("/stream", func(w http.ResponseWriter, r *http.Request) {
		e.reached.Add(1)
		fmt.Fprint(w, "one\n")
		http.NewResponseController(w).Flush()
		select {
		case <-e.release:
			fmt.Fprint(w, "two\n")
		case <-time.After(5 * time.Second):
			fmt.Fprint(w, "timeout\n")
		}
	})
	mux.HandleFunc("/big", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", strconv.Itoa(len(bigBody)))
		w.Write(bigBody)
	})
	mux.HandleFunc("/ws", func(w http.ResponseWriter, r *http.Request) {
		e.reached.Add(1)
		c, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer c.Close()
		fmt.Fprintf(c, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nX-Auth: %s\r\n\r\n", r.Header.Get("Authorization"))
		_, _ = io.Copy(c, brw)
	})
	return mux
}

// client is the guest's: through the gate's CONNECT proxy, trusting the
// gate's CA (and the upstream's, to see what is not intercepted), HTTP/2
// if h2.
func (e *interceptEnv) client(h2 bool) *http.Client {
	tr := &http.Transport{Proxy: http.ProxyURL(e.proxyURL), ForceAttemptHTTP2: h2,
		TLSClientConfig: &tls.Config{RootCAs: pool(e.gateCA, e.upCA)}}
	return &http.Client{Transport: tr, Timeout: 10 * time.Second}
}

func (e *interceptEnv) url(host, path string) string {
	return "https://" + net.JoinHostPort(host, e.port) + path
}

// get sends GET url with the placeholder in Authorization and returns the
// response and its body.
func get(t *testing.T, c *http.Client, url string, edit ...func(*http.Request)) (*http.Response, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, url, nil)
	req.Header.Set("Authorization", "Bearer PLACEHOLDER")
	for _, f := range edit {
		f(req)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: reading body: %v", url, err)
	}
	return resp, string(body)
}

func TestInterceptSwapsCredentialOnly(t *testing.T) {
	e := newInterceptEnv(t)
	req, _ := http.NewRequest(http.MethodPost, e.url("api.test", "/echo?q=PLACEHOLDER;x=1"), strings.NewReader("body PLACEHOLDER"))
	req.Header.Set("Authorization", "Bearer PLACEHOLDER")
	req.Header.Set("X-Other", "PLACEHOLDER")
	resp, err := e.client(true).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if req.Header.Get("Authorization") != "Bearer PLACEHOLDER" {
		t.Fatal("the client's own request was changed")
	}
	for _, want := range []string{"auth=Bearer real-value\n", "query=q=PLACEHOLDER;x=1\n", "body=body PLACEHOLDER\n",
		"other=PLACEHOLDER\n", "proto=2\n", "host=api.test:" + e.port + "\n"} {
		if !strings.Contains(string(body), want) {
			t.Errorf("upstream saw\n%s\nwant %q", body, want)
		}
	}
	if resp.ProtoMajor != 2 {
		t.Errorf("guest to gate: HTTP/%d, want HTTP/2", resp.ProtoMajor)
	}
	if got := resp.TLS.PeerCertificates[0]; got.Issuer.CommonName != caCommonName || got.DNSNames[0] != "api.test" {
		t.Errorf("guest saw a certificate for %v from %q, want the gate's leaf for api.test", got.DNSNames, got.Issuer.CommonName)
	}
	if c := e.gate.Counters(); c.BytesIn == 0 || c.BytesOut == 0 || c.Dials != 1 {
		t.Errorf("counters = %+v, want bytes both ways and one dial", c)
	}
}

// TestInterceptHostHeaderElsewhere: a request on an intercepted connection
// whose Host names another host is sent as it is, without the secret.
func TestInterceptHostHeaderElsewhere(t *testing.T) {
	e := newInterceptEnv(t)
	_, body := get(t, e.client(true), e.url("api.test", "/echo"), func(r *http.Request) { r.Host = "elsewhere.test" })
	if !strings.Contains(body, "auth=Bearer PLACEHOLDER\n") || !strings.Contains(body, "host=elsewhere.test\n") {
		t.Errorf("upstream saw\n%s\nwant the placeholder and Host elsewhere.test", body)
	}
}

func TestInterceptHTTP1KeepAlive(t *testing.T) {
	e := newInterceptEnv(t)
	c := e.client(false)
	var reused []bool
	var remotes []string
	for range 2 {
		trace := &httptrace.ClientTrace{GotConn: func(i httptrace.GotConnInfo) { reused = append(reused, i.Reused) }}
		resp, body := get(t, c, e.url("api.test", "/echo"), func(r *http.Request) {
			*r = *r.WithContext(httptrace.WithClientTrace(r.Context(), trace))
		})
		if resp.ProtoMajor != 1 || !strings.Contains(body, "auth=Bearer real-value\n") {
			t.Fatalf("HTTP/%d, upstream saw\n%s", resp.ProtoMajor, body)
		}
		remotes = append(remotes, body[strings.Index(body, "remote="):])
	}
	if len(reused) != 2 || reused[0] || !reused[1] {
		t.Errorf("connection reused: %v, want [false true]", reused)
	}
	if remotes[0] != remotes[1] || e.dials.Load() != 1 {
		t.Errorf("upstream connections: %q, %d dials; want the first one twice", remotes, e.dials.Load())
	}
}

func TestInterceptStreams(t *testing.T) {
	e := newInterceptEnv(t)
	for _, h2 := range []bool{true, false} {
		resp, err := e.client(h2).Get(e.url("api.test", "/stream"))
		if err != nil {
			t.Fatal(err)
		}
		br := bufio.NewReader(resp.Body)
		first, err := br.ReadString('\n')
		select {
		case e.release <- struct{}{}:
		case <-time.After(5 * time.Second):
		}
		rest, _ := io.ReadAll(br)
		resp.Body.Close()
		if first != "one\n" || err != nil || string(rest) != "two\n" {
			t.Errorf("h2 %v: read %q (%v) then %q, want one before the upstream sent two", h2, first, err, rest)
		}
	}
}

func TestInterceptUpgrade(t *testing.T) {
	e := newInterceptEnv(t)
	tc, br := e.connectTLS(t, "api.test", []string{"http/1.1"}, pool(e.gateCA))
	defer tc.Close()
	fmt.Fprintf(tc, "GET /ws HTTP/1.1\r\nHost: api.test\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nAuthorization: Bearer PLACEHOLDER\r\n\r\n")
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusSwitchingProtocols || resp.Header.Get("X-Auth") != "Bearer real-value" {
		t.Fatalf("upgrade: %d, upstream saw %q", resp.StatusCode, resp.Header.Get("X-Auth"))
	}
	for _, msg := range []string{"ping\n", "PLACEHOLDER pong\n"} {
		io.WriteString(tc, msg)
		got, err := br.ReadString('\n')
		if got != msg || err != nil {
			t.Errorf("echo of %q: %q %v", msg, got, err)
		}
	}
}

// connectTLS opens a CONNECT tunnel to host's upstream port through the
// gate and starts TLS on it, trusting roots.
func (e *interceptEnv) connectTLS(t *testing.T, host string, protos []string, roots *x509.CertPool) (*tls.Conn, *bufio.Reader) {
	t.Helper()
	return e.connectTLSTo(t, host, e.port, protos, roots)
}

func (e *interceptEnv) connectTLSTo(t *testing.T, host, port string, protos []string, roots *x509.CertPool) (*tls.Conn, *bufio.Reader) {
	t.Helper()
	c, err := net.Dial("tcp", e.proxyURL.Host)
	if err != nil {
		t.Fatal(err)
	}
	c.SetDeadline(time.Now().Add(10 * time.Second))
	target := net.JoinHostPort(host, port)
	fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", target, target)
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("CONNECT %s: %v %v", target, resp, err)
	}
	tc := tls.Client(&bufConn{c, br}, &tls.Config{ServerName: host, RootCAs: roots, NextProtos: protos})
	if err := tc.Handshake(); err != nil {
		c.Close()
		t.Fatalf("TLS with %s: %v", host, err)
	}
	return tc, bufio.NewReader(tc)
}

// TestInterceptNotNamedIsPiped: a host the swapper does not name, or any
// host with no swapper, is piped: the guest talks TLS with the host itself.
func TestInterceptNotNamedIsPiped(t *testing.T) {
	e := newInterceptEnv(t)
	own, err := e.upCA.Leaf("plain.test")
	if err != nil {
		t.Fatal(err)
	}
	resp, body := get(t, e.client(true), e.url("plain.test", "/echo"))
	if !resp.TLS.PeerCertificates[0].Equal(own.Leaf) || !strings.Contains(body, "auth=Bearer PLACEHOLDER\n") {
		t.Errorf("plain.test: certificate from %q, upstream saw\n%s\nwant the upstream's own and the placeholder",
			resp.TLS.PeerCertificates[0].Issuer.CommonName, body)
	}
	e.gate.SetSwapper(nil)
	own, _ = e.upCA.Leaf("api.test")
	resp, body = get(t, e.client(true), e.url("api.test", "/echo"))
	if !resp.TLS.PeerCertificates[0].Equal(own.Leaf) || !strings.Contains(body, "auth=Bearer PLACEHOLDER\n") {
		t.Errorf("no swapper: upstream saw\n%s\nwant the upstream's own certificate and the placeholder", body)
	}
}

// TestInterceptUntrustedUpstream: the gate does not send a request, let
// alone a secret, to a host whose certificate it cannot verify.
func TestInterceptUntrustedUpstream(t *testing.T) {
	e := newInterceptEnv(t)
	other := startUpstream(t, mustCA(t), e.handler()) // a CA the gate does not trust
	_, p, _ := net.SplitHostPort(other.Listener.Addr().String())
	resp, body := get(t, e.client(true), "https://untrusted.test:"+p+"/echo")
	if resp.StatusCode != http.StatusBadGateway || !strings.Contains(body, "certificate") {
		t.Errorf("got %d %q, want 502 naming the certificate", resp.StatusCode, body)
	}
	// Swap rewrote the outgoing request before the transport had a
	// connection; the transport sends nothing on one it did not verify.
	if n := e.reached.Load(); n != 0 {
		t.Errorf("upstream reached %d times, want none", n)
	}

	// The gate's closing (the sandbox stopped) cuts an intercepted
	// connection that has no upstream connection open.
	tc, br := e.connectTLSTo(t, "untrusted.test", p, []string{"http/1.1"}, pool(e.gateCA))
	defer tc.Close()
	fmt.Fprintf(tc, "GET /echo HTTP/1.1\r\nHost: untrusted.test\r\n\r\n")
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != http.StatusBadGateway {
		t.Fatalf("raw request: %v %v", resp, err)
	}
	io.Copy(io.Discard, resp.Body)
	e.gate.Close()
	if _, err := br.ReadByte(); err == nil {
		t.Error("intercepted connection still open after the gate closed")
	}
}

// TestInterceptCaptured: a captured connection to api.test's stand-in is
// intercepted; one to a raw address never is.
func TestInterceptCaptured(t *testing.T) {
	e := newInterceptEnv(t)
	standIn, _ := e.gate.fakeAddr("api.test")
	p, _ := strconv.Atoi(e.port)
	capture := func(dst netip.AddrPort, name string, roots *x509.CertPool) (*http.Response, string) {
		c1, c2 := net.Pipe()
		done := make(chan struct{})
		go func() {
			defer close(done)
			e.gate.ServeTCP(context.Background(), dst, c2, nil, func(error) error { return nil })
		}()
		tr := &http.Transport{ForceAttemptHTTP2: true, TLSClientConfig: &tls.Config{ServerName: name, RootCAs: roots},
			DialContext: func(context.Context, string, string) (net.Conn, error) { return c1, nil }}
		resp, body := get(t, &http.Client{Transport: tr, Timeout: 10 * time.Second}, e.url(name, "/echo"))
		tr.CloseIdleConnections()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			t.Errorf("%s: ServeTCP still running after the guest closed", name)
		}
		if n := e.gate.Counters().Open; n != 0 {
			t.Errorf("%s: %d upstream connections still open", name, n)
		}
		return resp, body
	}
	resp, body := capture(netip.AddrPortFrom(standIn, uint16(p)), "api.test", pool(e.gateCA))
	if !strings.Contains(body, "auth=Bearer real-value\n") || resp.ProtoMajor != 2 {
		t.Errorf("captured api.test: HTTP/%d, upstream saw\n%s", resp.ProtoMajor, body)
	}
	own, _ := e.upCA.Leaf("127.0.0.1")
	resp, body = capture(netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), uint16(p)), "127.0.0.1", pool(e.upCA))
	if !resp.TLS.PeerCertificates[0].Equal(own.Leaf) || !strings.Contains(body, "auth=Bearer PLACEHOLDER\n") {
		t.Errorf("captured 127.0.0.1: upstream saw\n%s\nwant it piped", body)
	}
}

// TestInterceptAddressByConnect: CONNECT to an address the swapper names
// is intercepted with a leaf for the address.
func TestInterceptAddressByConnect(t *testing.T) {
	e := newInterceptEnv(t)
	resp, body := get(t, e.client(true), e.url("127.0.0.1", "/echo"))
	if leaf := resp.TLS.PeerCertificates[0]; leaf.Issuer.CommonName != caCommonName || len(leaf.IPAddresses) != 1 ||
		!strings.Contains(body, "auth=Bearer real-value\n") {
		t.Errorf("127.0.0.1: leaf from %q for %v, upstream saw\n%s", leaf.Issuer.CommonName, leaf.IPAddresses, body)
	}
}

// TestInterceptPolicyCut: a policy that refuses the host cuts the guest's
// intercepted connection, and no new upstream connection is made for it.
func TestInterceptPolicyCut(t *testing.T) {
	e := newInterceptEnv(t)
	tc, br := e.connectTLS(t, "api.test", []string{"http/1.1"}, pool(e.gateCA))
	defer tc.Close()
	fmt.Fprintf(tc, "GET /echo HTTP/1.1\r\nHost: api.test\r\n\r\n")
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("first request: %v %v", resp, err)
	}
	io.Copy(io.Discard, resp.Body)
	e.gate.SetPolicy(MustCompile(Policy{Internet: true, Deny: []string{"api.test"}}), 2)
	fmt.Fprintf(tc, "GET /echo HTTP/1.1\r\nHost: api.test\r\n\r\n")
	if resp, err := http.ReadResponse(br, nil); err == nil {
		t.Errorf("after the cut: %d, want the connection closed", resp.StatusCode)
	}
	if n := e.reached.Load(); n != 1 {
		t.Errorf("upstream reached %d times, want 1", n)
	}
}

// TestInterceptRedialChecked: a new upstream connection for an
// intercepted guest connection is checked against the policy in force.
func TestInterceptRedialChecked(t *testing.T) {
	e := newInterceptEnv(t)
	// An HTTP/1.1 host that closes its connection after each response.
	once := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Connection", "close")
		fmt.Fprint(w, "auth=", r.Header.Get("Authorization"))
	}))
	once.TLS = upstreamTLS(t, e.upCA)
	once.TLS.NextProtos = []string{"http/1.1"}
	once.StartTLS()
	defer once.Close()
	_, p, _ := net.SplitHostPort(once.Listener.Addr().String())
	c := e.client(true)
	if resp, body := get(t, c, "https://api.test:"+p+"/"); resp.StatusCode != 200 || body != "auth=Bearer real-value" {
		t.Fatalf("first request: %d %q", resp.StatusCode, body)
	}
	// Once the host's connection is gone there is nothing for the change
	// to cut.
	for deadline := time.Now().Add(5 * time.Second); e.gate.Counters().Open != 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the upstream connection stays open")
		}
	}
	e.gate.SetPolicy(MustCompile(Policy{Internet: true, Deny: []string{"api.test"}}), 2)
	resp, body := get(t, c, "https://api.test:"+p+"/")
	if resp.StatusCode != http.StatusForbidden || resp.Header.Get(Header) != string(ReasonRuleNotAllowed) || resp.ProtoMajor != 2 {
		t.Errorf("after the change: HTTP/%d %d %q (%s), want 403 rule-not-allowed on the same connection",
			resp.ProtoMajor, resp.StatusCode, body, resp.Header.Get(Header))
	}
	if d := e.dials.Load(); d != 1 {
		t.Errorf("%d dials, want 1", d)
	}
}

// TestProxySwitchTargets: closing the upstream of one target to go to
// another leaves the client's connection open.
func TestProxySwitchTargets(t *testing.T) {
	hello := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "hello from "+r.Host) })
	plain := httptest.NewServer(hello)
	defer plain.Close()
	env := newTestEnv(t, Policy{Internet: true}, map[string]string{"a.test": "127.0.0.1", "b.test": "127.0.0.1"})
	c, err := net.Dial("tcp", env.proxyURL.Host)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	br := bufio.NewReader(c)
	for _, host := range []string{"a.test", "b.test"} {
		target := host + ":" + port(t, plain)
		fmt.Fprintf(c, "POST http://%s/ HTTP/1.1\r\nHost: %s\r\nContent-Length: 0\r\n\r\n", target, target)
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("%s: %v", host, err)
		}
		body, _ := io.ReadAll(resp.Body)
		if !strings.HasPrefix(string(body), "hello from "+host) {
			t.Errorf("%s: %q", host, body)
		}
	}
}

func TestCALeaf(t *testing.T) {
	ca := mustCA(t)
	a, err := ca.Leaf("API.test.")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := ca.Leaf("api.test")
	if a != b {
		t.Error("Leaf returned a new certificate for the same host")
	}
	opts := x509.VerifyOptions{DNSName: "api.test", Roots: pool(ca), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	if _, err := a.Leaf.Verify(opts); err != nil {
		t.Errorf("leaf does not verify: %v", err)
	}
	if d := time.Until(a.Leaf.NotAfter); d < 6*24*time.Hour || d > leafValidity {
		t.Errorf("leaf valid for %v more", d)
	}
	ip, err := ca.Leaf("::ffff:192.0.2.1")
	if err != nil || len(ip.Leaf.IPAddresses) != 1 || !ip.Leaf.IPAddresses[0].Equal(net.ParseIP("192.0.2.1")) || len(ip.Leaf.DNSNames) != 0 {
		t.Errorf("IP leaf: %v %v", ip, err)
	}
	for _, bad := range []string{"", "*.api.test", "a b", "fe80::1%eth0", strings.Repeat("a", 300)} {
		if _, err := ca.Leaf(bad); err == nil {
			t.Errorf("Leaf(%q) made a certificate", bad)
		}
	}
	c := ca.Certificate()
	if !c.IsCA || c.MaxPathLen != 0 || !c.MaxPathLenZero || c.Subject.CommonName != caCommonName || c.KeyUsage != x509.KeyUsageCertSign {
		t.Errorf("CA certificate: %+v", c)
	}
	// Expiring leaves are renewed; the cache is bounded.
	ca.mu.Lock()
	ca.leaves["api.test"].Value.(*leafEntry).cert.Leaf.NotAfter = time.Now().Add(time.Hour)
	ca.mu.Unlock()
	if c, _ := ca.Leaf("api.test"); c == a {
		t.Error("a leaf about to expire was not renewed")
	}
	for i := range maxLeaves + 10 {
		if _, err := ca.Leaf(fmt.Sprintf("h%d.test", i)); err != nil {
			t.Fatal(err)
		}
	}
	if n := ca.lru.Len(); n != maxLeaves || len(ca.leaves) != maxLeaves {
		t.Errorf("cache holds %d (%d), want %d", n, len(ca.leaves), maxLeaves)
	}
}

func TestCAPEMRoundTrip(t *testing.T) {
	ca := mustCA(t)
	certPEM, keyPEM := ca.PEM()
	if !strings.Contains(string(keyPEM), "-----BEGIN PRIVATE KEY-----") || string(certPEM) != ca.CertPEM() {
		t.Fatalf("PEM: %s", keyPEM[:30])
	}
	back, err := LoadCA(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	if !back.Certificate().Equal(ca.Certificate()) {
		t.Error("certificate changed")
	}
	leaf, err := back.Leaf("api.test")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := leaf.Leaf.Verify(x509.VerifyOptions{DNSName: "api.test", Roots: pool(ca)}); err != nil {
		t.Errorf("a leaf of the loaded CA does not verify with the original: %v", err)
	}
	_, otherKey := mustCA(t).PEM()
	if _, err := LoadCA(certPEM, otherKey); err == nil {
		t.Error("LoadCA took another CA's key")
	}
	if _, err := LoadCA(keyPEM, certPEM); err == nil {
		t.Error("LoadCA took its arguments swapped")
	}
}

// refusingSwapper is testSwapper that answers /echo?limited itself.
type refusingSwapper struct{ testSwapper }

func (s *refusingSwapper) Refuse(host string, req *http.Request) *Answer {
	if req.URL.RawQuery == "limited" {
		return &Answer{RetryAfter: 1500 * time.Millisecond, Message: "spent"}
	}
	return nil
}

// TestInterceptRefuser: a request a Refuser answers gets its answer (429,
// Retry-After in whole seconds, the reason header) and never goes
// upstream; the next one on the same connection does.
func TestInterceptRefuser(t *testing.T) {
	e := newInterceptEnv(t)
	e.gate.SetSwapper(&refusingSwapper{testSwapper: *e.swapper})
	c := e.client(true)
	resp, body := get(t, c, e.url("api.test", "/echo?limited"))
	if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") != "2" ||
		resp.Header.Get("X-Emberbox-Egress") != "secret-budget" || !strings.Contains(body, "spent") {
		t.Errorf("refused request: %d %v %q", resp.StatusCode, resp.Header, body)
	}
	if n := e.reached.Load(); n != 0 {
		t.Errorf("the upstream saw %d requests, want none", n)
	}
	if resp, body := get(t, c, e.url("api.test", "/echo")); resp.StatusCode != http.StatusOK || !strings.Contains(body, "auth=Bearer real-value") {
		t.Errorf("the next request: %d %q", resp.StatusCode, body)
	}
}
