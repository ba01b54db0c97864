package api

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"
)

// TestEveryWithruntimeRouteIsKnown walks every route withruntime can call
// (testdata/withruntime_routes.txt, extracted from the SDK's source by
// tests/conformance/withruntime_routes.py, whose test checks the list is
// complete): each must answer as a route this server knows, served or the
// coded 501, never route_not_found or method_not_allowed. Ids are ones no
// sandbox has, so a served route answers its own not_found or validation
// error.
func TestEveryWithruntimeRouteIsKnown(t *testing.T) {
	f, err := os.Open("testdata/withruntime_routes.txt")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	e := newEnv(t)
	n := 0
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		method, tmpl, ok := strings.Cut(line, " ")
		if !ok || !strings.HasPrefix(tmpl, "/v1/") {
			t.Fatalf("bad line %q", line)
		}
		n++
		path := strings.ReplaceAll(tmpl, "{}", "x1")
		body := ""
		if method != "GET" && method != "HEAD" && method != "DELETE" {
			body = "{}"
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		r := httptest.NewRequestWithContext(ctx, method, path, strings.NewReader(body))
		r.Header.Set("Authorization", "Bearer secret-a")
		r.Header.Set("Content-Type", "application/json")
		w := httptest.NewRecorder()
		e.s.ServeHTTP(w, r)
		cancel()
		var eb struct {
			Error struct{ Code string } `json:"error"`
		}
		_ = json.Unmarshal(w.Body.Bytes(), &eb)
		if code := eb.Error.Code; code == "route_not_found" || code == "method_not_allowed" {
			t.Errorf("%s %s (the SDK's %s): %d %s", method, path, tmpl, w.Code, code)
		}
		if w.Code == 501 && !strings.HasSuffix(eb.Error.Code, "_unavailable") {
			t.Errorf("%s %s: 501 with code %q, want one ending in _unavailable", method, path, eb.Error.Code)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if n < 100 {
		t.Fatalf("only %d routes in the list; it is generated from the whole SDK", n)
	}
}
