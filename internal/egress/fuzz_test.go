package egress

import (
	"bytes"
	"context"
	"errors"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/net/dns/dnsmessage"
)

// refusedRanges is the always-refused set as the package doc states it,
// written out again so the fuzzers check the code against the document,
// not against itself.
var refusedRanges = func() []netip.Prefix {
	var ps []netip.Prefix
	for _, s := range strings.Fields(`0.0.0.0/8 10.0.0.0/8 100.64.0.0/10 127.0.0.0/8 169.254.0.0/16
		172.16.0.0/12 192.0.0.0/24 192.168.0.0/16 198.18.0.0/15 224.0.0.0/4 240.0.0.0/4 ::/96
		64:ff9b::/96 64:ff9b:1::/48 2002::/16 2001::/32 fc00::/7 fe80::/10 fec0::/10 ff00::/8 100::/64`) {
		ps = append(ps, netip.MustParsePrefix(s))
	}
	return ps
}()

// fuzzHostAddr is the host address the fuzzers' operator knows.
var fuzzHostAddr = netip.MustParseAddr("203.0.113.7")

// privateAddr reports whether a sandbox must never reach a.
func privateAddr(a netip.Addr) bool {
	a = a.Unmap()
	return !a.IsValid() || a.Zone() != "" || a == fuzzHostAddr ||
		a.IsLoopback() || a.IsPrivate() || a.IsUnspecified() || a.IsMulticast() ||
		a.IsLinkLocalUnicast() || a.IsLinkLocalMulticast() || a.IsInterfaceLocalMulticast() ||
		slices.ContainsFunc(refusedRanges, func(p netip.Prefix) bool { return p.Contains(a) })
}

// notFound is a resolver that knows no name, so no fuzzed name is ever
// looked up on the network.
type notFound struct{}

func (notFound) LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error) {
	return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
}

func fuzzOperator(resolve map[string][]netip.Addr) *Operator {
	return NewOperator(Operator{
		Resolve: resolve, Resolver: notFound{}, HostAddrs: []netip.Addr{fuzzHostAddr},
		Dial: func(ctx context.Context, network, addr string) (net.Conn, error) {
			return nil, errors.New("the fuzzers never dial")
		},
	})
}

// addrOf makes an address of 4 or 16 bytes.
func addrOf(b []byte) (netip.Addr, bool) {
	switch len(b) {
	case 4:
		return netip.AddrFrom4([4]byte(b)), true
	case 16:
		return netip.AddrFrom16([16]byte(b)), true
	}
	return netip.Addr{}, false
}

