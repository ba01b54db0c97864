package main

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/emberbox/emberbox/internal/api"
)

func TestCheckDomains(t *testing.T) {
	for _, c := range []struct {
		preview, e2b string
		ok           bool
	}{
		{"", "", true},
		{"", "sandboxes.example.com", true},
		{"preview.example.com", "sandboxes.example.com", true},
		{"preview.example.com", "preview.example.com", false},
		{"preview.example.com", "PREVIEW.example.com.", false},
		{"preview.example.com", "e2b.preview.example.com", false},
		{"e2b.example.com", "example.com", false},
		{"", "sandboxes.localhost", false},
		{"https://preview.example.com:8443", "preview.example.com", false},
		{"preview.example.com/x", "", false},
	} {
		if err := checkDomains(c.preview, c.e2b); (err == nil) != c.ok {
			t.Errorf("--preview-domain %q --e2b-domain %q: %v, want ok %v", c.preview, c.e2b, err, c.ok)
		}
	}
}

// The listener's front sends a preview's host, and any name below the
// preview domain, to the previews and nothing else; everything else to
// the API's side.
func TestPreviewFront(t *testing.T) {
	_, previews := api.NewWithPreviews(api.Config{Manager: api.Manager{Sandboxes: nopManager{}, Power: nopManager{}, Switcher: nopManager{}, Snapshots: nopManager{}, Usage: nopManager{}, Guests: nopManager{}}, Keys: nopKeys{}})
	next := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Header().Set("X-Side", "api") })
	front := previewFront(previews, next)
	for _, c := range []struct {
		host, path string
		api        bool
	}{
		{"127.0.0.1:8080", "/console/", true},
		{"localhost:8080", "/v1/sandboxes", true},
		{"8000-0123456789abcdef0123.localhost:8080", "/console/", false},
		{"8000-0123456789abcdef0123.localhost:8080", "/v1/sandboxes", false},
		{"console.localhost:8080", "/console/", false},
	} {
		r := httptest.NewRequest("GET", c.path, nil)
		r.Host = c.host
		w := httptest.NewRecorder()
		front.ServeHTTP(w, r)
		if got := w.Header().Get("X-Side") == "api"; got != c.api {
			t.Errorf("%s%s: served by the API %v, want %v (%d %s)", c.host, c.path, got, c.api, w.Code, w.Body)
		}
	}
}

// nopManager and nopKeys are never called: the front decides by host.
type nopManager struct {
	api.Sandboxes
	api.Power
	api.Switcher
	api.Snapshots
	api.Usage
	api.Guests
}

type nopKeys struct{ api.Keys }
