package api

import (
	"bufio"
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"github.com/emberbox/emberbox/internal/volumes"
	"github.com/emberbox/emberbox/internal/volumes/volumestest"
	"mime"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/emberbox/emberbox/internal/computer"
	"github.com/emberbox/emberbox/internal/egress"
	"github.com/emberbox/emberbox/internal/guest"
	"github.com/emberbox/emberbox/internal/interpreter"
	"github.com/emberbox/emberbox/internal/links"
	"github.com/emberbox/emberbox/internal/sandbox"
	"github.com/emberbox/emberbox/internal/secrets"
	"github.com/emberbox/emberbox/internal/store"
	"github.com/emberbox/emberbox/internal/upload"
	"github.com/emberbox/emberbox/internal/webhook"
)

// fuzzManager adds egress policies to fakeManager, so the network routes
// answer too.
type fuzzManager struct{ *fakeManager }

// roles returns the Manager whose every role is m.
func (m fuzzManager) roles() Manager {
	return Manager{Sandboxes: m, Power: m, Switcher: m, Snapshots: m, Usage: m, Guests: m, Checkpoints: m}
}

func (m fuzzManager) Network(ctx context.Context, owner, id string) (*sandbox.NetworkStatus, error) {
	if _, err := m.Get(ctx, owner, id); err != nil {
		return nil, err
	}
	return &sandbox.NetworkStatus{SandboxID: id, Network: sandbox.Network{Policy: egress.Policy{Internet: true}, Version: 1}, Enforced: true, EnforcedVersion: 1}, nil
}

func (m fuzzManager) SetNetwork(ctx context.Context, owner, id string, p egress.Policy) (*sandbox.NetworkStatus, error) {
	if _, err := m.Get(ctx, owner, id); err != nil {
		return nil, err
	}
	return &sandbox.NetworkStatus{SandboxID: id, Network: sandbox.Network{Policy: p, Version: 2}, Enforced: true, EnforcedVersion: 2}, nil
}

// fuzzIDs are the sandboxes of a fuzz server: key_a's in three states,
// key_b's, and one that does not exist.
var fuzzIDs = []string{"sbx_run", "sbx_stopped", "sbx_start", "sbx_b", "sbx_none"}

// fuzzServer is one server for all the inputs of a fuzzing process:
// building its routes and OpenAPI document costs more than an input, so
// each input gets only a fresh manager, idempotency store and staging.
type fuzzServer struct {
	s   *server
	dir string // upload staging
}

func newFuzzServer(tb testing.TB) *fuzzServer {
	fs := &fuzzServer{dir: tb.TempDir()}
	// Links are signed as on a real server, so their routes are fuzzed too.
	signer, err := links.NewSigner([]byte(strings.Repeat("k", links.KeyBytes)), &memGens{g: map[string]int64{}}, time.Now)
	if err != nil {
		tb.Fatal(err)
	}
	// Volumes as on a real server (an in-memory store; mkfs replaced by
	// true, so files are not formatted), told of a manager of their own.
	vols := volumes.New(volumes.Config{Store: volumestest.New(), Backups: volumestest.NewBackups(), DataDir: tb.TempDir(), Mkfs: "true"})
	vols.SetGuests(newFakeManager())
	// Webhooks and egress secrets as on a real server, on a SQLite file;
	// deliveries go nowhere (every attempt fails at once).
	st, err := store.Open(context.Background(), filepath.Join(tb.TempDir(), "emberbox.db"))
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { st.Close() })
	sealer, err := secrets.NewSealer(make([]byte, secrets.KeySize))
	if err != nil {
		tb.Fatal(err)
	}
	hooks := webhook.New(webhook.Config{Records: st, Outbox: st, Transport: refusingTransport{}})
	cas, err := secrets.OpenCAs(context.Background(), secrets.CAConfig{Store: st, Sealer: sealer,
		Seed: func(context.Context) (*egress.CA, error) { return egress.NewCA() }})
	if err != nil {
		tb.Fatal(err)
	}
	fs.s = newServer(Config{Manager: fuzzManager{newFakeManager()}.roles(), Keys: fakeKeys{}, Version: "test",
		Accel: func() string { return "tcg" }, Links: signer, Interpreter: interpreter.New(nil), Computer: computer.New(nil),
		Images: newTestImages(tb, nil), Volumes: vols, Webhooks: hooks,
		Secrets: secrets.New(secrets.Config{Store: st, Sealer: sealer}), EgressCAs: guestlessCAs{cas}})
	return fs
}