// FuzzPolicy compiles fuzzed allow and deny lists (one entry per line) and
// checks a fuzzed destination against them. It checks that Compile reports
// exactly the entries ParseRule refuses, at their paths; that a compiled
// policy is normalized (compiling it again changes nothing); that no
// policy, whatever it allows, admits an address of the always-refused set
// or a mail port, while deny always wins and internet off refuses all; that
// Resolve answers only addresses it was given and may reach; and that the
// host:port, open-range and name=ip parsers give only well-formed results.
func FuzzPolicy(f *testing.F) {
	v4 := func(s string) []byte { a := netip.MustParseAddr(s).As4(); return a[:] }
	v6 := func(s string) []byte { a := netip.MustParseAddr(s).As16(); return a[:] }
	f.Add("pypi.org\n*.pythonhosted.org", "evil.pypi.org", true, "files.pythonhosted.org", v4("151.101.0.223"), uint16(443))
	f.Add("", "", true, "example.com", v4("10.0.0.1"), uint16(80))
	f.Add("10.0.0.0/8\n127.0.0.1\n0.0.0.0/0\n::/0", "", true, "10.1.2.3", v4("10.1.2.3"), uint16(443))
	f.Add("::ffff:10.0.0.0/104", "1.1.1.1", true, "[::ffff:10.0.0.1]:443", v6("::ffff:10.0.0.1"), uint16(443))
	f.Add("1.2.3.0/24", "1.2.3.4/32", true, "1.2.3.4:25", v4("1.2.3.4"), uint16(25))
	f.Add("*.example.com", "", false, "a.example.com.", v4("93.184.216.34"), uint16(443))
	f.Add("a..b\n\nhttp://x\nx.com:443\n1.2.3.4/33\nfe80::1%eth0\n*", "-a.com\n**.x", true, "", v6("fe80::1"), uint16(0))
	f.Add("Example.COM.", "", true, "EXAMPLE.com", v4("203.0.113.7"), uint16(8080))
	f.Add("2001:db8::/32", "", true, "name=1.2.3.4,::1", v6("2001:db8::1"), uint16(443))
	f.Add("", "", true, "64:ff9b::a00:1", v6("64:ff9b::a00:1"), uint16(443))
	f.Fuzz(func(t *testing.T, allow, deny string, internet bool, host string, addr []byte, port uint16) {
		lines := func(s string) []string {
			if s == "" {
				return nil
			}
			return strings.Split(s, "\n")
		}
		p := Policy{Internet: internet, Allow: lines(allow), Deny: lines(deny)}
		c, err := Compile(p)
		checkCompileErrors(t, p, err)
		checkParsers(t, host)
		if err != nil {
			return
		}
		again, err := Compile(c.Policy)
		if err != nil || !slices.Equal(again.Allow, c.Allow) || !slices.Equal(again.Deny, c.Deny) || len(c.Allow) != len(p.Allow) || len(c.Deny) != len(p.Deny) {
			t.Fatalf("normalized %+v compiles to %+v (%v)", c.Policy, again, err)
		}

		a, ok := addrOf(addr)
		if !ok {
			return
		}
		name := normalizeHost(host)
		if _, err := netip.ParseAddr(name); err == nil {
			name = "" // an IP literal is checked as an address
		}
		g := NewGate(fuzzOperator(map[string][]netip.Addr{name: {a, netip.MustParseAddr("8.8.8.8"), netip.MustParseAddr("10.0.0.1")}}), c)
		for _, n := range []string{"", name} {
			err := g.check(c, n, a, int(port))
			if err != nil {
				if _, ok := AsRefusal(err); !ok {
					t.Fatalf("check %q %v:%d: %v is not a refusal", n, a, port, err)
				}
				continue
			}
			switch {
			case !internet:
				t.Fatalf("internet off admits %q %v", n, a)
			case privateAddr(a):
				t.Fatalf("policy %+v admits the refused address %v", c.Policy, a)
			case port == 0 || slices.Contains(MailPorts, int(port)):
				t.Fatalf("policy admits port %d", port)
			case slices.ContainsFunc(c.deny, func(r rule) bool { return r.kind == rulePrefix && r.pfx.Contains(a.Unmap()) }):
				t.Fatalf("deny rules %v do not refuse %v", c.Deny, a)
			case n != "" && c.CheckName(n) != nil:
				t.Fatalf("check admits %q, CheckName refuses it", n)
			case n == "" && len(c.allow) > 0 && !slices.ContainsFunc(c.allow, func(r rule) bool { return r.kind == rulePrefix && r.pfx.Contains(a.Unmap()) }):
				t.Fatalf("allow rules %v do not admit %v", c.Allow, a)
			}
		}
		if name == "" || checkName(name) != nil {
			return
		}
		got, err := g.Resolve(context.Background(), name)
		if err == nil && len(got) == 0 {
			t.Fatalf("Resolve(%q) gave nothing and no error", name)
		}
		for _, ra := range got {
			// Overrides are unmapped by ParseResolve, not by lookup.
			if privateAddr(ra) || ra.Unmap() != a.Unmap() && ra != netip.MustParseAddr("8.8.8.8") {
				t.Fatalf("Resolve(%q) gave %v", name, ra)
			}
		}
	})
}

