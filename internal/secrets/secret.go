package secrets

import (
	"net/netip"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/emberbox/emberbox/internal/errdefs"
)

// Secret is one egress secret of a key. Sealed is its value as the store
// keeps it; the value itself is never a field.
type Secret struct {
	Owner string
	Name  string
	// Env is the variable sandboxes see the placeholder in (default Name).
	Env         string
	Placeholder string
	Sealed      string
	// Hosts are names or *.domain patterns.
	Hosts []string
	// Header, when set, is put on every request to the hosts that the
	// rules allow, as Format with {value} replaced.
	Header    string
	Format    string
	Rules     []Rule // none: every request to the hosts
	Only      *Scope // nil: every sandbox of the key
	API       *APIPolicy
	CreatedAt time.Time
	UpdatedAt time.Time
}

// Rule allows the requests of its methods (every method when empty) to
// its paths, each exact or a prefix ending in "/*".
type Rule struct {
	Methods []string `json:"methods,omitempty"`
	Paths   []string `json:"paths"`
}

// Scope names the sandboxes of a key a secret reaches: those whose labels
// hold every pair of any one selector, and those named.
type Scope struct {
	Labels    []map[string]string `json:"labels,omitempty"`
	Sandboxes []string            `json:"sandboxes,omitempty"`
}

// APIPolicy bounds each sandbox's use of a secret per hour: requests that
// carry it (CallsPerHour; 0: no bound) and of them writes, any method but
// GET, HEAD and OPTIONS (WritesPerHour; nil: no bound, 0: none). Past it
// the gate answers 429 with Retry-After, and nothing is sent.
type APIPolicy struct {
	CallsPerHour  int  `json:"callsPerHour,omitempty"`
	WritesPerHour *int `json:"writesPerHour,omitempty"`
}

// maxPerHour bounds a budget: past it, a budget is no bound at all.
const maxPerHour = 1_000_000

// checkAPI refuses budgets out of range.
func checkAPI(p *APIPolicy) error {
	if p == nil {
		return nil
	}
	if p.CallsPerHour < 0 || p.CallsPerHour > maxPerHour || (p.WritesPerHour != nil && (*p.WritesPerHour < 0 || *p.WritesPerHour > maxPerHour)) {
		return invalid("invalid_api_policy", "callsPerHour and writesPerHour are from 0 to %d", maxPerHour)
	}
	return nil
}

// Bounds of secrets.
const (
	MaxPerOwner   = 100
	MaxValueLen   = 8 << 10
	MaxHosts      = 32
	MaxRules      = 16
	MaxRulePaths  = 32
	MaxSelectors  = 8
	MaxPairs      = 8
	MaxScopeIDs   = 100
	maxHostLen    = 253
	maxPathLen    = 1024
	maxHeaderLen  = 128
	maxFormatLen  = 256
	placeholderID = "emberbox-secret-"
)

var (
	nameRE   = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,127}$`)
	labelRE  = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._/-]{0,62}$`)
	headerRE = regexp.MustCompile(`^[A-Za-z0-9!#$%&'*+.^_` + "`" + `|~-]+$`)
	methodRE = regexp.MustCompile(`^[A-Z]{1,16}$`)
)

func invalid(code, format string, args ...any) error {
	return errdefs.New(errdefs.ErrInvalidArgument, code, format, args...)
}

// checkName refuses a name that is not an environment variable's.
func checkName(name string) error {
	if !nameRE.MatchString(name) {
		return invalid("invalid_secret_name", "a secret's name is a variable name: a letter or _, then letters, digits or _, at most 128")
	}
	return nil
}

// checkValue refuses a value that is not visible ASCII and spaces, or is
// too long: it travels in HTTP headers.
func checkValue(v string) error {
	if v == "" || len(v) > MaxValueLen {
		return invalid("invalid_secret_value", "value must be 1 to %d bytes", MaxValueLen)
	}
	for i := 0; i < len(v); i++ {
		if v[i] < 0x20 || v[i] > 0x7e {
			return invalid("invalid_secret_value", "value must be visible ASCII and spaces")
		}
	}
	return nil
}

