package egress

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/net/dns/dnsmessage"
)

func TestCompile(t *testing.T) {
	for _, tc := range []struct {
		in      string
		want    string
		wantErr bool
	}{
		{"pypi.org", "pypi.org", false},
		{"PyPI.org.", "pypi.org", false},
		{"*.pythonhosted.org", "*.pythonhosted.org", false},
		{"1.2.3.4", "1.2.3.4", false},
		{"::ffff:1.2.3.4", "1.2.3.4", false},
		{"10.1.2.3/8", "10.0.0.0/8", false},
		{"2001:db8::/32", "2001:db8::/32", false},
		{"[2001:db8::1]", "2001:db8::1", false},
		{"1.2.3.4.", "1.2.3.4", false}, // an address, as the gate reads the host "1.2.3.4."
		{"::ffff:10.0.0.0/104", "10.0.0.0/8", false},
		{"", "", true},
		{"*", "", true},
		{"a..b", "", true},
		{"-a.com", "", true},
		{"http://x.com", "", true},
		{"x.com:443", "", true},
		{"1.2.3.4/33", "", true},
		{"fe80::1%eth0", "", true},
		{"**.x.com", "", true},
	} {
		c, err := Compile(Policy{Internet: true, Allow: []string{tc.in}})
		if (err != nil) != tc.wantErr {
			t.Errorf("Compile(%q) err = %v, want error %v", tc.in, err, tc.wantErr)
			continue
		}
		if err == nil && c.Allow[0] != tc.want {
			t.Errorf("Compile(%q) = %q, want %q", tc.in, c.Allow[0], tc.want)
		}
		if err != nil {
			var re *RuleError
			if !errors.As(err, &re) || re.Path != "allow[0]" {
				t.Errorf("Compile(%q) err = %v, want a RuleError at allow[0]", tc.in, err)
			}
		}
	}
}

func TestCheckName(t *testing.T) {
	pol := MustCompile(Policy{Internet: true, Allow: []string{"pypi.org", "*.pythonhosted.org", "good.test"}, Deny: []string{"evil.pypi.org", "*.bad.pythonhosted.org"}})
	open := MustCompile(Policy{Internet: true, Deny: []string{"bad.test"}})
	off := MustCompile(Policy{Internet: false, Allow: []string{"pypi.org"}})
	for _, tc := range []struct {
		pol  *Compiled
		host string
		want Reason // "" = allowed
	}{
		{pol, "pypi.org", ""},
		{pol, "PYPI.ORG.", ""},
		{pol, "www.pypi.org", ReasonRuleNotAllowed}, // apex rule does not admit subdomains
		{pol, "files.pythonhosted.org", ""},
		{pol, "a.b.pythonhosted.org", ""},
		{pol, "pythonhosted.org", ReasonRuleNotAllowed}, // subdomain rule does not admit the apex
		{pol, "xpythonhosted.org", ReasonRuleNotAllowed},
		{pol, "evil.pypi.org", ReasonRuleNotAllowed},
		{pol, "x.bad.pythonhosted.org", ReasonRuleNotAllowed}, // deny wins
		{pol, "registry.npmjs.org", ReasonRuleNotAllowed},
		{open, "anything.example", ""},
		{open, "bad.test", ReasonRuleNotAllowed},
		{off, "pypi.org", ReasonInternetOff},
	} {
		err := tc.pol.CheckName(tc.host)
		got := Reason("")
		if r, ok := AsRefusal(err); ok {
			got = r.Reason
		}
		if got != tc.want {
			t.Errorf("%v CheckName(%q) = %q, want %q", tc.pol.Policy, tc.host, got, tc.want)
		}
	}
}

