package egress

import (
	"context"
	"crypto/x509"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
)

// forbidden is the set no sandbox may reach whatever its policy, unless the
// operator opens part of it. IPv4-mapped IPv6 addresses are unmapped before
// they are checked, so ::ffff:10.0.0.1 is 10.0.0.1.
var forbidden = func() []netip.Prefix {
	var ps []netip.Prefix
	for _, s := range []string{
		"0.0.0.0/8",      // "this network", unspecified
		"10.0.0.0/8",     // RFC 1918
		"100.64.0.0/10",  // CGNAT
		"127.0.0.0/8",    // loopback
		"169.254.0.0/16", // link-local, cloud metadata (169.254.169.254)
		"172.16.0.0/12",  // RFC 1918
		"192.0.0.0/24",   // IETF protocol assignments
		"192.168.0.0/16", // RFC 1918
		"198.18.0.0/15",  // benchmarking
		"224.0.0.0/4",    // multicast
		"240.0.0.0/4",    // reserved, broadcast
		"::/96",          // unspecified, loopback, IPv4-compatible
		"64:ff9b::/96",   // NAT64: would reach IPv4 through a gateway
		"64:ff9b:1::/48", // local-use NAT64
		"2002::/16",      // 6to4: embeds IPv4
		"2001::/32",      // Teredo
		"fc00::/7",       // unique local
		"fe80::/10",      // link-local
		"fec0::/10",      // site-local (deprecated)
		"ff00::/8",       // multicast
		"100::/64",       // discard
	} {
		ps = append(ps, netip.MustParsePrefix(s))
	}
	return ps
}()

// neverOpen is refused even where the operator opens a range holding it:
// the cloud's host agent (Azure's WireServer, which hands out the VM's
// secrets) and the metadata and credential services.
var neverOpen = []netip.Prefix{
	netip.MustParsePrefix("168.63.129.16/32"),   // Azure WireServer
	netip.MustParsePrefix("169.254.169.254/32"), // AWS, GCP, Azure, OCI, DigitalOcean metadata
	netip.MustParsePrefix("169.254.170.2/32"),   // AWS ECS task credentials
	netip.MustParsePrefix("169.254.170.23/32"),  // AWS EKS pod identity
	netip.MustParsePrefix("100.100.100.200/32"), // Alibaba Cloud metadata
	netip.MustParsePrefix("fd00:ec2::254/128"),  // AWS metadata over IPv6
	netip.MustParsePrefix("fd00:ec2::23/128"),   // AWS EKS pod identity over IPv6
}

// Metadata reports whether a is a cloud metadata or host-agent address,
// itself or as the IPv4 address an IPv6 one carries (mapped, compatible,
// NAT64, 6to4, Teredo): no flag opens these, for sandboxes or for the
// server's own fetches on a tenant's behalf (registry imports).
func Metadata(a netip.Addr) bool {
	in := func(x netip.Addr) bool {
		return slices.ContainsFunc(neverOpen, func(p netip.Prefix) bool { return p.Contains(x) })
	}
	a = a.WithZone("").Unmap()
	if in(a) {
		return true
	}
	return slices.ContainsFunc(embeddedIPv4(a), in)
}

// embeddedIPv4 is the IPv4 addresses an IPv6 address carries by the
// translation schemes that reach IPv4 through a gateway.
func embeddedIPv4(a netip.Addr) []netip.Addr {
	if !a.Is6() {
		return nil
	}
	b := a.As16()
	v4 := func(x []byte) netip.Addr { return netip.AddrFrom4([4]byte(x)) }
	var out []netip.Addr
	switch {
	case b[0] == 0x20 && b[1] == 0x02: // 6to4, 2002:AABB:CCDD::/48
		out = append(out, v4(b[2:6]))
	case b[0] == 0x20 && b[1] == 0x01 && b[2] == 0 && b[3] == 0: // Teredo: server, then client XORed
		client := [4]byte{^b[12], ^b[13], ^b[14], ^b[15]}
		out = append(out, v4(b[4:8]), netip.AddrFrom4(client))
	}
	// NAT64 (64:ff9b::/96, 64:ff9b:1::/48), IPv4-compatible (::/96) and
	// any other prefix that ends in an IPv4 address: the last 32 bits.
	return append(out, v4(b[12:16]))
}

// MailPorts are refused by default: sandboxes must not send mail.
var MailPorts = []int{25, 465, 587}

// Resolver looks names up; *net.Resolver implements it.
type Resolver interface {
	LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error)
}

// Operator is the server-wide egress configuration. Its fields must not
// change once it is in use.
type Operator struct {
	// Open lists addresses and ranges of the always-refused set that the
	// operator opens (tests open 127.0.0.1/32). The host's own addresses
	// stay closed unless listed here.
	Open []netip.Prefix
	// Resolve overrides name resolution: name → addresses (tests map
	// good.test to 127.0.0.1).
	Resolve map[string][]netip.Addr
	// Resolver resolves every other name; nil means net.DefaultResolver.
	Resolver Resolver
	// HostAddrs are the host's own addresses, always refused; nil means
	// the addresses of the host's interfaces, read by NewOperator.
	HostAddrs []netip.Addr
	// Dial connects to a checked address; nil means a net.Dialer. Tests
	// count dials with it.
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
	// OpenPorts are ports of the refused set (MailPorts) the operator opens.
	OpenPorts []int
	// Deny are ranges refused to every sandbox besides the built-in ones,
	// even where Open admits them (--egress-deny-cidr).
	Deny []netip.Prefix
	// Max is the ceiling of every sandbox's policy (--egress-max): a gate
	// applies a policy intersected with it, so a tenant can narrow it but
	// never widen it. Nil: no ceiling.
	Max *Compiled
	// Closed are host services no sandbox may reach even where Open
	// admits their address: the server's own API, above all. An
	// unspecified address (0.0.0.0, ::) stands for every loopback and host
	// address.
	Closed []netip.AddrPort
	// Intercept, if set, lets a gate terminate TLS to the hosts its
	// Swapper names (egress secrets). Nil: every connection is piped.
	Intercept *Interception
}

