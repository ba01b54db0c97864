package e2b

import (
	"net/http/httptest"
	"testing"
)

// Target names the sandbox of every form of E2B request a cluster routes,
// and says which make one.
func TestTarget(t *testing.T) {
	h := &Handler{cfg: Config{Domain: "e2b.example"}}
	for _, c := range []struct {
		method, url, header string
		id                  string
		create              bool
	}{
		{"POST", "http://x/process.Process/Start", "sbx_1", "sbx_1", false},
		{"GET", "http://49983-sbx_2.e2b.example/files?path=/x", "", "sbx_2", false},
		{"GET", "http://49983-sbx_2.other.example/files", "", "", false},
		{"POST", "http://x/sandboxes", "", "", true},
		{"POST", "http://x/v2/sandboxes", "", "", true},
		{"GET", "http://x/sandboxes", "", "", false},
		{"GET", "http://x/v2/sandboxes", "", "", false},
		{"GET", "http://x/sandboxes/sbx_3", "", "sbx_3", false},
		{"POST", "http://x/sandboxes/sbx_3/connect", "", "sbx_3", false},
		{"POST", "http://x/v2/sandboxes/sbx_4/connect", "", "sbx_4", false},
		{"DELETE", "http://x/sandboxes/sbx_5", "", "sbx_5", false},
		{"GET", "http://x/sandboxesX", "", "", false},
		{"GET", "http://x/v1/sandboxes/sbx_6", "", "", false},
		{"GET", "http://x/templates", "", "", false},
	} {
		r := httptest.NewRequest(c.method, c.url, nil)
		if c.header != "" {
			r.Header.Set(headerSandboxID, c.header)
		}
		id, create := h.Target(r)
		if id != c.id || create != c.create {
			t.Errorf("%s %s (header %q): Target = %q, %v; want %q, %v", c.method, c.url, c.header, id, create, c.id, c.create)
		}
	}
}