// checkCompileErrors checks that Compile refused exactly the entries that
// ParseRule refuses, each as a RuleError at its path.
func checkCompileErrors(t *testing.T, p Policy, err error) {
	var want []string
	for _, l := range []struct {
		field string
		in    []string
	}{{"allow", p.Allow}, {"deny", p.Deny}} {
		if len(l.in) > MaxRules {
			want = append(want, l.field)
			continue
		}
		for i, s := range l.in {
			if _, err := ParseRule(s); err != nil {
				want = append(want, l.field+"["+strconv.Itoa(i)+"]")
			}
		}
	}
	var got []string
	if err != nil {
		errs := []error{err}
		if j, ok := err.(interface{ Unwrap() []error }); ok {
			errs = j.Unwrap()
		}
		for _, e := range errs {
			var re *RuleError
			if !errors.As(e, &re) || re.Message == "" {
				t.Fatalf("Compile error %v is not a RuleError", e)
			}
			got = append(got, re.Path)
		}
	}
	if !slices.Equal(got, want) {
		t.Fatalf("Compile refused %v, want %v", got, want)
	}
	for _, s := range append(slices.Clone(p.Allow), p.Deny...) {
		r, err := ParseRule(s)
		if err != nil {
			continue
		}
		r2, err := ParseRule(r.String())
		if err != nil || r2 != r {
			t.Fatalf("rule %q normalizes to %q, which parses as %+v (%v)", s, r.String(), r2, err)
		}
		if r.kind == rulePrefix && (r.pfx != r.pfx.Masked() || r.pfx.Addr().Is4In6() || r.pfx.Addr().Zone() != "") {
			t.Fatalf("rule %q: prefix %v not normalized", s, r.pfx)
		}
	}
}

// checkParsers checks the parsers of host:port targets, operator-opened
// ranges and name overrides on s.
func checkParsers(t *testing.T, s string) {
	if h, port, err := splitTarget(s, 80); err == nil {
		if port < 1 || port > 65535 || h == "" {
			t.Fatalf("splitTarget(%q) = %q, %d", s, h, port)
		}
		// A name or address joins and splits back unchanged; anything
		// else is refused later, by the policy or the resolver.
		_, ipErr := netip.ParseAddr(h)
		h2, port2, err := splitTarget(net.JoinHostPort(h, strconv.Itoa(port)), 1)
		if (ipErr == nil || checkName(normalizeHost(h)) == nil) && (err != nil || h2 != h || port2 != port) {
			t.Fatalf("splitTarget(%q) = %q, %d, which joined splits as %q, %d (%v)", s, h, port, h2, port2, err)
		}
	}
	if pfx, err := ParseOpen(s); err == nil {
		if !pfx.IsValid() || pfx != pfx.Masked() || pfx.Addr().Is4In6() {
			t.Fatalf("ParseOpen(%q) = %v", s, pfx)
		}
	}
	if name, addrs, err := ParseResolve(s); err == nil {
		if checkName(name) != nil || len(addrs) == 0 {
			t.Fatalf("ParseResolve(%q) = %q, %v", s, name, addrs)
		}
		for _, a := range addrs {
			if !a.IsValid() || a.Is4In6() {
				t.Fatalf("ParseResolve(%q) gave %v", s, a)
			}
		}
	}
}

func dnsQueryBytes(id uint16, name string, typ dnsmessage.Type, class dnsmessage.Class) []byte {
	b := dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: id, RecursionDesired: true})
	_ = b.StartQuestions()
	_ = b.Question(dnsmessage.Question{Name: dnsmessage.MustNewName(name), Type: typ, Class: class})
	out, _ := b.Finish()
	return out
}