// guestlessCAs are the egress CAs of a server without guests.
type guestlessCAs struct{ cas *secrets.CAs }

func (g guestlessCAs) Status(context.Context) []secrets.CAInfo { return g.cas.Status(nil) }

func (g guestlessCAs) Rotate(ctx context.Context, keep time.Duration) (*secrets.Rotation, error) {
	return g.cas.Rotate(ctx, keep)
}

// refusingTransport fails every request at once: fuzzed webhooks are
// never delivered anywhere.
type refusingTransport struct{}

func (refusingTransport) RoundTrip(*http.Request) (*http.Response, error) {
	return nil, errors.New("deliveries are not sent while fuzzing")
}

// reset gives the server a fresh manager holding fuzzIDs and returns it.
func (fs *fuzzServer) reset(t *testing.T) *fakeManager {
	m := newFakeManager()
	m.add("key_a", "sbx_run", sandbox.StateRunning, 30*time.Minute)
	m.add("key_a", "sbx_stopped", sandbox.StateStopped, time.Minute)
	m.add("key_a", "sbx_start", sandbox.StateStarting, time.Minute)
	m.add("key_b", "sbx_b", sandbox.StateRunning, time.Minute)
	m.files["sbx_run\x00/workspace/a.txt"] = []byte("hello\xff\n")
	zero := 0
	m.execResult = guest.ExecResult{ProcessID: "p1", ExitCode: &zero, Stdout: []byte("hi\n"), Stderr: []byte{0xff}, State: "exited"}
	m.execEvents = []guest.Event{{Type: "start", ProcessID: "p1"}, {Type: "stdout", Data: []byte("hi\xff")}, {Type: "exit", Offset: 3, Exit: &m.execResult}}
	// A new store removes the staging files the last input left.
	u, err := NewUploads(upload.Config{Dir: fs.dir})
	if err != nil {
		t.Fatal(err)
	}
	fs.s.mgr, fs.s.idem, fs.s.uploads = fuzzManager{m}.roles(), newFakeIdem(), u
	return m
}

// muxClean is the path ServeMux serves without redirecting.
func muxClean(p string) string {
	c := path.Clean(p)
	if strings.HasSuffix(p, "/") && c != "/" {
		c += "/"
	}
	return c
}

var errorCodeRE = regexp.MustCompile(`^[a-z][a-z_]*$`)

