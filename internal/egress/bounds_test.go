package egress

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"testing"
	"time"
)

func TestIntersect(t *testing.T) {
	for _, tc := range []struct {
		tenant, ceiling Policy
		want            Policy
	}{
		// No allow list: the other side's.
		{Policy{Internet: true}, Policy{Internet: true, Allow: []string{"pypi.org"}},
			Policy{Internet: true, Allow: []string{"pypi.org"}, Deny: []string{}}},
		{Policy{Internet: true, Allow: []string{"x.com"}, Deny: []string{"a.x.com"}}, Policy{Internet: true, Deny: []string{"b.com"}},
			Policy{Internet: true, Allow: []string{"x.com"}, Deny: []string{"a.x.com", "b.com"}}},
		// Nesting rules: the narrower.
		{Policy{Internet: true, Allow: []string{"*.pythonhosted.org", "files.example.com", "10.0.0.0/8"}},
			Policy{Internet: true, Allow: []string{"files.pythonhosted.org", "*.example.com", "10.1.0.0/16"}},
			Policy{Internet: true, Allow: []string{"files.pythonhosted.org", "files.example.com", "10.1.0.0/16"}, Deny: []string{}}},
		{Policy{Internet: true, Allow: []string{"*.a.example.com"}}, Policy{Internet: true, Allow: []string{"*.example.com"}},
			Policy{Internet: true, Allow: []string{"*.a.example.com"}, Deny: []string{}}},
		// Nothing in common: nothing at all, not everything.
		{Policy{Internet: true, Allow: []string{"evil.com", "1.2.3.4"}}, Policy{Internet: true, Allow: []string{"pypi.org", "example.com", "*.example.com"}},
			Policy{Internet: false, Allow: []string{}, Deny: []string{}}},
		{Policy{Internet: true, Allow: []string{"example.com"}}, Policy{Internet: true, Allow: []string{"*.example.com"}},
			Policy{Internet: false, Allow: []string{}, Deny: []string{}}},
		// Internet off on either side.
		{Policy{Internet: true}, Policy{Internet: false}, Policy{Internet: false, Allow: []string{}, Deny: []string{}}},
	} {
		got := MustCompile(tc.tenant).Intersect(MustCompile(tc.ceiling)).Policy
		if got.Internet != tc.want.Internet || !slices.Equal(got.Allow, tc.want.Allow) || !slices.Equal(got.Deny, tc.want.Deny) {
			t.Errorf("%+v ∩ %+v = %+v, want %+v", tc.tenant, tc.ceiling, got, tc.want)
		}
	}
}

// A tenant cannot pass the operator's ceiling: a wider policy is cut to
// it, in Resolve and Dial alike, whatever SetPolicy is given.
func TestCeiling(t *testing.T) {
	var dials int
	op := NewOperator(Operator{
		HostAddrs: []netip.Addr{},
		Resolve: map[string][]netip.Addr{"pypi.org": {netip.MustParseAddr("151.101.0.223")},
			"evil.com": {netip.MustParseAddr("93.184.216.34")}},
		Max: MustCompile(Policy{Internet: true, Allow: []string{"pypi.org"}}),
		Dial: func(ctx context.Context, network, addr string) (net.Conn, error) {
			dials++
			return nil, fmt.Errorf("no network in tests")
		},
	})
	g := NewGate(op, MustCompile(Policy{Internet: true})) // "everything"
	g.SetPolicy(MustCompile(Policy{Internet: true, Allow: []string{"pypi.org", "evil.com", "93.184.216.0/24"}}), 2)
	ctx := context.Background()
	if _, err := g.Resolve(ctx, "pypi.org"); err != nil {
		t.Errorf("Resolve(pypi.org) = %v, want allowed", err)
	}
	for _, host := range []string{"evil.com", "93.184.216.34"} {
		if _, err := g.Resolve(ctx, host); !isRefusal(err, ReasonRuleNotAllowed) {
			t.Errorf("Resolve(%s) = %v, want refused by the ceiling", host, err)
		}
		if _, err := g.Dial(ctx, host, 443); !isRefusal(err, ReasonRuleNotAllowed) {
			t.Errorf("Dial(%s) = %v, want refused by the ceiling", host, err)
		}
	}
	if dials != 0 {
		t.Errorf("%d dials, want none", dials)
	}
	if pol, _ := g.Policy(); !slices.Equal(pol.Allow, []string{"pypi.org"}) {
		t.Errorf("policy in force %v, want [pypi.org]", pol.Allow)
	}
}

func isRefusal(err error, want Reason) bool {
	r, ok := AsRefusal(err)
	return ok && r.Reason == want
}

