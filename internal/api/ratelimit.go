package api

import (
	"errors"
	"net"
	"net/http"
	"net/netip"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// Rate is a token bucket: PerSecond requests on average, Burst at once. A
// zero PerSecond is no limit.
type Rate struct {
	PerSecond float64
	Burst     int
}

// RateLimits are the per-caller request rates. Every route is counted: a
// key's requests by its key id, requests to public routes by the client's
// address, and failed authentications by the client's address as well,
// checked before a key is looked up, so that a flood of wrong keys costs
// neither hashing nor a database read.
type RateLimits struct {
	Read     Rate // GET and HEAD, per key (public routes: per address)
	Write    Rate // every other method, per key: creates, execs, file writes
	AuthFail Rate // failed authentications, per address
	// MaxTracked bounds the callers remembered per kind of bucket (default
	// 10000); callers beyond it share one bucket until idle ones are
	// forgotten.
	MaxTracked int
}

// limiterSweep is how often idle buckets are looked for.
const limiterSweep = time.Minute

// limiters is one kind of bucket, per caller. A bucket that has been idle
// long enough to be full again is forgotten, as a new one would be the
// same: the map holds only callers seen within the refill time.
type limiters struct {
	limit rate.Limit
	burst int
	idle  time.Duration // time for an empty bucket to fill
	max   int

	mu       sync.Mutex
	m        map[string]*limiterEntry
	overflow *rate.Limiter
	swept    time.Time
}

type limiterEntry struct {
	lim  *rate.Limiter
	last time.Time
}

func newLimiters(r Rate, max int) *limiters {
	if r.PerSecond <= 0 {
		return nil
	}
	burst := max1(r.Burst)
	if max <= 0 {
		max = 10000
	}
	return &limiters{
		limit: rate.Limit(r.PerSecond), burst: burst, max: max,
		idle:     time.Duration(float64(burst) / r.PerSecond * float64(time.Second)),
		m:        map[string]*limiterEntry{},
		overflow: rate.NewLimiter(rate.Limit(r.PerSecond), burst),
	}
}

func max1(n int) int {
	if n < 1 {
		return 1
	}
	return n
}

// get returns the bucket of key; the caller holds l.mu.
func (l *limiters) get(key string, now time.Time) *rate.Limiter {
	if now.Sub(l.swept) >= limiterSweep || (len(l.m) >= l.max && l.m[key] == nil) {
		l.sweep(now)
	}
	e := l.m[key]
	if e == nil {
		if len(l.m) >= l.max {
			return l.overflow
		}
		e = &limiterEntry{lim: rate.NewLimiter(l.limit, l.burst)}
		l.m[key] = e
	}
	e.last = now
	return e.lim
}

func (l *limiters) sweep(now time.Time) {
	l.swept = now
	for k, e := range l.m {
		if now.Sub(e.last) >= l.idle {
			delete(l.m, k)
		}
	}
}

// allow takes a token from key's bucket, or reports how long until one is
// there.
func (l *limiters) allow(key string, now time.Time) (bool, time.Duration) {
	if l == nil {
		return true, 0
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	lim := l.get(key, now)
	if lim.AllowN(now, 1) {
		return true, 0
	}
	return false, l.wait(lim, now)
}

// empty reports whether key's bucket has no token left, without taking
// one, and how long until it has.
func (l *limiters) empty(key string, now time.Time) (bool, time.Duration) {
	if l == nil {
		return false, 0
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	e := l.m[key]
	if e == nil || e.lim.TokensAt(now) >= 1 {
		return false, 0
	}
	return true, l.wait(e.lim, now)
}

func (l *limiters) wait(lim *rate.Limiter, now time.Time) time.Duration {
	need := 1 - lim.TokensAt(now)
	return max(time.Millisecond, time.Duration(need/float64(l.limit)*float64(time.Second)))
}

func (l *limiters) size() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.m)
}

// rateLimiter holds the buckets of a server.
type rateLimiter struct {
	read, write, authFail *limiters
}

func newRateLimiter(rl RateLimits) *rateLimiter {
	return &rateLimiter{
		read:     newLimiters(rl.Read, rl.MaxTracked),
		write:    newLimiters(rl.Write, rl.MaxTracked),
		authFail: newLimiters(rl.AuthFail, rl.MaxTracked),
	}
}

// errRateLimited is the answer to a request over its bucket's rate.
func errRateLimited(wait time.Duration, what string) *apiError {
	e := newError(http.StatusTooManyRequests, "rate_limited", "Too many requests"+what+"; slow down.").
		withHint("Wait for retryAfterMs (or Retry-After) before the next request.")
	e.RetryAfterMs = max(1, wait.Milliseconds())
	return e
}

// clientAddr names the caller's address for its buckets: the IP the
// connection comes from (never a forwarded header, which the caller
// writes), IPv6 by its /64, which one host usually has whole.
func clientAddr(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		host = r.RemoteAddr
	}
	ip, err := netip.ParseAddr(host)
	if err != nil {
		return "local" // a unix socket or a test
	}
	ip = ip.Unmap()
	if ip.Is6() {
		p, _ := ip.Prefix(64)
		return p.String()
	}
	return ip.String()
}