// checkAnswer checks the properties every answer has: a 2xx of a content
// type the route declares (any route's if rt is nil) (JSON or NDJSON that parses), or the one error
// shape with a code, its status and the request id; never a 5xx, never
// more than a few MiB, never the host's staging path.
func checkAnswer(t *testing.T, rt *route, w *httptest.ResponseRecorder, hostDir string) {
	body := w.Body.Bytes()
	if len(body) > 4<<20 {
		t.Fatalf("answer of %d bytes", len(body))
	}
	if bytes.Contains(body, []byte(hostDir)) {
		t.Fatalf("answer names the host's staging directory: %s", body)
	}
	ct, _, _ := mime.ParseMediaType(w.Header().Get("Content-Type"))
	switch {
	case w.Code >= 200 && w.Code < 300:
		answers := []string{"application/json"}
		switch {
		case rt == nil: // any route's
			answers = append(answers, "application/x-ndjson", "application/octet-stream")
		case rt.Answers != nil:
			answers = rt.Answers
		}
		if !slices.Contains(answers, ct) {
			t.Fatalf("%d answer of type %q, route declares %v", w.Code, ct, answers)
		}
		switch ct {
		case "application/json":
			if !json.Valid(body) {
				t.Fatalf("JSON answer does not parse: %q", body)
			}
		case "application/x-ndjson":
			sc := bufio.NewScanner(bytes.NewReader(body))
			sc.Buffer(nil, 4<<20)
			for sc.Scan() {
				var ev map[string]any
				if err := json.Unmarshal(sc.Bytes(), &ev); err != nil || ev["type"] == nil {
					t.Fatalf("NDJSON line %q: %v", sc.Bytes(), err)
				}
			}
		}
	case w.Code >= 400 && w.Code < 500:
		if ct != "application/json" {
			t.Fatalf("%d answer of type %q: %q", w.Code, ct, body)
		}
		var shape map[string]json.RawMessage
		if err := json.Unmarshal(body, &shape); err != nil || len(shape) != 1 || shape["error"] == nil {
			t.Fatalf("%d answer not in the error shape: %q", w.Code, body)
		}
		var e struct {
			Code      *string         `json:"code"`
			Status    *int            `json:"status"`
			Message   *string         `json:"message"`
			Hint      *string         `json:"hint"`
			RequestID *string         `json:"requestId"`
			Details   json.RawMessage `json:"details"`
		}
		if err := json.Unmarshal(shape["error"], &e); err != nil || e.Code == nil || e.Status == nil || e.Message == nil || e.Hint == nil || e.RequestID == nil {
			t.Fatalf("error lacks a field: %q (%v)", body, err)
		}
		if !errorCodeRE.MatchString(*e.Code) || *e.Status != w.Code || *e.Message == "" || *e.RequestID != w.Header().Get("x-request-id") {
			t.Fatalf("%d answer with a bad error: %q", w.Code, body)
		}
		if *e.Code == "invalid_request" {
			var d struct {
				Issues []issue `json:"issues"`
			}
			if err := json.Unmarshal(e.Details, &d); err != nil || len(d.Issues) == 0 {
				t.Fatalf("invalid_request without issues: %q", body)
			}
			for _, is := range d.Issues {
				if is.Message == "" {
					t.Fatalf("issue without a message: %q", body)
				}
			}
		}
	default:
		t.Fatalf("status %d: %q", w.Code, body)
	}
}

