package egress

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
)

// Policy is a sandbox's egress policy as the API shows it.
//
// Allow and Deny entries are a domain ("pypi.org": that name only), a
// subdomain rule ("*.pythonhosted.org": names below it, not the apex), an IP
// address or a CIDR. An empty Allow admits every public destination; Deny
// always wins; Internet false refuses everything, DNS included.
type Policy struct {
	Internet bool     `json:"internet"`
	Allow    []string `json:"allow"`
	Deny     []string `json:"deny"`
}

// Limits of a policy.
const (
	MaxRules   = 256
	maxNameLen = 253
)

// Reason says why a connection or lookup was refused; it is sent to the
// guest in the X-Emberbox-Egress header of a 403 answer.
type Reason string

// Refusal reasons.
const (
	ReasonInternetOff      Reason = "internet-off"
	ReasonRuleNotAllowed   Reason = "rule-not-allowed"
	ReasonAddressForbidden Reason = "address-forbidden"
	ReasonPortForbidden    Reason = "port-forbidden"
)

// Refusal is the error of a refused destination.
type Refusal struct {
	Reason Reason
	Target string // the name or address asked for, with its port if any
}

func (r *Refusal) Error() string { return fmt.Sprintf("egress to %s refused: %s", r.Target, r.Reason) }

// AsRefusal returns the Refusal in err's chain, if any.
func AsRefusal(err error) (*Refusal, bool) {
	var r *Refusal
	ok := errors.As(err, &r)
	return r, ok
}

type ruleKind int

const (
	ruleName   ruleKind = iota // exact name
	ruleSuffix                 // *.name: strict subdomains
	rulePrefix                 // IP or CIDR
)

type rule struct {
	kind ruleKind
	name string // lower case, no trailing dot
	pfx  netip.Prefix
}

func (r rule) matchName(host string) bool {
	switch r.kind {
	case ruleName:
		return host == r.name
	case ruleSuffix:
		return strings.HasSuffix(host, "."+r.name)
	}
	return false
}

// Compiled is a validated policy, ready to check destinations. It is
// immutable.
type Compiled struct {
	Policy
	allow, deny []rule
}

// RuleError is an invalid entry of a policy.
type RuleError struct {
	Path    string // e.g. "allow[2]"
	Message string
}

func (e *RuleError) Error() string { return e.Path + ": " + e.Message }

// Compile validates p. Invalid entries are reported as a list of *RuleError
// joined with errors.Join. Entries are normalized (lower case, no trailing
// dot, CIDRs masked) in the returned policy.
func Compile(p Policy) (*Compiled, error) {
	c := &Compiled{Policy: Policy{Internet: p.Internet, Allow: []string{}, Deny: []string{}}}
	var errs []error
	for _, list := range []struct {
		field string
		in    []string
		out   *[]rule
		norm  *[]string
	}{{"allow", p.Allow, &c.allow, &c.Policy.Allow}, {"deny", p.Deny, &c.deny, &c.Policy.Deny}} {
		if len(list.in) > MaxRules {
			errs = append(errs, &RuleError{list.field, fmt.Sprintf("at most %d entries", MaxRules)})
			continue
		}
		for i, s := range list.in {
			r, err := ParseRule(s)
			if err != nil {
				errs = append(errs, &RuleError{fmt.Sprintf("%s[%d]", list.field, i), err.Error()})
				continue
			}
			*list.out = append(*list.out, r)
			*list.norm = append(*list.norm, r.String())
		}
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return c, nil
}

// MustCompile is Compile for policies known to be valid.
func MustCompile(p Policy) *Compiled {
	c, err := Compile(p)
	if err != nil {
		panic(err)
	}
	return c
}

func (r rule) String() string {
	switch r.kind {
	case ruleName:
		return r.name
	case ruleSuffix:
		return "*." + r.name
	}
	if r.pfx.IsSingleIP() {
		return r.pfx.Addr().String()
	}
	return r.pfx.String()
}

// ParseRule parses one allow or deny entry.
func ParseRule(s string) (rule, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return rule{}, errors.New("empty entry")
	}
	if strings.Contains(s, "/") {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return rule{}, fmt.Errorf("invalid CIDR %q", s)
		}
		p = netip.PrefixFrom(p.Addr().Unmap(), unmappedBits(p)).Masked()
		return rule{kind: rulePrefix, pfx: p}, nil
	}
	// A trailing dot is dropped as from a name, so that "1.2.3.4." is the
	// address the gate sees for that host, not a name rule that normalizes
	// to an address.
	if a, err := netip.ParseAddr(strings.Trim(strings.TrimSuffix(s, "."), "[]")); err == nil {
		if a.Zone() != "" {
			return rule{}, fmt.Errorf("%q: zones are not allowed", s)
		}
		a = a.Unmap()
		return rule{kind: rulePrefix, pfx: netip.PrefixFrom(a, a.BitLen())}, nil
	}
	kind := ruleName
	name := strings.ToLower(strings.TrimSuffix(s, "."))
	if rest, ok := strings.CutPrefix(name, "*."); ok {
		kind, name = ruleSuffix, rest
	}
	if err := checkName(name); err != nil {
		return rule{}, fmt.Errorf("%q: %v (want a domain, *.domain, an IP or a CIDR)", s, err)
	}
	return rule{kind: kind, name: name}, nil
}