// The cloud's host agent and the operator's denied ranges are refused even
// where the operator opened everything.
func TestAlwaysRefused(t *testing.T) {
	op := NewOperator(Operator{HostAddrs: []netip.Addr{}, Open: []netip.Prefix{netip.MustParsePrefix("0.0.0.0/0")},
		Deny: []netip.Prefix{netip.MustParsePrefix("203.0.113.0/24")}})
	for _, a := range []string{"168.63.129.16", "::ffff:168.63.129.16", "169.254.169.254", "203.0.113.9"} {
		if !op.Forbidden(netip.MustParseAddr(a)) {
			t.Errorf("%s is not forbidden", a)
		}
	}
	if op.Forbidden(netip.MustParseAddr("10.1.2.3")) {
		t.Errorf("10.1.2.3, opened, is forbidden")
	}
}

// The stand-in table keeps at most MaxStandIns names; a name idle long
// enough gives its address to a new one, a busy table refuses new names.
func TestStandInLRU(t *testing.T) {
	now := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	defer func(c func() time.Time) { clock = c }(clock)
	clock = func() time.Time { return now }
	g := NewGate(NewOperator(Operator{HostAddrs: []netip.Addr{}}), MustCompile(Policy{Internet: true}))
	addrs := map[netip.Addr]bool{}
	for i := range MaxStandIns {
		a, ok := g.fakeAddr(fmt.Sprintf("n%d.test", i))
		if !ok || addrs[a] || !FakeRange.Contains(a) {
			t.Fatalf("name %d: %v %v", i, a, ok)
		}
		addrs[a] = true
	}
	if _, ok := g.fakeAddr("new.test"); ok {
		t.Errorf("a full table of busy names gave a stand-in")
	}
	now = now.Add(standInIdle)
	// n0, n1 and n2 are used again; the rest stay idle.
	a0, _ := g.fakeAddr("n0.test")
	g.fakeAddr("n1.test")
	if n, ok := g.fakeName(a0); !ok || n != "n0.test" {
		t.Errorf("n0's stand-in names %q", n)
	}
	old, _ := g.fakeAddr("n2.test") // refresh n2 too
	now = now.Add(standInIdle)
	g.fakeAddr("n0.test")
	a, ok := g.fakeAddr("new.test")
	if !ok {
		t.Fatal("no stand-in after the table went idle")
	}
	if n, _ := g.fakeName(a); n != "new.test" {
		t.Errorf("new stand-in names %q", n)
	}
	if a == old {
		t.Errorf("took the address of a recently used name")
	}
	if len(g.fakeOf) != MaxStandIns || g.fakeLRU.Len() != MaxStandIns || len(g.nameOf) != MaxStandIns {
		t.Errorf("table holds %d/%d/%d, want %d", len(g.fakeOf), g.fakeLRU.Len(), len(g.nameOf), MaxStandIns)
	}
}

// Metadata and host-agent addresses stay refused where the operator opened
// every address, IPv4 and IPv6, in each IPv6 form that carries them to an
// IPv4 gateway; neighbours of them do not count as metadata.
func TestMetadataNeverOpened(t *testing.T) {
	op := NewOperator(Operator{HostAddrs: []netip.Addr{},
		Open: []netip.Prefix{netip.MustParsePrefix("0.0.0.0/0"), netip.MustParsePrefix("::/0")}})
	for _, a := range []string{
		"169.254.169.254", "168.63.129.16", "169.254.170.2", "169.254.170.23", "100.100.100.200",
		"fd00:ec2::254", "fd00:ec2::23", "::ffff:169.254.169.254", "::169.254.169.254",
		"64:ff9b::a9fe:a9fe", "64:ff9b:1::a9fe:a9fe", "2002:a9fe:a9fe::1", "2002:a83f:8110::",
		"2001:0:a9fe:a9fe::1", "2001:0:102:304::5601:5601", // Teredo: server, client (XORed)
	} {
		addr := netip.MustParseAddr(a)
		if !op.Forbidden(addr) {
			t.Errorf("%s is not forbidden with everything opened", a)
		}
		if !Metadata(addr) {
			t.Errorf("Metadata(%s) = false", a)
		}
	}
	for _, a := range []string{"169.254.169.253", "169.254.1.1", "10.1.2.3", "8.8.8.8", "2606:4700::1111", "2002:808:808::1"} {
		if Metadata(netip.MustParseAddr(a)) {
			t.Errorf("Metadata(%s) = true", a)
		}
		if op.Forbidden(netip.MustParseAddr(a)) {
			t.Errorf("%s, opened, is forbidden", a)
		}
	}
}