// FuzzAPIRequest sends a fuzzed request to one route of the API (chosen by
// sel, with a fuzzed or a fixture sandbox id, query string and body) over
// the fake manager, and checks the answer with checkAnswer. This covers
// the create, exec, process, files, network and upload decoders and every
// query parser.
func FuzzAPIRequest(f *testing.F) {
	fs := newFuzzServer(f)
	routes := fs.s.routes
	add := func(method, p, query, body string) {
		for i, rt := range routes {
			if rt.Method == method && rt.Path == p {
				f.Add(uint8(i), "", query, []byte(body))
				return
			}
		}
		f.Fatalf("no route %s %s", method, p)
	}
	add("POST", "/v1/sandboxes", "", `{"name":"a","labels":{"k":"v"},"env":{"A":"1"},"vcpu":2,"memoryMiB":2048,"diskMiB":4096,"timeoutSeconds":600,"network":{"allow":["pypi.org","*.pythonhosted.org"],"deny":["10.0.0.0/8"]}}`)
	add("POST", "/v1/sandboxes", "", `{"getOrCreate":true,"name":"a","onLeaseEnd":"delete","region":"local","cpu":"shared","pausable":false}`)
	add("POST", "/v1/sandboxes", "", `{"vcpu":"2","memoryMiB":1e9,"env":{"A=B":"x"},"zed":null,"labels":[]}`)
	add("GET", "/v1/sandboxes", "state=running&state=stopped&label=k:v&includeStopped=true&limit=10&cursor=abc&name=a", "")
	add("GET", "/v1/sandboxes", "limit=0&includeStopped=maybe&state=nope", "")
	add("GET", "/v1/sandboxes/{id}", "waitFor=running&timeoutSeconds=1", "")
	add("POST", "/v1/sandboxes/{id}:extend", "", `{"seconds":600}`)
	add("POST", "/v1/sandboxes/{id}:switch-image", "", `{"image":"web:latest","keep":"workspace"}`)
	add("POST", "/v1/sandboxes/{id}:switch-image", "", `{"image":"default","keep":"disk"}`)
	add("POST", "/v1/sandboxes/{id}:exec", "", `{"command":"echo hi","env":{"A":"b"},"cwd":"/tmp","stdin":"x","timeoutMs":5000,"user":"root"}`)
	add("POST", "/v1/sandboxes/{id}:exec", "", `{"argv":["ls","-l"],"stdinBase64":"AAE=","stream":true}`)
	add("POST", "/v1/sandboxes/{id}:exec", "", `{"command":"x","argv":["y"],"stdinBase64":"!!","timeoutMs":-1,"user":"nobody"}`)
	add("POST", "/v1/sandboxes/{id}/processes", "", `{"command":"sleep 9","outputEncoding":"base64","stdinMode":"pipe","pty":{"cols":80}}`)
	add("GET", "/v1/sandboxes/{id}/processes/{pid}/output", "cursor=10&waitMs=100&follow=true", "")
	add("GET", "/v1/sandboxes/{id}/processes/{pid}/output", "cursor=-1&waitMs=99999999999&follow=2", "")
	add("POST", "/v1/sandboxes/{id}/processes/{pid}:signal", "", `{"signal":"SIGKILL"}`)
	add("GET", "/v1/sandboxes/{id}/files/content", "path=a.txt", "")
	add("PUT", "/v1/sandboxes/{id}/files/content", "path=/workspace/b&mode=0755", "data\x00\xff")
	add("GET", "/v1/sandboxes/{id}/files/list", "path=/workspace&depth=3&hidden=true&limit=100", "")
	add("GET", "/v1/sandboxes/{id}/files/stat", "path=%00", "")
	add("POST", "/v1/sandboxes/{id}/files:mkdir", "", `{"path":"a/b","parents":true}`)
	add("POST", "/v1/sandboxes/{id}/files:remove", "", `{"path":"/workspace/a.txt","recursive":true}`)
	add("POST", "/v1/sandboxes/{id}/files:chmod", "", `{"path":"a.txt","mode":"4755"}`)
	add("PUT", "/v1/sandboxes/{id}/network", "", `{"internet":false,"allow":["example.com:443","1.2.3.0/24"],"deny":["*.bad.example"]}`)
	add("PUT", "/v1/sandboxes/{id}/network", "", `{"allow":["http://x","a..b","::1/200"],"connect":["db:5432"]}`)
	add("POST", "/v1/sandboxes/{id}/uploads", "", `{"path":"big.bin","size":3000000,"sha256":"`+strings.Repeat("ab", 32)+`","mode":"600"}`)
	add("PUT", "/v1/sandboxes/{id}/uploads/{uploadId}", "offset=1048576", "chunk")
	add("POST", "/v1/sandboxes/{id}/uploads/{uploadId}:commit", "", "")
	add("GET", "/v1/sandboxes/{id}/events", "limit=5", "")
	add("GET", "/v1/sandboxes/{id}/metrics", "range=15m", "")
	add("GET", "/v1/usage", "from=2026-11-01T00:00:00Z&to=2026-12-01T00:00:00Z&groupBy=day&owner=all", "")
	add("GET", "/v1/usage/export", "since=2026-11-01T00:00:00Z&until=2026-12-01T00:00:00Z&limit=5&cursor=MTc2NDU0NzIwMC9zYnhfYQ", "")
	add("GET", "/v1/usage/compare", "provider=blaxel&days=7", "")
	f.Add(uint8(0), "sbx_run:nope", "", []byte(nil))
	f.Add(uint8(2), "..", "", []byte(nil))
	f.Add(uint8(3), "a/b:stop", "", []byte("{}"))
	f.Fuzz(func(t *testing.T, sel uint8, id, query string, body []byte) {
		fs.reset(t)
		s, dir := fs.s, fs.dir
		rt := &s.routes[int(sel)%len(s.routes)]
		if id == "" {
			id = fuzzIDs[int(sel)/len(s.routes)%len(fuzzIDs)]
		}
		p := strings.NewReplacer("{id}", id, "{pid}", "p1", "{uploadId}", "upl_0123").Replace(rt.Path)
		r := httptest.NewRequest(rt.Method, "/", bytes.NewReader(body))
		r.URL.Path, r.URL.RawQuery = p, query
		r.Header.Set("Authorization", "Bearer secret-a")
		w := httptest.NewRecorder()
		s.ServeHTTP(w, r)
		if w.Code >= 300 && w.Code < 400 {
			if muxClean(p) == p {
				t.Fatalf("%s %s: redirected to %q", rt.Method, p, w.Header().Get("Location"))
			}
			return
		}
		// A fuzzed id may lead to another route, or to none.
		if id != fuzzIDs[int(sel)/len(s.routes)%len(fuzzIDs)] {
			rt = nil
		}
		checkAnswer(t, rt, w, dir)
	})
}

