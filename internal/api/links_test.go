package api

import (
	"context"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/emberbox/emberbox/internal/links"
	"github.com/emberbox/emberbox/internal/sandbox"
)

type memGens struct {
	mu sync.Mutex
	g  map[string]int64
}

func (m *memGens) LinkGeneration(_ context.Context, id string) (int64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.g[id], nil
}

func (m *memGens) RevokeLinks(_ context.Context, id string) (int64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.g[id]++
	return m.g[id], nil
}

func newLinkEnv(t *testing.T) *testEnv {
	t.Helper()
	e := newEnv(t)
	sg, err := links.NewSigner([]byte(strings.Repeat("k", links.KeyBytes)), &memGens{g: map[string]int64{}}, func() time.Time { return e.s.now() })
	if err != nil {
		t.Fatal(err)
	}
	e.s.links = sg
	e.m.add("key_a", "sbx_r", sandbox.StateRunning, time.Hour)
	e.m.files["sbx_r\x00/workspace/a.txt"] = []byte("0123456789")
	return e
}

// linkPath makes a link and returns its path (the URL without its origin).
func (e *testEnv) linkPath(body string) string {
	e.t.Helper()
	w := e.do("POST", "/v1/sandboxes/sbx_r/files:link", body)
	if w.Code != 200 {
		e.t.Fatalf("link %s: %d %s", body, w.Code, w.Body)
	}
	got := decodeBody[map[string]any](e.t, w)
	u, err := url.Parse(got["url"].(string))
	if err != nil || u.Host != "example.com" || got["expiresAt"] == nil {
		e.t.Fatalf("link answered %v", got)
	}
	return u.Path
}

func TestLinkDownloadUploadRevoke(t *testing.T) {
	e := newLinkEnv(t)
	get := e.linkPath(`{"path":"/workspace/a.txt","method":"GET","expiresInSeconds":60}`)
	// Without a key.
	w := e.do("GET", get, "", "Authorization", "")
	if w.Code != 200 || w.Body.String() != "0123456789" || !strings.Contains(w.Header().Get("Content-Disposition"), "a.txt") {
		t.Fatalf("download: %d %q %v", w.Code, w.Body, w.Header())
	}
	w = e.do("GET", get, "", "Authorization", "", "Range", "bytes=2-4")
	if w.Code != 206 || w.Body.String() != "234" || w.Header().Get("Content-Range") != "bytes 2-4/10" {
		t.Fatalf("range: %d %q %v", w.Code, w.Body, w.Header())
	}
	if w := e.do("GET", get, "", "Authorization", "", "Range", "bytes=20-"); w.Code != 416 {
		t.Fatalf("unsatisfiable range: %d", w.Code)
	}
	if w := e.do("PUT", get, "x", "Authorization", ""); w.Code != 405 {
		t.Fatalf("a GET link used to PUT: %d %s", w.Code, w.Body)
	}
	put := e.linkPath(`{"path":"/workspace/up.bin","method":"PUT","maxBytes":5}`)
	if w := e.do("PUT", put, "hello", "Authorization", ""); w.Code != 200 {
		t.Fatalf("upload: %d %s", w.Code, w.Body)
	}
	if got := string(e.m.files["sbx_r\x00/workspace/up.bin"]); got != "hello" {
		t.Fatalf("uploaded %q", got)
	}
	if w := e.do("PUT", put, "toolong", "Authorization", ""); w.Code != 413 {
		t.Fatalf("over maxBytes: %d %s", w.Code, w.Body)
	}
	// Another key cannot make links of this sandbox, nor revoke them.
	if w := e.do("POST", "/v1/sandboxes/sbx_r/files:revoke-links", "", "Authorization", "Bearer secret-b"); w.Code != 404 {
		t.Fatalf("another key's revoke: %d", w.Code)
	}
	if w := e.do("POST", "/v1/sandboxes/sbx_r/files:revoke-links", ""); w.Code != 200 {
		t.Fatalf("revoke: %d %s", w.Code, w.Body)
	}
	for _, p := range []string{get, put} {
		w := e.do(map[bool]string{true: "GET", false: "PUT"}[p == get], p, "hello", "Authorization", "")
		if w.Code != 403 || errorOf(t, w).Code != links.CodeRevoked {
			t.Fatalf("after revoke %s: %d %s", p, w.Code, w.Body)
		}
	}
	if w := e.do("GET", "/v1/links/forged.token", "", "Authorization", ""); w.Code != 403 || errorOf(t, w).Code != links.CodeInvalid {
		t.Fatalf("forged: %d %s", w.Code, w.Body)
	}
	// A new link works after the revoke; a paused sandbox refuses it
	// (autoWake off) as its state does.
	again := e.linkPath(`{"path":"/workspace/a.txt"}`)
	e.m.mu.Lock()
	e.m.sandboxes["sbx_r"].State = sandbox.StatePaused
	e.m.mu.Unlock()
	if w := e.do("GET", again, "", "Authorization", ""); w.Code != 409 {
		t.Fatalf("paused: %d %s", w.Code, w.Body)
	}
}

func TestLinkRequestChecks(t *testing.T) {
	e := newLinkEnv(t)
	for _, body := range []string{`{}`, `{"path":"/a","method":"POST"}`, `{"path":"/a","expiresInSeconds":604801}`,
		`{"path":"/a","expiresInSeconds":0}`, `{"path":"/a","filename":"x/y"}`, `{"path":"/a","method":"PUT","archive":true}`,
		`{"path":"/a","maxBytes":3}`} {
		if w := e.do("POST", "/v1/sandboxes/sbx_r/files:link", body); w.Code != 400 {
			t.Errorf("%s: %d %s", body, w.Code, w.Body)
		}
	}
	if w := e.do("POST", "/v1/sandboxes/sbx_nope/files:link", `{"path":"/a"}`); w.Code != 404 {
		t.Fatalf("no such sandbox: %d", w.Code)
	}
}

func TestParseRange(t *testing.T) {
	for _, c := range []struct {
		spec     string
		start, n int64
		ok       bool
	}{{"bytes=0-", 0, 10, true}, {"bytes=-3", 7, 3, true}, {"bytes=5-100", 5, 5, true}, {"bytes=3-2", 0, 0, false},
		{"bytes=10-", 0, 0, false}, {"bytes=0-1,3-4", 0, 0, false}, {"lines=1-2", 0, 0, false}, {"bytes=-0", 0, 0, false}} {
		start, n, ok := parseRange(c.spec, 10)
		if ok != c.ok || (ok && (start != c.start || n != c.n)) {
			t.Errorf("%s: %d %d %v", c.spec, start, n, ok)
		}
	}
}
