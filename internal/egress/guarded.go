package egress

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"syscall"
	"time"
)

// GuardedTransport carries the server's own requests to addresses a
// tenant names (an image registry, a webhook's URL) without letting them
// reach what only the server can: every address the name resolves to, and
// every address actually dialled, must pass allowed (callers pass the
// egress rules' refusal of loopback, private, link-local and the host's
// own addresses, unless the operator lifts it). The operator's proxy
// (HTTPS_PROXY, as the server's environment sets it) is dialled as it is:
// the operator chose it, and the target's own name is checked before the
// request goes to it. Cloud metadata addresses are refused whatever
// allowed says. refused makes the error for a refused address: what names
// it, metadata says it is a metadata address.
func GuardedTransport(allowed func(netip.Addr) bool, refused func(what string, metadata bool) error) *http.Transport {
	allowed = withoutMetadata(allowed)
	base := http.DefaultTransport.(*http.Transport).Clone()
	dialer := &net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}
	proxies := map[string]bool{} // host:port of the proxies in the environment
	for _, scheme := range []string{"https", "http"} {
		if u, err := base.Proxy(&http.Request{URL: &url.URL{Scheme: scheme, Host: "target.example"}}); err == nil && u != nil {
			proxies[hostPort(u)] = true
		}
	}
	guarded := &net.Dialer{Timeout: dialer.Timeout, KeepAlive: dialer.KeepAlive,
		Control: func(network, address string, _ syscall.RawConn) error {
			ap, err := netip.ParseAddrPort(address)
			if err != nil || !allowed(ap.Addr()) {
				return refused(address, err == nil && Metadata(ap.Addr()))
			}
			return nil
		}}
	base.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		if proxies[addr] {
			return dialer.DialContext(ctx, network, addr)
		}
		return guarded.DialContext(ctx, network, addr)
	}
	// The name is checked before a proxy sees it: through a proxy, the
	// dial above never sees the target's address.
	base.Proxy = func(req *http.Request) (*url.URL, error) {
		host := req.URL.Hostname()
		addrs, err := net.DefaultResolver.LookupNetIP(req.Context(), "ip", host)
		if err != nil {
			return nil, fmt.Errorf("resolving %s: %w", host, err)
		}
		for _, a := range addrs {
			if !allowed(a.Unmap()) {
				return nil, refused(host+" ("+a.String()+")", Metadata(a))
			}
		}
		return http.ProxyFromEnvironment(req)
	}
	return base
}

// withoutMetadata is allowed refusing cloud metadata addresses too.
func withoutMetadata(allowed func(netip.Addr) bool) func(netip.Addr) bool {
	return func(a netip.Addr) bool { return !Metadata(a) && allowed(a) }
}

func hostPort(u *url.URL) string {
	port := u.Port()
	if port == "" {
		port = map[string]string{"http": "80", "https": "443"}[u.Scheme]
	}
	return net.JoinHostPort(u.Hostname(), port)
}