// Interception is the server-wide side of egress secrets: the CAs whose
// leaves the gate presents to guests, and the roots it verifies the real
// hosts with, as the guest no longer can.
type Interception struct {
	Authority *Authority
	// Roots verify the far end's certificate; nil is the host's roots.
	Roots *x509.CertPool
}

// NewOperator fills in the defaults of op: the host's addresses, the
// resolver and the dialer.
func NewOperator(op Operator) *Operator {
	if op.HostAddrs == nil {
		op.HostAddrs = hostAddrs()
	}
	if op.Resolver == nil {
		op.Resolver = net.DefaultResolver
	}
	if op.Dial == nil {
		d := &net.Dialer{}
		op.Dial = d.DialContext
	}
	res := map[string][]netip.Addr{}
	for k, v := range op.Resolve {
		res[normalizeHost(k)] = v
	}
	op.Resolve = res
	return &op
}

func hostAddrs() []netip.Addr {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return nil
	}
	var out []netip.Addr
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok {
			if ip, ok := netip.AddrFromSlice(n.IP); ok {
				out = append(out, ip.Unmap())
			}
		}
	}
	return out
}

// Forbidden reports whether a is in the always-refused set and not opened
// by the operator.
func (op *Operator) Forbidden(a netip.Addr) bool {
	a = a.Unmap()
	if !a.IsValid() || a.Zone() != "" {
		return true
	}
	in := func(p netip.Prefix) bool { return p.Contains(a) }
	if Metadata(a) || slices.ContainsFunc(op.Deny, in) {
		return true
	}
	if op.opened(a) {
		return false
	}
	if slices.Contains(op.HostAddrs, a) {
		return true
	}
	return slices.ContainsFunc(forbidden, func(p netip.Prefix) bool { return p.Contains(a) })
}

// opened reports whether the operator opened a.
func (op *Operator) opened(a netip.Addr) bool {
	a = a.Unmap()
	return slices.ContainsFunc(op.Open, func(p netip.Prefix) bool { return p.Contains(a) })
}

// closed reports whether a:port is one of the operator's closed services.
func (op *Operator) closed(a netip.Addr, port int) bool {
	a = a.Unmap()
	for _, c := range op.Closed {
		if int(c.Port()) != port {
			continue
		}
		ca := c.Addr().Unmap()
		if ca == a || (ca.IsUnspecified() && (a.IsLoopback() || a.IsUnspecified() || slices.Contains(op.HostAddrs, a))) {
			return true
		}
	}
	return false
}

// PortForbidden reports whether port is refused whatever the policy.
func (op *Operator) PortForbidden(port int) bool {
	if port <= 0 || port > 65535 {
		return true
	}
	return slices.Contains(MailPorts, port) && !slices.Contains(op.OpenPorts, port)
}

// lookup resolves host (an IP literal resolves to itself).
func (op *Operator) lookup(ctx context.Context, host string) ([]netip.Addr, error) {
	if a, err := netip.ParseAddr(host); err == nil {
		return []netip.Addr{a.Unmap()}, nil
	}
	if addrs, ok := op.Resolve[host]; ok {
		return slices.Clone(addrs), nil
	}
	addrs, err := op.Resolver.LookupNetIP(ctx, "ip", host)
	if err != nil {
		return nil, err
	}
	for i := range addrs {
		addrs[i] = addrs[i].Unmap()
	}
	return addrs, nil
}

// ParseResolve parses an operator override "name=ip[,ip...]".
func ParseResolve(s string) (string, []netip.Addr, error) {
	name, ips, ok := strings.Cut(s, "=")
	if !ok || name == "" {
		return "", nil, fmt.Errorf("%q: want name=ip[,ip...]", s)
	}
	if err := checkName(normalizeHost(name)); err != nil {
		return "", nil, fmt.Errorf("%q: %v", s, err)
	}
	var addrs []netip.Addr
	for _, ip := range strings.Split(ips, ",") {
		a, err := netip.ParseAddr(strings.TrimSpace(ip))
		if err != nil {
			return "", nil, fmt.Errorf("%q: %v", s, err)
		}
		addrs = append(addrs, a.Unmap())
	}
	return normalizeHost(name), addrs, nil
}

// ParseOpen parses an operator-opened address or CIDR.
func ParseOpen(s string) (netip.Prefix, error) {
	r, err := ParseRule(s)
	if err != nil || r.kind != rulePrefix {
		return netip.Prefix{}, fmt.Errorf("%q: want an IP address or a CIDR", s)
	}
	return r.pfx, nil
}

// Limit returns pol intersected with the operator's ceiling (Max): what a
// sandbox asking for pol may reach. Without a ceiling it is pol.
func (op *Operator) Limit(pol *Compiled) *Compiled {
	if op == nil || op.Max == nil {
		return pol
	}
	return pol.Intersect(op.Max)
}