func unmappedBits(p netip.Prefix) int {
	if p.Addr().Is4In6() {
		return max(p.Bits()-96, 0)
	}
	return p.Bits()
}

// checkName accepts LDH host names (and underscores, seen in real names).
func checkName(name string) error {
	if name == "" || len(name) > maxNameLen {
		return errors.New("not a domain name")
	}
	for _, label := range strings.Split(name, ".") {
		if label == "" || len(label) > 63 {
			return errors.New("empty or too long label")
		}
		if label[0] == '-' || label[len(label)-1] == '-' {
			return errors.New("label starts or ends with '-'")
		}
		for i := 0; i < len(label); i++ {
			c := label[i]
			if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
				return fmt.Errorf("invalid character %q", c)
			}
		}
	}
	return nil
}

// normalizeHost lower-cases a host name and drops a trailing dot.
func normalizeHost(h string) string { return strings.ToLower(strings.TrimSuffix(h, ".")) }

// CheckName says whether a name may be looked up and connected to (its
// addresses are checked separately with CheckAddr).
func (c *Compiled) CheckName(host string) error {
	host = normalizeHost(host)
	if !c.Internet {
		return &Refusal{ReasonInternetOff, host}
	}
	if slices.ContainsFunc(c.deny, func(r rule) bool { return r.matchName(host) }) {
		return &Refusal{ReasonRuleNotAllowed, host}
	}
	if len(c.allow) > 0 && !slices.ContainsFunc(c.allow, func(r rule) bool { return r.matchName(host) }) {
		return &Refusal{ReasonRuleNotAllowed, host}
	}
	return nil
}

// CheckAddr says whether the policy admits an address. viaName is true for
// an address the host resolved from a name CheckName admitted: then only
// deny rules apply, as the allow rule matched the name. The always-refused
// set is the Operator's business (see Operator.Forbidden).
func (c *Compiled) CheckAddr(a netip.Addr, viaName bool) error {
	a = a.Unmap()
	if !c.Internet {
		return &Refusal{ReasonInternetOff, a.String()}
	}
	if slices.ContainsFunc(c.deny, func(r rule) bool { return r.kind == rulePrefix && r.pfx.Contains(a) }) {
		return &Refusal{ReasonRuleNotAllowed, a.String()}
	}
	if viaName || len(c.allow) == 0 {
		return nil
	}
	if !slices.ContainsFunc(c.allow, func(r rule) bool { return r.kind == rulePrefix && r.pfx.Contains(a) }) {
		return &Refusal{ReasonRuleNotAllowed, a.String()}
	}
	return nil
}

// Intersect returns the policy that admits what both c and d admit. Deny
// rules are united. An allow list admits a destination if one of its
// rules matches, and the set a rule matches is either inside another
// rule's or apart from it (names, *.suffixes and CIDRs nest or do not
// meet), so the pairwise intersections of the two allow lists are again
// rules of one of them. Two non-empty allow lists that share nothing
// admit nothing: the result has Internet false. The result may hold more
// than MaxRules rules; it is never compiled again from its Policy.
func (c *Compiled) Intersect(d *Compiled) *Compiled {
	out := &Compiled{Policy: Policy{Internet: c.Internet && d.Internet, Allow: []string{}, Deny: []string{}}}
	seen := map[string]bool{}
	add := func(r rule, rules *[]rule, norm *[]string) {
		k := r.String()
		if seen[k] {
			return
		}
		seen[k] = true
		*rules = append(*rules, r)
		*norm = append(*norm, k)
	}
	for _, r := range slices.Concat(c.deny, d.deny) {
		add(r, &out.deny, &out.Policy.Deny)
	}
	clear(seen)
	switch {
	case len(c.allow) == 0:
		for _, r := range d.allow {
			add(r, &out.allow, &out.Policy.Allow)
		}
	case len(d.allow) == 0:
		for _, r := range c.allow {
			add(r, &out.allow, &out.Policy.Allow)
		}
	default:
		for _, a := range c.allow {
			for _, b := range d.allow {
				if r, ok := intersectRule(a, b); ok {
					add(r, &out.allow, &out.Policy.Allow)
				}
			}
		}
		if len(out.allow) == 0 {
			out.Internet = false
		}
	}
	return out
}

// intersectRule returns the rule matching what both a and b match, if
// they meet.
func intersectRule(a, b rule) (rule, bool) {
	// within reports whether everything x matches, y matches too.
	within := func(x, y rule) bool {
		switch {
		case x.kind == rulePrefix || y.kind == rulePrefix:
			return x.kind == rulePrefix && y.kind == rulePrefix &&
				x.pfx.Addr().BitLen() == y.pfx.Addr().BitLen() && y.pfx.Bits() <= x.pfx.Bits() && y.pfx.Contains(x.pfx.Addr())
		case y.kind == ruleName:
			return x.kind == ruleName && x.name == y.name
		default: // y is *.name
			return strings.HasSuffix(x.name, "."+y.name) || (x.kind == ruleSuffix && x.name == y.name)
		}
	}
	switch {
	case within(a, b):
		return a, true
	case within(b, a):
		return b, true
	}
	return rule{}, false
}
