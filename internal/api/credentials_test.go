package api

import (
	"net/http/httptest"
	"testing"
)

// StripCredentials removes every credential of ours, whatever its case or
// place, and keeps what is the guest's.
func TestStripCredentials(t *testing.T) {
	r := httptest.NewRequest("GET", "/p?runtime_preview_token=tok&keep=1", nil)
	for k, v := range map[string]string{
		"authorization": "Bearer k", "x-api-key": "k", "X-API-KEY": "k", "x-access-token": "t",
		"E2B-Traffic-Access-Token": "t", "x-runtime-preview-token": "t", "X-Mine": "kept",
		"Cookie":                 "runtime_preview_token=t; session=kept",
		"Sec-WebSocket-Protocol": "EmberBox.Key.a2V5, graphql-ws",
	} {
		r.Header.Add(k, v)
	}
	StripCredentials(r)
	for _, h := range []string{"Authorization", "X-Api-Key", "X-Access-Token", "E2b-Traffic-Access-Token", "X-Runtime-Preview-Token"} {
		if v := r.Header.Values(h); len(v) != 0 {
			t.Errorf("%s left: %q", h, v)
		}
	}
	if q := r.URL.Query(); q.Has("runtime_preview_token") || q.Get("keep") != "1" {
		t.Errorf("query %q", r.URL.RawQuery)
	}
	if c := r.Header.Get("Cookie"); c != "session=kept" {
		t.Errorf("Cookie %q, want only the guest's", c)
	}
	if p := r.Header.Get("Sec-WebSocket-Protocol"); p != "graphql-ws" {
		t.Errorf("Sec-WebSocket-Protocol %q, want only the guest's", p)
	}
	if r.Header.Get("X-Mine") != "kept" {
		t.Error("a header of the guest's was removed")
	}
}