// checkHosts refuses hosts that are not names or *.domain patterns.
func checkHosts(hosts []string) error {
	if len(hosts) == 0 || len(hosts) > MaxHosts {
		return invalid("invalid_hosts", "hosts: 1 to %d names or *.domain patterns", MaxHosts)
	}
	for _, h := range hosts {
		name := strings.TrimPrefix(h, "*.")
		if _, err := netip.ParseAddr(name); err == nil {
			continue // an address is a host too
		}
		if len(h) > maxHostLen || !validName(name) || strings.ToLower(h) != h {
			return invalid("invalid_hosts", "%q is not a lower-case host name or *.domain pattern", truncate(h, 64))
		}
	}
	return nil
}

func validName(name string) bool {
	labels := strings.Split(name, ".")
	if len(labels) < 1 || name == "" {
		return false
	}
	for _, l := range labels {
		if l == "" || len(l) > 63 || l[0] == '-' || l[len(l)-1] == '-' {
			return false
		}
		for _, r := range l {
			if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-') {
				return false
			}
		}
	}
	return true
}

// checkRules refuses rules that are malformed or too many.
func checkRules(rules []Rule) error {
	if len(rules) > MaxRules {
		return invalid("invalid_rules", "rules: at most %d", MaxRules)
	}
	for _, r := range rules {
		if len(r.Paths) == 0 || len(r.Paths) > MaxRulePaths {
			return invalid("invalid_rules", "each rule has 1 to %d paths", MaxRulePaths)
		}
		for _, m := range r.Methods {
			if !methodRE.MatchString(m) {
				return invalid("invalid_rules", "%q is not an HTTP method in capitals", truncate(m, 16))
			}
		}
		for _, p := range r.Paths {
			if !canonicalPath(strings.TrimSuffix(p, "*")) || len(p) > maxPathLen || strings.Contains(strings.TrimSuffix(p, "/*"), "*") {
				return invalid("invalid_rules", "%q: paths are exact or end in /*, start with /, and have no . or .. segments, ; or \\ or encoded slash", truncate(p, 64))
			}
		}
	}
	return nil
}

// canonicalPath reports whether p is a path as rules are written and
// requests must be to be allowed: from /, no . or .. segments, no ; or \,
// no encoded slash, backslash or percent sign.
func canonicalPath(p string) bool {
	if !strings.HasPrefix(p, "/") || strings.ContainsAny(p, ";\\?#") {
		return false
	}
	low := strings.ToLower(p)
	if strings.Contains(low, "%2f") || strings.Contains(low, "%5c") || strings.Contains(low, "%25") || strings.Contains(low, "%2e") {
		return false
	}
	for _, seg := range strings.Split(p, "/")[1:] {
		if seg == "." || seg == ".." {
			return false
		}
	}
	return true
}

// checkScope refuses a scope that is malformed or too wide to hold.
func checkScope(s *Scope) error {
	if s == nil {
		return nil
	}
	if len(s.Labels) > MaxSelectors || len(s.Sandboxes) > MaxScopeIDs {
		return invalid("invalid_scope", "only: at most %d label selectors and %d sandbox ids", MaxSelectors, MaxScopeIDs)
	}
	for _, sel := range s.Labels {
		if len(sel) == 0 || len(sel) > MaxPairs {
			return invalid("invalid_scope", "each label selector has 1 to %d pairs", MaxPairs)
		}
		for k, v := range sel {
			if !labelRE.MatchString(k) || len(v) > 63 {
				return invalid("invalid_scope", "label %q is not a label key", truncate(k, 64))
			}
		}
	}
	for _, id := range s.Sandboxes {
		if id == "" || len(id) > 64 {
			return invalid("invalid_scope", "sandbox ids are 1 to 64 bytes")
		}
	}
	return nil
}

