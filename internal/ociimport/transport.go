package ociimport

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"syscall"
	"time"

	"github.com/emberbox/emberbox/internal/egress"
	"github.com/emberbox/emberbox/internal/errdefs"
)

// GuardedTransport carries registry requests for tenants' image
// references without letting them reach what only the server can: every
// address a registry's name resolves to, and every address actually
// dialled, must pass allowed (the server's egress rules refuse loopback,
// private, link-local and the host's own addresses). The operator's proxy
// (HTTPS_PROXY, as the server's environment sets it) is dialled as it is:
// the operator chose it, and the registry's own name is checked before the
// request goes to it. Without this, a reference such as
// 169.254.169.254/x:y would make the server fetch from its own network.
// Cloud metadata addresses are refused whatever allowed says
// (--registry-allow-private opens private ranges, never these).
func GuardedTransport(allowed func(netip.Addr) bool) http.RoundTripper {
	allowed = withoutMetadata(allowed)
	base := http.DefaultTransport.(*http.Transport).Clone()
	dialer := &net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}
	proxies := map[string]bool{} // host:port of the proxies in the environment
	for _, scheme := range []string{"https", "http"} {
		if u, err := base.Proxy(&http.Request{URL: &url.URL{Scheme: scheme, Host: "registry.example"}}); err == nil && u != nil {
			proxies[hostPort(u)] = true
		}
	}
	guarded := &net.Dialer{Timeout: dialer.Timeout, KeepAlive: dialer.KeepAlive,
		Control: func(network, address string, _ syscall.RawConn) error {
			ap, err := netip.ParseAddrPort(address)
			if err != nil || !allowed(ap.Addr()) {
				return refusedAddr(address, err == nil && egress.Metadata(ap.Addr()))
			}
			return nil
		}}
	base.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		if proxies[addr] {
			return dialer.DialContext(ctx, network, addr)
		}
		return guarded.DialContext(ctx, network, addr)
	}
	return &guardedTransport{base: base, allowed: allowed}
}

type guardedTransport struct {
	base    http.RoundTripper
	allowed func(netip.Addr) bool
}

func (t *guardedTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	host := req.URL.Hostname()
	addrs, err := net.DefaultResolver.LookupNetIP(req.Context(), "ip", host)
	if err != nil {
		return nil, fmt.Errorf("resolving registry %s: %w", host, err)
	}
	for _, a := range addrs {
		if !t.allowed(a.Unmap()) {
			return nil, refusedAddr(host+" ("+a.String()+")", egress.Metadata(a))
		}
	}
	return t.base.RoundTrip(req)
}

// withoutMetadata is allowed refusing cloud metadata addresses too.
func withoutMetadata(allowed func(netip.Addr) bool) func(netip.Addr) bool {
	return func(a netip.Addr) bool { return !egress.Metadata(a) && allowed(a) }
}

func refusedAddr(what string, metadata bool) error {
	if metadata {
		return errdefs.New(errdefs.ErrInvalidArgument, "registry_forbidden",
			"registry %s is a cloud metadata address, which this server never reaches for tenants", what).
			WithHint("use a public registry, or upload the image (docker save or an OCI layout) as an archive")
	}
	return errdefs.New(errdefs.ErrInvalidArgument, "registry_forbidden",
		"registry %s is on a private, loopback or link-local address this server does not reach for tenants", what).
		WithHint("use a public registry, or upload the image (docker save or an OCI layout) as an archive; the operator can allow private registries with --registry-allow-private")
}

func hostPort(u *url.URL) string {
	port := u.Port()
	if port == "" {
		port = map[string]string{"http": "80", "https": "443"}[u.Scheme]
	}
	return net.JoinHostPort(u.Hostname(), port)
}
