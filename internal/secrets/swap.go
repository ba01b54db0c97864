package secrets

import (
	"context"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/emberbox/emberbox/internal/egress"
)

// CredentialHeaders are the headers a placeholder is replaced in; in any
// other header, the URL or the body it travels as it is.
var CredentialHeaders = []string{"Authorization", "X-Api-Key", "X-Goog-Api-Key", "Api-Key", "X-Auth-Token",
	"Private-Token", "X-Access-Token", "X-Subscription-Token"}

// Use is one use or refusal of a secret by a sandbox's request: names
// and places, never the value.
type Use struct {
	SandboxID string
	Name      string
	Host      string
	Method    string
	Path      string
	Used      bool
	Reason    string // why it was refused: "rules"
}

// Lookup says who owns sandbox id and its labels, for scopes.
type Lookup func(ctx context.Context, id string) (owner string, labels map[string]string, err error)

// Swapper is a sandbox's secrets as its egress gate sees them
// (egress.Swapper): which hosts are intercepted, and each request's swap.
type Swapper struct {
	svc    *Service
	id     string
	lookup Lookup
	report func(Use)

	mu      sync.Mutex
	owner   string
	labels  map[string]string
	fetched time.Time
	told    map[string]int // uses and refusals reported, by name and outcome
	spent   map[string]*budget
}

// budget is what a sandbox spent of a secret's APIPolicy in the hour that
// began at start.
type budget struct {
	start         time.Time
	calls, writes int
}

// budgetWindow is the period a secret's APIPolicy counts over.
const budgetWindow = time.Hour

// Swapper returns the swapper of sandbox id: lookup reads its owner and
// labels (at most every few seconds), report is told of uses and
// refusals (the first ones, then every hundredth, per secret).
func (s *Service) Swapper(id string, lookup Lookup, report func(Use)) *Swapper {
	if report == nil {
		report = func(Use) {}
	}
	return &Swapper{svc: s, id: id, lookup: lookup, report: report, told: map[string]int{}, spent: map[string]*budget{}}
}

// lookupEvery bounds how stale a swapper's view of its sandbox's labels
// may be.
const lookupEvery = 2 * time.Second

// sandbox returns the sandbox's owner and labels.
func (sw *Swapper) sandbox() (string, map[string]string) {
	sw.mu.Lock()
	defer sw.mu.Unlock()
	if sw.owner == "" || time.Since(sw.fetched) > lookupEvery {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		owner, labels, err := sw.lookup(ctx, sw.id)
		cancel()
		if err == nil {
			sw.owner, sw.labels, sw.fetched = owner, labels, time.Now()
		}
	}
	return sw.owner, sw.labels
}

// reach returns the held secrets of the sandbox whose hosts hold host.
func (sw *Swapper) reach(host string) []*held {
	owner, labels := sw.sandbox()
	if owner == "" {
		return nil
	}
	host = strings.ToLower(strings.TrimSuffix(host, "."))
	var out []*held
	for _, h := range sw.svc.secretsOf(owner) {
		if HostMatches(h.Hosts, host) && h.InScope(sw.id, labels) {
			out = append(out, h)
		}
	}
	return out
}

// Intercepts implements egress.Swapper: TLS to a host one of the
// sandbox's secrets names is terminated at the gate, whatever the port.
func (sw *Swapper) Intercepts(host string, _ int) bool { return len(sw.reach(host)) > 0 }

// carries reports whether req would carry secret h: its placeholder is in
// a credential header, or it sets a header of its own.
func carries(h *held, req *http.Request) bool {
	if h.Header != "" {
		return true
	}
	for _, name := range CredentialHeaders {
		for _, v := range req.Header[http.CanonicalHeaderKey(name)] {
			if strings.Contains(v, h.Placeholder) {
				return true
			}
		}
	}
	return false
}

// isWrite reports whether a request of method counts as a write.
func isWrite(method string) bool {
	return method != http.MethodGet && method != http.MethodHead && method != http.MethodOptions
}

// Refuse implements egress.Refuser: a request that would carry a secret
// whose hour's budget the sandbox has spent is answered 429, with when
// the hour ends, and never sent.
func (sw *Swapper) Refuse(host string, req *http.Request) *egress.Answer {
	path := req.URL.EscapedPath()
	for _, h := range sw.reach(host) {
		if h.API == nil || !carries(h, req) || !allows(h.Rules, req.Method, path) {
			continue
		}
		if left, ok := sw.within(h, req.Method, false); !ok {
			sw.tell(Use{SandboxID: sw.id, Name: h.Name, Host: host, Method: req.Method, Path: path, Reason: "budget"})
			return &egress.Answer{RetryAfter: left,
				Message: "egress secret " + h.Name + ": this sandbox's calls or writes for the hour are spent"}
		}
	}
	return nil
}

// within reports whether a request of method fits h's budget this hour,
// counting it when spend is set, and how long until the hour ends.
func (sw *Swapper) within(h *held, method string, spend bool) (time.Duration, bool) {
	sw.mu.Lock()
	defer sw.mu.Unlock()
	now := time.Now()
	b := sw.spent[h.Name]
	if b == nil || now.Sub(b.start) >= budgetWindow {
		b = &budget{start: now}
		sw.spent[h.Name] = b
	}
	left := b.start.Add(budgetWindow).Sub(now)
	p := h.API
	if (p.CallsPerHour > 0 && b.calls >= p.CallsPerHour) || (p.WritesPerHour != nil && isWrite(method) && b.writes >= *p.WritesPerHour) {
		return left, false
	}
	if spend {
		b.calls++
		if isWrite(method) {
			b.writes++
		}
	}
	return left, true
}

// Swap implements egress.Swapper: in a request the secret's rules allow,
// its placeholder becomes its value in the credential headers, and its
// own header is set; in one they refuse, nothing changes.
func (sw *Swapper) Swap(host string, req *http.Request) {
	path := req.URL.EscapedPath()
	for _, h := range sw.reach(host) {
		present := false
		for _, name := range CredentialHeaders {
			for _, v := range req.Header[http.CanonicalHeaderKey(name)] {
				present = present || strings.Contains(v, h.Placeholder)
			}
		}
		if !present && h.Header == "" {
			continue
		}
		u := Use{SandboxID: sw.id, Name: h.Name, Host: host, Method: req.Method, Path: path}
		if !allows(h.Rules, req.Method, path) {
			u.Reason = "rules"
			sw.tell(u)
			continue
		}
		if h.API != nil {
			if _, ok := sw.within(h, req.Method, true); !ok {
				u.Reason = "budget" // spent between Refuse and here
				sw.tell(u)
				continue
			}
		}
		for _, name := range CredentialHeaders {
			vs := req.Header[http.CanonicalHeaderKey(name)]
			for i, v := range vs {
				vs[i] = strings.ReplaceAll(v, h.Placeholder, h.value)
			}
		}
		if h.Header != "" {
			req.Header.Set(h.Header, strings.Replace(h.Format, "{value}", h.value, 1))
		}
		u.Used = true
		sw.tell(u)
	}
}

// tell reports u: the first ten of a secret's uses (or refusals), then
// every hundredth.
func (sw *Swapper) tell(u Use) {
	key := u.Name + "/" + map[bool]string{true: "used", false: "refused"}[u.Used]
	sw.mu.Lock()
	sw.told[key]++
	n := sw.told[key]
	sw.mu.Unlock()
	if n <= 10 || n%100 == 0 {
		sw.report(u)
	}
}
