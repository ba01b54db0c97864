package console

import (
	"io/fs"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

func get(t *testing.T, method, path string) *httptest.ResponseRecorder {
	t.Helper()
	w := httptest.NewRecorder()
	Handler().ServeHTTP(w, httptest.NewRequest(method, path, nil))
	return w
}

func TestServesAssets(t *testing.T) {
	for path, want := range map[string]string{
		"/console/":                          "text/html; charset=utf-8",
		"/console/index.html":                "text/html; charset=utf-8",
		"/console/app.js":                    "text/javascript; charset=utf-8",
		"/console/console.css":               "text/css; charset=utf-8",
		"/console/favicon.svg":               "image/svg+xml",
		"/console/vendor/xterm/xterm.js":     "text/javascript; charset=utf-8",
		"/console/vendor/xterm/addon-fit.js": "text/javascript; charset=utf-8",
		"/console/vendor/xterm/xterm.css":    "text/css; charset=utf-8",
	} {
		w := get(t, "GET", path)
		if w.Code != http.StatusOK {
			t.Fatalf("%s: %d", path, w.Code)
		}
		if got := w.Header().Get("Content-Type"); got != want {
			t.Errorf("%s: Content-Type %q, want %q", path, got, want)
		}
		if w.Body.Len() == 0 {
			t.Errorf("%s: empty", path)
		}
		for h, v := range map[string]string{
			"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff",
			"X-Frame-Options": "DENY", "Referrer-Policy": "no-referrer",
		} {
			if got := w.Header().Get(h); got != v {
				t.Errorf("%s: %s %q, want %q", path, h, got, v)
			}
		}
	}
	if w := get(t, "HEAD", "/console/app.js"); w.Code != http.StatusOK {
		t.Errorf("HEAD: %d", w.Code)
	}
}

func TestCSPIsStrict(t *testing.T) {
	directives := map[string]string{}
	for d := range strings.SplitSeq(CSP, ";") {
		name, value, _ := strings.Cut(strings.TrimSpace(d), " ")
		directives[name] = value
	}
	for name, want := range map[string]string{
		"default-src": "'none'", "script-src": "'self'", "connect-src": "'self'",
		"frame-ancestors": "'none'", "base-uri": "'none'",
	} {
		if directives[name] != want {
			t.Errorf("%s is %q, want %q", name, directives[name], want)
		}
	}
	if strings.Contains(directives["script-src"], "unsafe") {
		t.Error("script-src admits unsafe scripts")
	}
}

func TestRefuses(t *testing.T) {
	for _, path := range []string{
		"/console/nope.js", "/console/../console.go", "/console/static/app.js", "/console/vendor/xterm/LICENSE",
		"/console/vendor/xterm/VERSIONS", "/console//app.js", "/console/./app.js", "/console/vendor/",
	} {
		if w := get(t, "GET", path); w.Code != http.StatusNotFound {
			t.Errorf("%s: %d, want 404", path, w.Code)
		}
	}
	if w := get(t, "POST", "/console/"); w.Code != http.StatusMethodNotAllowed {
		t.Errorf("POST: %d", w.Code)
	}
}

// TestNoThirdPartyRequests: nothing the console serves names another
// origin it could load from. The vendored xterm.js names only XML
// namespaces and a documentation link in its messages.
func TestNoThirdPartyRequests(t *testing.T) {
	urlRE := regexp.MustCompile(`(?i)(?:https?:|wss?:)?//[a-z0-9.-]+\.[a-z]{2,}[^\s"'` + "`" + `)]*`)
	allowed := map[string]bool{
		"http://www.w3.org/1999/xhtml": true, "http://www.w3.org/2000/svg": true,
		"https://developer.mozilla.org/en-US/docs/Web/Security/Secure_Contexts": true,
		// Credits in xterm.css's comments.
		"https://github.com/chjj/term.js": true, "http://bellard.org/jslinux/": true,
	}
	n := 0
	err := fs.WalkDir(files, "static", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		if _, served := contentTypes[filepath.Ext(path)]; !served {
			return nil // licences and notes: never served
		}
		n++
		b, err := fs.ReadFile(files, path)
		if err != nil {
			return err
		}
		for _, u := range urlRE.FindAllString(string(b), -1) {
			if !allowed[u] {
				t.Errorf("%s names %q", path, u)
			}
		}
		if strings.Contains(string(b), "sourceMappingURL") {
			t.Errorf("%s points at a source map that is not shipped", path)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if n < 7 {
		t.Fatalf("only %d embedded files", n)
	}
}

// TestPageLoadsOnlyOwnScripts: the page has no inline script or style and
// loads what it loads from relative paths.
func TestPageLoadsOnlyOwnScripts(t *testing.T) {
	page := get(t, "GET", "/console/").Body.String()
	if regexp.MustCompile(`<script(?:\s+[^>]*)?>\s*[^<\s]`).MatchString(page) {
		t.Error("index.html has an inline script")
	}
	if strings.Contains(page, "<style") || strings.Contains(page, " on") && regexp.MustCompile(`\son[a-z]+=`).MatchString(page) {
		t.Error("index.html has inline style or event handler attributes")
	}
	srcs := regexp.MustCompile(`(?:src|href)="([^"]+)"`).FindAllStringSubmatch(page, -1)
	if len(srcs) < 5 {
		t.Fatalf("found %d references", len(srcs))
	}
	for _, m := range srcs {
		ref := m[1]
		if strings.HasPrefix(ref, "#") {
			continue // the app's own routes
		}
		if strings.Contains(ref, ":") || strings.HasPrefix(ref, "/") {
			t.Errorf("index.html references %q, not a relative path", ref)
			continue
		}
		if w := get(t, "GET", Prefix+ref); w.Code != http.StatusOK {
			t.Errorf("index.html references %q, which answers %d", ref, w.Code)
		}
	}
}
