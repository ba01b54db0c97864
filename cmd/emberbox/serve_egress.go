package main

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"

	"github.com/emberbox/emberbox/internal/egress"
)

// readEgress reads the egress flags: the operator's rules every sandbox's
// traffic passes, the default policy and the CAs guests trust.
func (s *server) readEgress(context.Context) error {
	es, err := egressConfig(s.o)
	if err != nil {
		return err
	}
	s.egress = es
	return nil
}

type egressSettings struct {
	op  *egress.Operator
	def egress.Policy
	cas string // the CAs guests are configured with at boot
	// trust is the CAs guests are to trust now (the egress CAs rotate);
	// nil: cas, always.
	trust func() string
}

// egressConfig reads the egress flags.
func egressConfig(o serveOptions) (egressSettings, error) {
	var es egressSettings
	switch o.egressDefault {
	case "internet":
		es.def = egress.Policy{Internet: true}
	case "off":
		es.def = egress.Policy{Internet: false}
	default:
		return es, fmt.Errorf(`--egress-default: want "internet" or "off", not %q`, o.egressDefault)
	}
	op, err := egressOperator(o)
	if err != nil {
		return es, err
	}
	es.op = egress.NewOperator(op)
	if es.cas, err = extraCAs(o.extraCAFile); err != nil {
		return es, err
	}
	return es, nil
}

// egressOperator is the operator's rules from the flags: what is opened,
// closed and denied, the ceiling and the names resolved.
func egressOperator(o serveOptions) (egress.Operator, error) {
	var op egress.Operator
	for _, s := range o.egressOpen {
		p, err := egress.ParseOpen(s)
		if err != nil {
			return op, fmt.Errorf("--egress-open: %w", err)
		}
		op.Open = append(op.Open, p)
	}
	op.Closed = append(op.Closed, listenClosed(o.listen)...)
	for _, s := range o.egressDeny {
		p, err := egress.ParseOpen(s)
		if err != nil {
			return op, fmt.Errorf("--egress-deny-cidr: %w", err)
		}
		op.Deny = append(op.Deny, p)
	}
	if len(o.egressMax) > 0 {
		c, err := egressCeiling(o.egressMax)
		if err != nil {
			return op, fmt.Errorf("--egress-max: %w", err)
		}
		op.Max = c
	}
	op.Resolve = map[string][]netip.Addr{}
	for _, s := range o.egressResolve {
		name, addrs, err := egress.ParseResolve(s)
		if err != nil {
			return op, fmt.Errorf("--egress-resolve: %w", err)
		}
		op.Resolve[name] = append(op.Resolve[name], addrs...)
	}
	return op, nil
}

// listenClosed is the server's own API address, never a sandbox's
// destination, even where --egress-open admits its address.
func listenClosed(listen string) []netip.AddrPort {
	if ap, err := netip.ParseAddrPort(listen); err == nil {
		return []netip.AddrPort{ap}
	} else if _, port, err := net.SplitHostPort(listen); err == nil {
		if p, err := strconv.Atoi(port); err == nil {
			return []netip.AddrPort{netip.AddrPortFrom(netip.IPv6Unspecified(), uint16(p))}
		}
	}
	return nil
}

// egressCeiling compiles --egress-max: rules every tenant policy is
// intersected with.
func egressCeiling(rules []string) (*egress.Compiled, error) {
	ceiling := egress.Policy{Internet: true}
	for _, r := range rules {
		switch {
		case r == "off":
			ceiling.Internet = false
		case strings.HasPrefix(r, "!"):
			ceiling.Deny = append(ceiling.Deny, r[1:])
		default:
			ceiling.Allow = append(ceiling.Allow, r)
		}
	}
	return egress.Compile(ceiling)
}

// extraCAs reads --extra-ca-file, the PEM bundle every guest trusts.
func extraCAs(file string) (string, error) {
	if file == "" {
		return "", nil
	}
	b, err := os.ReadFile(file)
	if err != nil {
		return "", fmt.Errorf("--extra-ca-file: %w", err)
	}
	if !bytes.Contains(b, []byte("-----BEGIN CERTIFICATE-----")) {
		return "", fmt.Errorf("--extra-ca-file: %s holds no PEM certificate", file)
	}
	if len(b) > 2<<20 {
		return "", fmt.Errorf("--extra-ca-file: %s is larger than 2 MiB", file)
	}
	return string(b), nil
}