// gate authenticates the request unless its route is public and counts it
// against its caller's bucket: by key, or by address for public routes and
// failed authentications.
func (s *server) gate(r *http.Request, rt *route, c *call) error {
	now := s.now()
	addr := clientAddr(r)
	if !rt.Public {
		// An address that keeps failing is refused before its key is
		// looked up.
		if empty, wait := s.limits.authFail.empty(addr, now); empty {
			return errRateLimited(wait, " with invalid keys from this address")
		}
		key, err := s.authenticate(r)
		if err != nil {
			if ae := (*apiError)(nil); errors.As(err, &ae) && ae.Status == http.StatusUnauthorized {
				s.limits.authFail.allow(addr, now)
			}
			return err
		}
		c.owner, c.role = key.ID, key.Role
	}
	bucket, who := s.limits.write, c.owner
	if r.Method == http.MethodGet || r.Method == http.MethodHead {
		bucket = s.limits.read
	}
	if rt.Public {
		bucket, who = s.limits.read, addr
	}
	if ok, wait := bucket.allow(who, now); !ok {
		return errRateLimited(wait, "")
	}
	return nil
}

// RateLimiter is a server's buckets for a front beside the API on the same
// listener (E2B's), which authenticates in its own way but must count a
// caller's requests and failed authentications in the same buckets as the
// API does: whichever door a client uses, its rate is one.
type RateLimiter struct {
	l   *rateLimiter
	now func() time.Time
}

// NewRateLimiter returns the buckets of rl; hand it to Config.Limiter and
// to the other front.
func NewRateLimiter(rl RateLimits) *RateLimiter {
	return &RateLimiter{l: newRateLimiter(rl), now: time.Now}
}

// AuthBlocked reports whether r's address has failed authentication too
// often to be heard now, and how long until it may try again. It is asked
// before r's credentials are looked at, as the API's gate does.
func (rl *RateLimiter) AuthBlocked(r *http.Request) (bool, time.Duration) {
	return rl.l.authFail.empty(clientAddr(r), rl.now())
}

// AuthFailed counts a failed authentication against r's address.
func (rl *RateLimiter) AuthFailed(r *http.Request) {
	rl.l.authFail.allow(clientAddr(r), rl.now())
}

// Allow takes a token for r from key keyID's bucket (reads or writes by
// r's method) or reports how long until one is there.
func (rl *RateLimiter) Allow(r *http.Request, keyID string) (bool, time.Duration) {
	bucket := rl.l.write
	if r.Method == http.MethodGet || r.Method == http.MethodHead {
		bucket = rl.l.read
	}
	return bucket.allow(keyID, rl.now())
}
