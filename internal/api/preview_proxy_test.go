package api

import (
	"encoding/base64"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

// guestRecorder stands for a server in the guest behind a preview: it
// keeps every request's URL and headers and answers with answer.
type guestRecorder struct {
	mu     sync.Mutex
	seen   []*http.Request
	answer func(w http.ResponseWriter)
}

func (g *guestRecorder) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	g.mu.Lock()
	g.seen = append(g.seen, r.Clone(r.Context()))
	g.mu.Unlock()
	if g.answer != nil {
		g.answer(w)
	}
}

func (g *guestRecorder) requests() []*http.Request {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]*http.Request(nil), g.seen...)
}

// previewBehind makes a preview of port 8000 of a running sandbox of key
// a, served by g, and answers its URL and, if private, a token.
func previewBehind(t *testing.T, e *testEnv, g http.Handler, visibility string) (url, token string) {
	t.Helper()
	guest := httptest.NewServer(g)
	t.Cleanup(guest.Close)
	e.m.add("key_a", previewSandbox, "running", time.Hour)
	e.m.listen(previewSandbox, 8000, strings.TrimPrefix(guest.URL, "http://"))
	w := e.do("POST", "/v1/sandboxes/"+previewSandbox+"/previews", `{"port":8000,"visibility":"`+visibility+`"}`)
	if w.Code != http.StatusOK {
		t.Fatalf("create: %d %s", w.Code, w.Body)
	}
	p := decodeBody[previewJSON](t, w)
	if p.Token != nil {
		token = *p.Token
	}
	return p.URL, token
}

// A guest never sees a credential of ours, whoever it belongs to and
// whether or not it opened the preview: keys, E2B's tokens, preview
// tokens (header, query, cookie) and the console's key subprotocol.
func TestPreviewNeverForwardsCredentials(t *testing.T) {
	for _, vis := range []string{"public", "private"} {
		t.Run(vis, func(t *testing.T) {
			e := newEnv(t)
			g := &guestRecorder{}
			url, token := previewBehind(t, e, g, vis)
			wsKey := wsKeyPrefix + base64.RawURLEncoding.EncodeToString([]byte("secret-a"))
			secrets := []string{"secret-a", "secret-b", "e2b_key", "envd-token", "traffic-token", wsKey}
			all := []string{
				"Authorization", "Bearer secret-b", "X-Api-Key", "e2b_key", "X-Access-Token", "envd-token",
				"E2B-Traffic-Access-Token", "traffic-token", "Sec-WebSocket-Protocol", "chat.v2, " + wsKey,
				"X-Custom", "kept", "Cookie", "other=1",
			}
			// How each request is let in: a private preview by its token
			// (header, query, cookie) or the owner's key.
			ways := [][]string{{"Authorization", "Bearer secret-a"}}
			target := url + "p?x=1"
			if token != "" {
				secrets = append(secrets, token)
				ways = append(ways, []string{previewTokenHeader, token}, []string{"Cookie", previewCookie + "=" + token + "; other=1"}, nil)
			}
			for i, way := range ways {
				headers := append(append([]string(nil), all...), way...)
				tgt := target
				if way == nil {
					tgt += "&" + previewTokenQuery + "=" + token
				}
				if w := visitPreview(e, tgt, headers...); w.Code != http.StatusOK {
					t.Fatalf("way %d: %d %s", i, w.Code, w.Body)
				}
			}
			seen := g.requests()
			if len(seen) != len(ways) {
				t.Fatalf("the guest got %d requests, want %d", len(seen), len(ways))
			}
			for i, r := range seen {
				for _, k := range []string{"Authorization", "X-Api-Key", "X-Access-Token", "E2b-Traffic-Access-Token", previewTokenHeader} {
					if v := r.Header.Values(k); len(v) > 0 {
						t.Errorf("request %d: the guest saw %s: %q", i, k, v)
					}
				}
				dump := r.URL.String() + "\n"
				for k, vs := range r.Header {
					dump += k + ": " + strings.Join(vs, ", ") + "\n"
				}
				for _, s := range secrets {
					if strings.Contains(dump, s) {
						t.Errorf("request %d: the guest saw %q in\n%s", i, s, dump)
					}
				}
				// What is the guest's own passes.
				if r.Header.Get("X-Custom") != "kept" || r.Header.Get("Cookie") != "other=1" ||
					r.Header.Get("Sec-WebSocket-Protocol") != "chat.v2" || r.URL.RawQuery != "x=1" {
					t.Errorf("request %d: the guest's own headers did not pass:\n%s", i, dump)
				}
			}
		})
	}
}