func TestForbidden(t *testing.T) {
	op := NewOperator(Operator{HostAddrs: []netip.Addr{netip.MustParseAddr("203.0.113.7")}})
	opened := NewOperator(Operator{HostAddrs: []netip.Addr{}, Open: []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32"), netip.MustParsePrefix("10.9.0.0/16")}})
	for _, tc := range []struct {
		op   *Operator
		addr string
		want bool
	}{
		{op, "127.0.0.1", true},
		{op, "127.0.0.2", true},
		{op, "10.0.0.1", true},
		{op, "172.16.5.4", true},
		{op, "172.32.0.1", false},
		{op, "192.168.1.1", true},
		{op, "169.254.169.254", true},
		{op, "100.64.0.1", true},
		{op, "100.128.0.1", false},
		{op, "224.0.0.1", true},
		{op, "255.255.255.255", true},
		{op, "0.0.0.0", true},
		{op, "203.0.113.7", true}, // the host's own address
		{op, "93.184.216.34", false},
		{op, "8.8.8.8", false},
		{op, "::", true},
		{op, "::1", true},
		{op, "::ffff:127.0.0.1", true},
		{op, "::ffff:169.254.169.254", true},
		{op, "::ffff:10.0.0.1", true},
		{op, "::127.0.0.1", true}, // IPv4-compatible
		{op, "fd00::1", true},
		{op, "fc00::1", true},
		{op, "fe80::1", true},
		{op, "ff02::1", true},
		{op, "64:ff9b::a00:1", true},   // NAT64 of 10.0.0.1
		{op, "2002:a00:1::1", true},    // 6to4 of 10.0.0.1
		{op, "2606:4700::1111", false}, // public
		{op, "2001:4860:4860::8888", false},
		{opened, "127.0.0.1", false},
		{opened, "::ffff:127.0.0.1", false},
		{opened, "127.0.0.2", true},
		{opened, "10.9.1.1", false},
		{opened, "10.8.1.1", true},
		{opened, "::1", true},
	} {
		if got := tc.op.Forbidden(netip.MustParseAddr(tc.addr)); got != tc.want {
			t.Errorf("Forbidden(%s) = %v, want %v (open %v)", tc.addr, got, tc.want, tc.op.Open)
		}
	}
	api := NewOperator(Operator{HostAddrs: []netip.Addr{netip.MustParseAddr("203.0.113.7")}, Open: []netip.Prefix{netip.MustParsePrefix("0.0.0.0/0")},
		Closed: []netip.AddrPort{netip.MustParseAddrPort("127.0.0.1:8080"), netip.MustParseAddrPort("[::]:9090")}})
	for _, tc := range []struct {
		addr string
		want bool
	}{
		{"127.0.0.1:8080", true}, {"127.0.0.1:8081", false}, {"127.0.0.2:8080", false},
		{"127.0.0.5:9090", true}, {"203.0.113.7:9090", true}, {"[::ffff:127.0.0.1]:8080", true}, {"8.8.8.8:9090", false},
	} {
		ap := netip.MustParseAddrPort(tc.addr)
		if got := api.closed(ap.Addr(), int(ap.Port())); got != tc.want {
			t.Errorf("closed(%s) = %v, want %v", tc.addr, got, tc.want)
		}
	}
	for port, want := range map[int]bool{25: true, 465: true, 587: true, 443: false, 80: false, 0: true, 70000: true} {
		if got := op.PortForbidden(port); got != want {
			t.Errorf("PortForbidden(%d) = %v, want %v", port, got, want)
		}
	}
}

func TestCheckAddr(t *testing.T) {
	pol := MustCompile(Policy{Internet: true, Allow: []string{"good.test", "93.184.0.0/16"}, Deny: []string{"93.184.216.34"}})
	for _, tc := range []struct {
		addr    string
		viaName bool
		want    Reason
	}{
		{"93.184.1.1", false, ""},
		{"93.184.216.34", false, ReasonRuleNotAllowed}, // deny wins
		{"93.184.216.34", true, ReasonRuleNotAllowed},  // even from an allowed name
		{"8.8.8.8", false, ReasonRuleNotAllowed},       // not on the allow list
		{"8.8.8.8", true, ""},                          // resolved from an allowed name
		{"::ffff:93.184.1.1", false, ""},
	} {
		got := Reason("")
		if r, ok := AsRefusal(pol.CheckAddr(netip.MustParseAddr(tc.addr), tc.viaName)); ok {
			got = r.Reason
		}
		if got != tc.want {
			t.Errorf("CheckAddr(%s, %v) = %q, want %q", tc.addr, tc.viaName, got, tc.want)
		}
	}
}

// testEnv is a gate with an operator that maps *.test names to loopback
// servers, counting dials.
type testEnv struct {
	gate     *Gate
	dials    atomic.Int64
	proxyURL *url.URL
	refusals chan *Refusal
}

// newTestEnv builds a testEnv; opts set more of its operator.
func newTestEnv(t testing.TB, pol Policy, resolve map[string]string, opts ...func(*Operator)) *testEnv {
	t.Helper()
	env := &testEnv{refusals: make(chan *Refusal, 100)}
	res := map[string][]netip.Addr{}
	for k, v := range resolve {
		res[k] = []netip.Addr{netip.MustParseAddr(v)}
	}
	d := &net.Dialer{}
	o := Operator{
		Open:    []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")},
		Resolve: res,
		Dial: func(ctx context.Context, network, addr string) (net.Conn, error) {
			env.dials.Add(1)
			return d.DialContext(ctx, network, addr)
		},
	}
	for _, opt := range opts {
		opt(&o)
	}
	op := NewOperator(o)
	env.gate = NewGate(op, MustCompile(pol))
	env.gate.OnRefuse = func(r *Refusal) {
		select {
		case env.refusals <- r:
		default:
		}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close(); env.gate.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go env.gate.ServeProxy(context.Background(), c, nil)
		}
	}()
	env.proxyURL = &url.URL{Scheme: "http", Host: ln.Addr().String()}
	return env
}

func (env *testEnv) client(ts *httptest.Server) *http.Client {
	tr := &http.Transport{Proxy: http.ProxyURL(env.proxyURL)}
	if ts != nil && ts.TLS != nil {
		tr.TLSClientConfig = ts.Client().Transport.(*http.Transport).TLSClientConfig.Clone()
		tr.TLSClientConfig.ServerName = "example.com" // httptest's certificate names example.com
	}
	return &http.Client{Transport: tr, Timeout: 10 * time.Second}
}

func port(t *testing.T, ts *httptest.Server) string {
	u, _ := url.Parse(ts.URL)
	return u.Port()
}

func TestProxy(t *testing.T) {
	hello := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "hello from "+r.Host) })
	plain := httptest.NewServer(hello)
	defer plain.Close()
	secure := httptest.NewTLSServer(hello)
	defer secure.Close()
	env := newTestEnv(t, Policy{Internet: true, Allow: []string{"good.test", "*.sub.test", "127.0.0.2"}, Deny: []string{"denied.sub.test"}},
		map[string]string{"good.test": "127.0.0.1", "bad.test": "127.0.0.1", "a.sub.test": "127.0.0.1", "sub.test": "127.0.0.1",
			"denied.sub.test": "127.0.0.1", "meta.sub.test": "169.254.169.254"})
	for _, tc := range []struct {
		url  string
		want Reason // "" = 200
	}{
		{"http://good.test:" + port(t, plain) + "/", ""},
		{"https://good.test:" + port(t, secure) + "/", ""},
		{"http://a.sub.test:" + port(t, plain) + "/", ""},
		{"http://bad.test:" + port(t, plain) + "/", ReasonRuleNotAllowed},
		{"https://bad.test:" + port(t, secure) + "/", ReasonRuleNotAllowed},
		{"http://sub.test:" + port(t, plain) + "/", ReasonRuleNotAllowed},          // apex of a subdomain rule
		{"https://denied.sub.test:" + port(t, secure) + "/", ReasonRuleNotAllowed}, // deny wins
		{"http://meta.sub.test/", ReasonAddressForbidden},                          // allowed name, forbidden address
		{"http://169.254.169.254/latest/meta-data/", ReasonAddressForbidden},
		{"http://10.0.0.1/", ReasonAddressForbidden},
		{"http://[::1]:" + port(t, plain) + "/", ReasonAddressForbidden},
		{"http://[::ffff:169.254.169.254]/", ReasonAddressForbidden},
		{"http://127.0.0.2:" + port(t, plain) + "/", ReasonAddressForbidden}, // allowed IP, but loopback not opened
		{"https://good.test:25/", ReasonPortForbidden},
	} {
		before := env.dials.Load()
		var resp *http.Response
		var err error
		if u, _ := url.Parse(tc.url); u.Scheme == "https" && tc.want != "" {
			resp, err = rawConnect(env.proxyURL.Host, u.Host)
		} else {
			resp, err = env.client(secure).Get(tc.url)
		}
		if err != nil {
			t.Errorf("GET %s: %v", tc.url, err)
			continue
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		got := Reason(resp.Header.Get(Header))
		if tc.want == "" && (resp.StatusCode != 200 || !strings.HasPrefix(string(body), "hello")) {
			t.Errorf("GET %s = %d %q (%s), want 200", tc.url, resp.StatusCode, body, got)
		}
		if tc.want != "" {
			if resp.StatusCode != http.StatusForbidden || got != tc.want {
				t.Errorf("GET %s = %d %s: %q, want 403 %s", tc.url, resp.StatusCode, got, body, tc.want)
			}
			if d := env.dials.Load() - before; d != 0 {
				t.Errorf("GET %s: refused, yet the proxy dialed %d times", tc.url, d)
			}
		}
	}
	if c := env.gate.Counters(); c.Refused == 0 || c.BytesIn == 0 || c.BytesOut == 0 {
		t.Errorf("counters = %+v, want refusals and bytes both ways", c)
	}
}

