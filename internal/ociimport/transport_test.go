package ociimport

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"

	"github.com/emberbox/emberbox/internal/errdefs"
)

// A registry on a loopback address is refused before any request leaves,
// and reached when the rule allows it.
func TestGuardedTransport(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusTeapot) }))
	defer srv.Close()
	t.Setenv("HTTP_PROXY", "")
	t.Setenv("http_proxy", "")
	t.Setenv("NO_PROXY", "*")
	hits := 0
	refuseLoopback := func(a netip.Addr) bool { hits++; return !a.IsLoopback() }
	req, _ := http.NewRequestWithContext(context.Background(), "GET", srv.URL+"/v2/", nil)
	if _, err := GuardedTransport(refuseLoopback).RoundTrip(req); errdefs.Code(err) != "registry_forbidden" {
		t.Fatalf("loopback registry: %v, want registry_forbidden", err)
	}
	if hits == 0 {
		t.Fatal("the rule was never asked")
	}
	resp, err := GuardedTransport(func(netip.Addr) bool { return true }).RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusTeapot {
		t.Errorf("allowed registry answered %d", resp.StatusCode)
	}
}

// Cloud metadata addresses are refused even by a rule that allows every
// address (--registry-allow-private), in every IPv6 form that reaches them,
// before anything is dialled.
func TestGuardedTransportRefusesMetadata(t *testing.T) {
	asked := map[netip.Addr]bool{}
	allowAll := func(a netip.Addr) bool { asked[a] = true; return true }
	for _, host := range []string{"169.254.169.254", "168.63.129.16", "169.254.170.2", "[fd00:ec2::254]",
		"[::ffff:169.254.169.254]", "[64:ff9b::a9fe:a9fe]", "[2002:a9fe:a9fe::1]"} {
		req, _ := http.NewRequestWithContext(context.Background(), "GET", "http://"+host+"/v2/", nil)
		_, err := GuardedTransport(allowAll).RoundTrip(req)
		if errdefs.Code(err) != "registry_forbidden" || !strings.Contains(err.Error(), "metadata") {
			t.Errorf("registry %s with every address allowed: %v, want registry_forbidden naming metadata", host, err)
		}
	}
	if len(asked) != 0 {
		t.Errorf("the operator's rule was asked about %v: metadata must be refused before it", asked)
	}
}