// FuzzAnswerDNS answers a fuzzed DNS message and checks the answer: none
// for a message that is not a query with a question, else one response
// with the query's id and question, at most a UDP message long; with
// internet off, REFUSED; answers only of the type asked, for the name
// asked, carrying a stand-in address for a name (the same one when asked
// again) and never a real address behind a name or an address the sandbox
// may not reach.
func FuzzAnswerDNS(f *testing.F) {
	f.Add(dnsQueryBytes(1, "example.com.", dnsmessage.TypeA, dnsmessage.ClassINET), true)
	f.Add(dnsQueryBytes(2, "EXAMPLE.com.", dnsmessage.TypeAAAA, dnsmessage.ClassINET), true)
	f.Add(dnsQueryBytes(3, "private.test.", dnsmessage.TypeA, dnsmessage.ClassINET), true)
	f.Add(dnsQueryBytes(4, "mixed.test.", dnsmessage.TypeA, dnsmessage.ClassINET), true)
	f.Add(dnsQueryBytes(5, "denied.example.com.", dnsmessage.TypeA, dnsmessage.ClassINET), true)
	f.Add(dnsQueryBytes(6, "1.1.1.1.", dnsmessage.TypeA, dnsmessage.ClassINET), true)
	f.Add(dnsQueryBytes(7, "10.0.0.1.", dnsmessage.TypeA, dnsmessage.ClassINET), true)
	f.Add(dnsQueryBytes(8, "example.com.", dnsmessage.TypeMX, dnsmessage.ClassINET), true)
	f.Add(dnsQueryBytes(9, "example.com.", dnsmessage.TypeA, dnsmessage.ClassCHAOS), true)
	f.Add(dnsQueryBytes(10, "example.com.", dnsmessage.TypeA, dnsmessage.ClassINET), false)
	f.Add(dnsQueryBytes(11, "unknown.test.", dnsmessage.TypeA, dnsmessage.ClassINET), true)
	f.Add([]byte{0, 1, 0x80, 0, 0, 1, 0, 0, 0, 0, 0, 0}, true) // a response
	f.Add([]byte{0, 1}, true)
	pol := Policy{Deny: []string{"denied.example.com"}}
	resolve := map[string][]netip.Addr{
		"example.com":  {netip.MustParseAddr("93.184.216.34"), netip.MustParseAddr("2606:2800:220:1::1")},
		"private.test": {netip.MustParseAddr("10.0.0.1")},
		"mixed.test":   {netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("1.1.1.1")},
	}
	real := map[netip.Addr]bool{}
	for _, as := range resolve {
		for _, a := range as {
			real[a] = true
		}
	}
	f.Fuzz(func(t *testing.T, query []byte, internet bool) {
		pol.Internet = internet
		g := NewGate(fuzzOperator(resolve), MustCompile(pol))
		out := g.AnswerDNS(context.Background(), query)

		var qp dnsmessage.Parser
		qh, err := qp.Start(query)
		var q dnsmessage.Question
		if err == nil {
			q, err = qp.Question()
		}
		if err != nil || qh.Response {
			if out != nil {
				t.Fatalf("answered %q, which is no query", query)
			}
			return
		}
		if out == nil {
			// A question the builder cannot write back is dropped.
			b := dnsmessage.NewBuilder(nil, dnsmessage.Header{})
			if b.StartQuestions() == nil && b.Question(q) == nil {
				t.Fatalf("no answer to %v", q)
			}
			return
		}
		if len(out) > 65535 {
			t.Fatalf("answer of %d bytes", len(out))
		}
		var p dnsmessage.Parser
		h, err := p.Start(out)
		if err != nil || !h.Response || h.ID != qh.ID || h.OpCode != qh.OpCode {
			t.Fatalf("answer header %+v (%v) to %+v", h, err, qh)
		}
		qs, err := p.AllQuestions()
		if err != nil || len(qs) != 1 || qs[0] != q {
			t.Fatalf("answer questions %v (%v), want %v", qs, err, q)
		}
		if qh.OpCode == 0 && q.Class == dnsmessage.ClassINET && !internet && h.RCode != dnsmessage.RCodeRefused {
			t.Fatalf("internet off answered %v", h.RCode)
		}
		answers, err := p.AllAnswers()
		if err != nil {
			t.Fatalf("answers: %v", err)
		}
		if len(answers) > 0 && h.RCode != dnsmessage.RCodeSuccess {
			t.Fatalf("answers with %v", h.RCode)
		}
		literal := false
		if _, err := netip.ParseAddr(normalizeHost(q.Name.String())); err == nil {
			literal = true
		}
		for _, rr := range answers {
			if rr.Header.Name != q.Name || rr.Header.Type != q.Type {
				t.Fatalf("answer %v to %v", rr.Header, q)
			}
			var a netip.Addr
			switch b := rr.Body.(type) {
			case *dnsmessage.AResource:
				a = netip.AddrFrom4(b.A)
			case *dnsmessage.AAAAResource:
				a = netip.AddrFrom16(b.AAAA)
			default:
				t.Fatalf("answer of type %T", rr.Body)
			}
			switch {
			case literal && privateAddr(a):
				t.Fatalf("%v answered with the refused %v", q.Name, a)
			case !literal && (!FakeRange.Contains(a) || real[a]):
				t.Fatalf("%v answered with %v, not a stand-in", q.Name, a)
			}
		}
		if again := g.AnswerDNS(context.Background(), query); !bytes.Equal(again, out) {
			t.Fatalf("asked again: %x, first %x", again, out)
		}
	})
}