// rawConnect sends CONNECT target and returns the proxy's answer (the Go
// client hides the headers of a refused CONNECT).
func rawConnect(proxy, target string) (*http.Response, error) {
	c, err := net.Dial("tcp", proxy)
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", target, target)
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		c.Close()
		return nil, err
	}
	resp.Body = struct {
		io.Reader
		io.Closer
	}{resp.Body, c}
	return resp, nil
}

func TestProxyInternetOff(t *testing.T) {
	env := newTestEnv(t, Policy{Internet: false}, map[string]string{"good.test": "127.0.0.1"})
	resp, err := env.client(nil).Get("http://good.test/")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 403 || resp.Header.Get(Header) != string(ReasonInternetOff) {
		t.Fatalf("got %d %q, want 403 internet-off", resp.StatusCode, resp.Header.Get(Header))
	}
	select {
	case r := <-env.refusals:
		if r.Reason != ReasonInternetOff {
			t.Errorf("refusal %v", r)
		}
	default:
		t.Error("no refusal reported")
	}
}

// TestPolicyChangeCuts holds a CONNECT tunnel and a plain keep-alive
// connection open, then changes the policy: both must be cut.
func TestPolicyChangeCuts(t *testing.T) {
	hello := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "hi") })
	secure := httptest.NewTLSServer(hello)
	defer secure.Close()
	plain := httptest.NewServer(hello)
	defer plain.Close()
	env := newTestEnv(t, Policy{Internet: true, Allow: []string{"good.test", "other.test"}}, map[string]string{"good.test": "127.0.0.1", "other.test": "127.0.0.1"})

	// A raw CONNECT tunnel, kept open.
	tun, err := net.Dial("tcp", env.proxyURL.Host)
	if err != nil {
		t.Fatal(err)
	}
	defer tun.Close()
	fmt.Fprintf(tun, "CONNECT good.test:%s HTTP/1.1\r\nHost: good.test\r\n\r\n", port(t, secure))
	br := bufio.NewReader(tun)
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("CONNECT: %v %v", resp, err)
	}
	tc := tls.Client(&bufConn{tun, br}, &tls.Config{RootCAs: secure.Client().Transport.(*http.Transport).TLSClientConfig.RootCAs, ServerName: "example.com"})
	if err := tc.Handshake(); err != nil {
		t.Fatal(err)
	}
	// A plain keep-alive connection, kept open.
	cl := env.client(plain)
	get := func(host string) (int, error) {
		resp, err := cl.Get("http://" + host + ":" + port(t, plain) + "/")
		if err != nil {
			return 0, err
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode, nil
	}
	if code, err := get("good.test"); err != nil || code != 200 {
		t.Fatalf("plain GET: %d %v", code, err)
	}
	if n := env.gate.Counters().Open; n != 2 {
		t.Fatalf("open connections = %d, want 2", n)
	}

	env.gate.SetPolicy(MustCompile(Policy{Internet: true, Allow: []string{"other.test"}}), 2)

	tc.SetDeadline(time.Now().Add(5 * time.Second))
	var ne net.Error
	if _, err := tc.Read(make([]byte, 1)); err == nil || (errors.As(err, &ne) && ne.Timeout()) {
		t.Errorf("tunnel after the change: read err = %v, want the connection cut", err)
	}
	if code, _ := get("good.test"); code != 403 {
		t.Errorf("plain GET good.test after the change = %d, want 403", code)
	}
	if code, err := get("other.test"); err != nil || code != 200 {
		t.Errorf("plain GET other.test after the change = %d %v, want 200", code, err)
	}
	if _, v := env.gate.Policy(); v != 2 {
		t.Errorf("version = %d", v)
	}
}