// FuzzFilePath checks the API's checks of file paths and modes: pathIssue
// accepts exactly the paths a file can have; workspacePath accepts only
// clean paths under /workspace; parseMode accepts exactly 1 to 4 octal
// digits; and a path sent in a query string reaches the guest unchanged.
func FuzzFilePath(f *testing.F) {
	for _, p := range []string{"a.txt", "/workspace/a.txt", "", ".", "..", "../etc/passwd", "/workspace/../etc", "a//b/./c/", "/workspace", "/workspace/", "a\x00b", strings.Repeat("x", 4097), "é/ü", "%2e%2e", "a b&c=d#e"} {
		f.Add(p, "644")
	}
	for _, m := range []string{"", "0", "7777", "10000", "8", "-1", "+7", "0o7", "1_0", " 7", "07777"} {
		f.Add("a", m)
	}
	fs := newFuzzServer(f)
	f.Fuzz(func(t *testing.T, p, mode string) {
		valid := p != "" && len(p) <= maxPathLen && !strings.Contains(p, "\x00") && utf8.ValidString(p)
		issues := pathIssue("path", p)
		if (issues == nil) != valid {
			t.Fatalf("pathIssue(%q) = %v", p, issues)
		}
		for _, is := range issues {
			if is.Path != "path" || is.Message == "" {
				t.Fatalf("pathIssue(%q): issue %+v", p, is)
			}
		}
		wp, wissues := workspacePath("path", p)
		if wissues == nil {
			if !valid || wp != path.Clean(wp) || !strings.HasPrefix(wp, uploadRoot+"/") || slices.Contains(strings.Split(wp, "/"), "..") {
				t.Fatalf("workspacePath(%q) = %q", p, wp)
			}
			if want := path.Clean(path.Join(uploadRoot, p)); path.IsAbs(p) && wp != path.Clean(p) || !path.IsAbs(p) && wp != want {
				t.Fatalf("workspacePath(%q) = %q", p, wp)
			}
		} else if valid && !path.IsAbs(p) && !slices.Contains(strings.Split(p, "/"), "..") && path.Clean(p) != "." {
			t.Fatalf("workspacePath refused %q: %v", p, wissues)
		}

		m, ok := parseMode(mode)
		digits := len(mode) >= 1 && len(mode) <= 4 && strings.Trim(mode, "01234567") == ""
		if ok != digits || ok && m > 0o7777 {
			t.Fatalf("parseMode(%q) = %o, %v", mode, m, ok)
		}

		if !valid {
			return
		}
		fm := fs.reset(t)
		s, dir := fs.s, fs.dir
		fm.files["sbx_run\x00"+p] = []byte("x")
		r := httptest.NewRequest("GET", "/v1/sandboxes/sbx_run/files/stat?"+url.Values{"path": {p}}.Encode(), nil)
		r.Header.Set("Authorization", "Bearer secret-a")
		w := httptest.NewRecorder()
		s.ServeHTTP(w, r)
		// The fake finds the file only under exactly p. The answer says p
		// as JSON can: invalid UTF-8 comes back as U+FFFD.
		var e struct {
			Exists bool
			Path   string
		}
		jp, _ := json.Marshal(p)
		var want string
		_ = json.Unmarshal(jp, &want)
		if w.Code != 200 || json.Unmarshal(w.Body.Bytes(), &e) != nil || !e.Exists || e.Path != want {
			t.Fatalf("stat %q: %d %s", p, w.Code, w.Body)
		}
		checkAnswer(t, nil, w, dir)
	})
}

