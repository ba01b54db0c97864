package api

import (
	"encoding/json"
	"regexp"
	"strings"
	"testing"
)

// TestOpenAPIListsEveryRoute derives its expectations from the route table.
func TestOpenAPIListsEveryRoute(t *testing.T) {
	e := newEnv(t)
	w := e.do("GET", "/v1/openapi.json", "", "Authorization", "") // public
	if w.Code != 200 {
		t.Fatalf("status %d", w.Code)
	}
	var doc struct {
		OpenAPI string                                `json:"openapi"`
		Paths   map[string]map[string]json.RawMessage `json:"paths"`
	}
	if err := json.Unmarshal(w.Body.Bytes(), &doc); err != nil {
		t.Fatalf("not JSON: %v", err)
	}
	if doc.OpenAPI != "3.1.0" {
		t.Errorf("openapi %q", doc.OpenAPI)
	}
	ops := 0
	for _, item := range doc.Paths {
		ops += len(item)
	}
	if ops != len(e.s.routes) {
		t.Errorf("document has %d operations, route table %d", ops, len(e.s.routes))
	}
	ids := map[string]bool{}
	for _, rt := range e.s.routes {
		if _, ok := doc.Paths[rt.Path][strings.ToLower(rt.Method)]; !ok {
			t.Errorf("document lacks %s %s", rt.Method, rt.Path)
		}
		if ids[rt.OpID] {
			t.Errorf("operationId %s twice", rt.OpID)
		}
		ids[rt.OpID] = true
	}
}

// TestEveryRouteIsServed sends each route of the table and checks the mux
// reaches a handler (no route_not_found or method_not_allowed).
func TestEveryRouteIsServed(t *testing.T) {
	wild := regexp.MustCompile(`\{[a-z]+\}`)
	for _, rt := range newEnv(t).s.routes {
		t.Run(rt.Method+" "+rt.Path, func(t *testing.T) {
			e := newEnv(t)
			target := wild.ReplaceAllString(rt.Path, "zz1")
			body := ""
			if rt.Body != nil {
				body = "{}"
			}
			w := e.do(rt.Method, target, body)
			if w.Code == 404 || w.Code == 405 {
				if code := errorOf(t, w).Code; code == "route_not_found" || code == "method_not_allowed" {
					t.Errorf("%s %s: %s", rt.Method, target, code)
				}
			}
			if !rt.Public {
				w := e.do(rt.Method, target, body, "Authorization", "")
				if w.Code != 401 {
					t.Errorf("without a key: %d, want 401", w.Code)
				}
			}
		})
	}
}
