package secrets

import (
	"context"
	"net/http"
	"strings"
	"sync"
	"time"
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
}

// Swapper returns the swapper of sandbox id: lookup reads its owner and
// labels (at most every few seconds), report is told of uses and
// refusals (the first ones, then every hundredth, per secret).
func (s *Service) Swapper(id string, lookup Lookup, report func(Use)) *Swapper {
	if report == nil {
		report = func(Use) {}
	}
	return &Swapper{svc: s, id: id, lookup: lookup, report: report, told: map[string]int{}}
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
