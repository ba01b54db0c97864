package ociimport

import (
	"net/http"
	"net/netip"

	"github.com/emberbox/emberbox/internal/egress"
	"github.com/emberbox/emberbox/internal/errdefs"
)

// GuardedTransport carries registry requests for tenants' image
// references (egress.GuardedTransport): without it, a reference such as
// 169.254.169.254/x:y would make the server fetch from its own network.
// --registry-allow-private opens private ranges, never cloud metadata.
func GuardedTransport(allowed func(netip.Addr) bool) http.RoundTripper {
	return egress.GuardedTransport(allowed, refusedAddr)
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
