package ociimage

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/netip"
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