// A guest's answer cannot widen a service worker's scope, set cookies for
// a parent domain or ours, or clear the site's data.
func TestPreviewConfinesAnswers(t *testing.T) {
	e := newEnv(t)
	g := &guestRecorder{answer: func(w http.ResponseWriter) {
		h := w.Header()
		h.Set("Service-Worker-Allowed", "/")
		h.Set("Clear-Site-Data", `"*"`)
		h.Add("Set-Cookie", "own=1; Path=/; HttpOnly")
		h.Add("Set-Cookie", "wide=1; Path=/; Domain=localhost")
		h.Add("Set-Cookie", "wide2=1; path=/; DOMAIN=.localhost")
		h.Add("Set-Cookie", previewCookie+"=forged; Path=/")
		h.Add("Set-Cookie", "domain=kept; Path=/")
		h.Set("X-Guest", "kept")
		_, _ = w.Write([]byte("ok"))
	}}
	url, _ := previewBehind(t, e, g, "public")
	w := visitPreview(e, url+"sw.js")
	if w.Code != http.StatusOK || w.Body.String() != "ok" || w.Header().Get("X-Guest") != "kept" {
		t.Fatalf("%d %s %v", w.Code, w.Body, w.Header())
	}
	for _, k := range []string{"Service-Worker-Allowed", "Clear-Site-Data"} {
		if v := w.Header().Values(k); len(v) > 0 {
			t.Errorf("%s passed: %q", k, v)
		}
	}
	if got := w.Header().Values("Set-Cookie"); strings.Join(got, "|") != "own=1; Path=/; HttpOnly|domain=kept; Path=/" {
		t.Errorf("Set-Cookie passed: %q", got)
	}
}

// A paused sandbox's preview is a page saying so, without waking it,
// unless its owner made it with autoWake.
func TestPausedPreview(t *testing.T) {
	e := newEnv(t)
	g := &guestRecorder{}
	url, _ := previewBehind(t, e, g, "public")
	e.m.mu.Lock()
	e.m.sandboxes[previewSandbox].State = "paused"
	e.m.sandboxes[previewSandbox].AutoWake = false
	e.m.mu.Unlock()
	w := visitPreview(e, url, "Accept", "text/html,application/xhtml+xml,*/*;q=0.8")
	if w.Code != http.StatusServiceUnavailable || !strings.HasPrefix(w.Header().Get("Content-Type"), "text/html") ||
		!strings.Contains(w.Body.String(), "This sandbox is paused") {
		t.Fatalf("a browser got %d %q: %s", w.Code, w.Header().Get("Content-Type"), w.Body)
	}
	if w := visitPreview(e, url); w.Code != http.StatusServiceUnavailable || errorOf(t, w).Code != "sandbox_paused" {
		t.Fatalf("a program got %d %s", w.Code, w.Body)
	}
	if sb, _ := e.m.Get(t.Context(), "key_a", previewSandbox); sb.State != "paused" || len(g.requests()) != 0 {
		t.Fatalf("visits woke it or reached the guest: %s, %d requests", sb.State, len(g.requests()))
	}
	// With autoWake the visit goes on to the guest, which wakes it (the
	// fake's guest refuses a paused sandbox instead).
	e.m.mu.Lock()
	e.m.sandboxes[previewSandbox].AutoWake = true
	e.m.mu.Unlock()
	if w := visitPreview(e, url, "Accept", "text/html"); strings.Contains(w.Body.String(), "This sandbox is paused") {
		t.Fatalf("autoWake: the paused page: %d", w.Code)
	}
}

// The API's host serves no preview, and a preview's host nothing else.
func TestPreviewHostsAndTheAPIHost(t *testing.T) {
	e := newEnv(t)
	g := &guestRecorder{}
	url, _ := previewBehind(t, e, g, "public")
	w := e.do("GET", "/preview/pv0123/", "")
	if w.Code != http.StatusMisdirectedRequest || errorOf(t, w).Code != "preview_moved" ||
		!strings.Contains(errorOf(t, w).Hint, "<port>-<sandboxId without sbx_>.localhost") {
		t.Errorf("GET /preview/ on the API's host: %d %s", w.Code, w.Body)
	}
	pv := Previews{s: e.s}
	for _, c := range []struct {
		host string
		id   string
		ok   bool
	}{
		{strings.TrimSuffix(strings.TrimPrefix(url, "http://"), "/"), previewSandbox, true},
		{"localhost:8080", "", false},
		{"127.0.0.1:8080", "", false},
		{"console.localhost:8080", "", true},
	} {
		r := httptest.NewRequest("GET", "/v1/sandboxes", nil)
		r.Host = c.host
		if id, ok := pv.Target(r); id != c.id || ok != c.ok {
			t.Errorf("Target(%q) = %q, %v; want %q, %v", c.host, id, ok, c.id, c.ok)
		}
	}
	// A name below the domain that is not a preview's is refused, as is
	// a preview that does not exist.
	for _, u := range []string{"http://console.localhost:8080/console/", "http://9999-" + hostLabelID(previewSandbox) + ".localhost/"} {
		if w := visitPreview(e, u); w.Code != http.StatusNotFound || errorOf(t, w).Code != "preview_not_found" {
			t.Errorf("%s: %d %s", u, w.Code, w.Body)
		}
	}
	// API paths on a preview's host are the guest's.
	if w := visitPreview(e, url+"v1/sandboxes", "Authorization", "Bearer secret-a"); w.Code != http.StatusOK {
		t.Fatalf("%d %s", w.Code, w.Body)
	}
	if seen := g.requests(); len(seen) != 1 || seen[0].URL.Path != "/v1/sandboxes" {
		t.Errorf("the guest saw %v", seen)
	}
}