type bufConn struct {
	net.Conn
	r *bufio.Reader
}

func (c *bufConn) Read(b []byte) (int, error) { return c.r.Read(b) }

func dnsQuery(t *testing.T, name string, typ dnsmessage.Type) []byte {
	b := dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: 7, RecursionDesired: true})
	b.StartQuestions()
	b.Question(dnsmessage.Question{Name: dnsmessage.MustNewName(name), Type: typ, Class: dnsmessage.ClassINET})
	q, err := b.Finish()
	if err != nil {
		t.Fatal(err)
	}
	return q
}

func TestDNS(t *testing.T) {
	env := newTestEnv(t, Policy{Internet: true, Allow: []string{"good.test", "*.v6.test", "meta.test"}},
		map[string]string{"good.test": "127.0.0.1", "bad.test": "127.0.0.1", "a.v6.test": "2606:4700::1111", "meta.test": "169.254.169.254"})
	ask := func(name string, typ dnsmessage.Type) (dnsmessage.Header, []netip.Addr) {
		t.Helper()
		ans := env.gate.AnswerDNS(context.Background(), dnsQuery(t, name, typ))
		var p dnsmessage.Parser
		h, err := p.Start(ans)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		p.SkipAllQuestions()
		var got []netip.Addr
		for {
			rr, err := p.Answer()
			if err != nil {
				break
			}
			switch r := rr.Body.(type) {
			case *dnsmessage.AResource:
				got = append(got, netip.AddrFrom4(r.A))
			case *dnsmessage.AAAAResource:
				got = append(got, netip.AddrFrom16(r.AAAA))
			}
		}
		return h, got
	}
	for _, tc := range []struct {
		name  string
		typ   dnsmessage.Type
		rcode dnsmessage.RCode
		n     int // stand-in addresses expected
	}{
		{"good.test.", dnsmessage.TypeA, dnsmessage.RCodeSuccess, 1},
		{"GOOD.test.", dnsmessage.TypeA, dnsmessage.RCodeSuccess, 1},
		{"good.test.", dnsmessage.TypeAAAA, dnsmessage.RCodeSuccess, 0},
		{"a.v6.test.", dnsmessage.TypeA, dnsmessage.RCodeSuccess, 1},
		{"bad.test.", dnsmessage.TypeA, dnsmessage.RCodeNameError, 0},
		{"v6.test.", dnsmessage.TypeA, dnsmessage.RCodeNameError, 0},
		{"meta.test.", dnsmessage.TypeA, dnsmessage.RCodeNameError, 0}, // only a forbidden address
	} {
		h, got := ask(tc.name, tc.typ)
		if h.ID != 7 || !h.Response || h.RCode != tc.rcode || len(got) != tc.n {
			t.Errorf("%s %v: header %+v answers %v, want rcode %v and %d answers", tc.name, tc.typ, h, got, tc.rcode, tc.n)
		}
		for _, a := range got {
			if !FakeRange.Contains(a) {
				t.Errorf("%s: answer %s is not a stand-in", tc.name, a)
			}
		}
	}
	_, a1 := ask("good.test.", dnsmessage.TypeA)
	_, a2 := ask("good.test.", dnsmessage.TypeA)
	if a1[0] != a2[0] {
		t.Errorf("stand-in of good.test changed: %v then %v", a1, a2)
	}
	if env.dials.Load() != 0 {
		t.Error("DNS dialed")
	}

	// A captured connection to the stand-in reaches good.test's server.
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "hi") }))
	defer ts.Close()
	tsPort, _ := strconv.Atoi(port(t, ts))
	capture := func(dst netip.AddrPort) (string, error) {
		c1, c2 := net.Pipe()
		defer c1.Close()
		var acceptErr error
		go env.gate.ServeTCP(context.Background(), dst, c2, nil, func(err error) error { acceptErr = err; return nil })
		c1.SetDeadline(time.Now().Add(5 * time.Second))
		fmt.Fprintf(c1, "GET / HTTP/1.0\r\nHost: good.test\r\n\r\n")
		b, _ := io.ReadAll(c1)
		return string(b), acceptErr
	}
	if out, err := capture(netip.AddrPortFrom(a1[0], uint16(tsPort))); err != nil || !strings.HasSuffix(out, "hi") {
		t.Errorf("captured connection to the stand-in: %q %v", out, err)
	}
	for _, dst := range []string{"198.19.250.250:80", "127.0.0.1:" + port(t, ts), "169.254.169.254:80"} {
		_, err := capture(netip.MustParseAddrPort(dst))
		if _, ok := AsRefusal(err); !ok {
			t.Errorf("captured connection to %s: %v, want a refusal", dst, err)
		}
	}

	env.gate.SetPolicy(MustCompile(Policy{Internet: false}), 2)
	h, _ := ask("good.test.", dnsmessage.TypeA)
	if h.RCode != dnsmessage.RCodeRefused {
		t.Errorf("internet off: rcode %v, want REFUSED", h.RCode)
	}
	if env.gate.AnswerDNS(context.Background(), []byte{1, 2, 3}) != nil {
		t.Error("garbage query answered")
	}
}