var idempotencyKeyRE = regexp.MustCompile(`^[A-Za-z0-9_.:-]{1,128}$`)

// FuzzIdempotencyKey checks the Idempotency-Key validator against its
// definition, the fingerprint's form and that parts cannot run together,
// and, over HTTP, that a valid key replays the first answer to the same
// request and refuses a different one with 422, while an invalid key is a
// 400 naming the header.
func FuzzIdempotencyKey(f *testing.F) {
	f.Add("key-1", []byte(`{"seconds":600}`), []byte(`{"seconds":601}`))
	f.Add("a:b.c_d-E", []byte(`{"seconds":0}`), []byte(`{"seconds":0}`))
	f.Add(strings.Repeat("k", 128), []byte(""), []byte("{}"))
	f.Add(strings.Repeat("k", 129), []byte("{}"), []byte("{}"))
	f.Add("bad key", []byte("{}"), []byte("{}"))
	f.Add("ключ", []byte("{}"), []byte("{}"))
	fs := newFuzzServer(f)
	f.Fuzz(func(t *testing.T, key string, body, body2 []byte) {
		if validIdempotencyKey(key) != idempotencyKeyRE.MatchString(key) {
			t.Fatalf("validIdempotencyKey(%q) = %v", key, validIdempotencyKey(key))
		}
		const target = "/v1/sandboxes/sbx_run:extend"
		fp := fingerprint("POST", target, body)
		if b, err := hex.DecodeString(fp); err != nil || len(b) != 32 || strings.ToLower(fp) != fp {
			t.Fatalf("fingerprint %q", fp)
		}
		if fingerprint("POST", target, body) != fp {
			t.Fatal("fingerprint is not deterministic")
		}
		if len(body) > 0 && fingerprint("POST", target+string(body[:1]), body[1:]) == fp {
			t.Fatal("a byte moved from the body to the target keeps the fingerprint")
		}
		if !bytes.Equal(body, body2) && fingerprint("POST", target, body2) == fp {
			t.Fatal("two bodies share a fingerprint")
		}

		// What a client can send in a header: no CR, LF or NUL.
		if key == "" || strings.ContainsAny(key, "\r\n\x00") {
			return
		}
		fs.reset(t)
		s, dir := fs.s, fs.dir
		send := func(b []byte) *httptest.ResponseRecorder {
			r := httptest.NewRequest("POST", target, bytes.NewReader(b))
			r.Header.Set("Authorization", "Bearer secret-a")
			r.Header.Set("Idempotency-Key", key)
			w := httptest.NewRecorder()
			s.ServeHTTP(w, r)
			return w
		}
		w := send(body)
		if !validIdempotencyKey(key) {
			checkAnswer(t, nil, w, dir)
			if w.Code != 400 || !strings.Contains(w.Body.String(), `"path":"Idempotency-Key"`) {
				t.Fatalf("invalid key %q: %d %s", key, w.Code, w.Body)
			}
			return
		}
		checkAnswer(t, nil, w, dir)
		again := send(body)
		if again.Code != w.Code || !bytes.Equal(again.Body.Bytes(), markReplayed(w.Body.Bytes())) || again.Header().Get("Idempotency-Replayed") != "true" {
			t.Fatalf("retry: %d %q, want %d %q replayed", again.Code, again.Body, w.Code, w.Body)
		}
		if !bytes.Equal(body, body2) {
			other := send(body2)
			checkAnswer(t, nil, other, dir)
			if other.Code != http.StatusUnprocessableEntity {
				t.Fatalf("other body with the same key: %d %s", other.Code, other.Body)
			}
		}
	})
}