// checkHeader refuses a header name or format that cannot be sent.
func checkHeader(header, format string) error {
	if header == "" {
		if format != "" {
			return invalid("invalid_header", "format needs a header")
		}
		return nil
	}
	if len(header) > maxHeaderLen || !headerRE.MatchString(header) {
		return invalid("invalid_header", "header must be an HTTP header name")
	}
	if format != "" && (len(format) > maxFormatLen || strings.Count(format, "{value}") != 1 || strings.ContainsAny(format, "\r\n\x00")) {
		return invalid("invalid_header", "format holds {value} once, at most %d bytes, one line", maxFormatLen)
	}
	return nil
}

// HostMatches reports whether host (a name, lower-cased by the caller) is
// one of hosts: equal to a name, or under a *.domain (not the domain
// itself).
func HostMatches(hosts []string, host string) bool {
	for _, h := range hosts {
		if d, ok := strings.CutPrefix(h, "*."); ok {
			if strings.HasSuffix(host, "."+d) {
				return true
			}
		} else if h == host {
			return true
		}
	}
	return false
}

// allows reports whether the rules let a request of method to path carry
// the secret. No rules allow every request; a path that is not canonical
// is never allowed by a rule.
func allows(rules []Rule, method, path string) bool {
	if len(rules) == 0 {
		return true
	}
	if !canonicalPath(path) {
		return false
	}
	for _, r := range rules {
		if len(r.Methods) > 0 && !slices.Contains(r.Methods, method) {
			continue
		}
		for _, p := range r.Paths {
			if prefix, ok := strings.CutSuffix(p, "*"); ok {
				if strings.HasPrefix(path, prefix) {
					return true
				}
			} else if p == path {
				return true
			}
		}
	}
	return false
}

// InScope reports whether a sandbox of the secret's owner, with its id and
// labels, is one the secret reaches.
func (s *Secret) InScope(id string, labels map[string]string) bool {
	if s.Only == nil || (len(s.Only.Labels) == 0 && len(s.Only.Sandboxes) == 0) {
		return true
	}
	if slices.Contains(s.Only.Sandboxes, id) {
		return true
	}
	for _, sel := range s.Only.Labels {
		all := true
		for k, v := range sel {
			if labels[k] != v {
				all = false
				break
			}
		}
		if all {
			return true
		}
	}
	return false
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n]
}

// hostsWithin reports whether every host of narrow is one of wide's: the
// same name or pattern, a name under a pattern, or a pattern under one.
func hostsWithin(narrow, wide []string) bool {
	for _, h := range narrow {
		name := strings.TrimPrefix(h, "*.")
		if !slices.Contains(wide, h) && !HostMatches(wide, name) {
			return false
		}
	}
	return true
}

// rulesWithin reports whether narrow allows no request wide does not:
// each of its rules within one of wide's (no rules allow everything, so
// anything is within none, and none is within nothing else).
func rulesWithin(narrow, wide []Rule) bool {
	if len(wide) == 0 {
		return true
	}
	if len(narrow) == 0 {
		return false
	}
	for _, n := range narrow {
		if !slices.ContainsFunc(wide, func(w Rule) bool { return ruleWithin(n, w) }) {
			return false
		}
	}
	return true
}

func ruleWithin(n, w Rule) bool {
	if len(w.Methods) > 0 && (len(n.Methods) == 0 || slices.ContainsFunc(n.Methods, func(m string) bool { return !slices.Contains(w.Methods, m) })) {
		return false
	}
	for _, p := range n.Paths {
		covered := slices.ContainsFunc(w.Paths, func(wp string) bool {
			if prefix, ok := strings.CutSuffix(wp, "*"); ok {
				return strings.HasPrefix(strings.TrimSuffix(p, "*"), prefix)
			}
			return wp == p
		})
		if !covered {
			return false
		}
	}
	return true
}
