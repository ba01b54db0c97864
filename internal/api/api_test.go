package api

import (
	"encoding/json"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/emberbox/emberbox/internal/errdefs"
	"github.com/emberbox/emberbox/internal/sandbox"
	"github.com/emberbox/emberbox/internal/upload"
	"github.com/google/go-cmp/cmp"
)

type testEnv struct {
	t    *testing.T
	m    *fakeManager
	idem *fakeIdem
	s    *server

	uploadDir string // staging directory, set by newUploadEnv
}

func newEnv(t *testing.T) *testEnv {
	t.Helper()
	m, idem := newFakeManager(), newFakeIdem()
	s := newServer(Config{Manager: rolesOf(m), Keys: fakeKeys{}, Idempotency: idem, Version: "test",
		Accel: func() string { return "tcg" }, Uploads: newTestUploads(t)})
	return &testEnv{t: t, m: m, idem: idem, s: s}
}

// do sends a request as key a; headers are name, value pairs and override.
func (e *testEnv) do(method, target, body string, headers ...string) *httptest.ResponseRecorder {
	e.t.Helper()
	r := httptest.NewRequest(method, target, strings.NewReader(body))
	r.Header.Set("Authorization", "Bearer secret-a")
	for i := 0; i+1 < len(headers); i += 2 {
		if headers[i+1] == "" {
			r.Header.Del(headers[i])
			continue
		}
		r.Header.Set(headers[i], headers[i+1])
	}
	w := httptest.NewRecorder()
	e.s.ServeHTTP(w, r)
	return w
}

var requestIDRE = regexp.MustCompile(`^req_[0-9a-f]{24}$`)

// errorOf checks the error shape of w and returns its error object.
func errorOf(t *testing.T, w *httptest.ResponseRecorder) errorJSON {
	t.Helper()
	if ct := w.Header().Get("Content-Type"); ct != "application/json" {
		t.Errorf("Content-Type = %q, want application/json", ct)
	}
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(w.Body.Bytes(), &raw); err != nil {
		t.Fatalf("body %q: %v", w.Body.String(), err)
	}
	var fields map[string]any
	if err := json.Unmarshal(raw["error"], &fields); err != nil {
		t.Fatalf("error of %q: %v", w.Body.String(), err)
	}
	for _, k := range []string{"code", "status", "message", "hint", "requestId"} {
		if _, ok := fields[k]; !ok {
			t.Errorf("error has no %q: %s", k, w.Body.String())
		}
	}
	var body errorBody
	_ = json.Unmarshal(w.Body.Bytes(), &body)
	if body.Error.Status != w.Code {
		t.Errorf("error.status = %d, want the HTTP status %d", body.Error.Status, w.Code)
	}
	if rid := w.Header().Get("x-request-id"); rid != body.Error.RequestID || !requestIDRE.MatchString(rid) {
		t.Errorf("x-request-id %q, requestId %q: want equal and req_<hex>", rid, body.Error.RequestID)
	}
	return body.Error
}

func decodeBody[T any](t *testing.T, w *httptest.ResponseRecorder) T {
	t.Helper()
	var v T
	if err := json.Unmarshal(w.Body.Bytes(), &v); err != nil {
		t.Fatalf("body %q: %v", w.Body.String(), err)
	}
	return v
}

func TestErrorShape(t *testing.T) {
	tests := []struct {
		name, method, target string
		headers              []string
		status               int
		code                 string
		allow                string
	}{
		{name: "unknown route", method: "GET", target: "/nope", status: 404, code: "route_not_found"},
		{name: "unknown v1 route", method: "GET", target: "/v1/things", status: 404, code: "route_not_found"},
		{name: "unknown verb", method: "POST", target: "/v1/sandboxes/sbx_1:explode", status: 404, code: "route_not_found"},
		{name: "empty id", method: "POST", target: "/v1/sandboxes/:stop", status: 404, code: "route_not_found"},
		{name: "wrong method", method: "PUT", target: "/v1/sandboxes/sbx_1", status: 405, code: "method_not_allowed", allow: "DELETE, GET"},
		{name: "wrong method on verb", method: "GET", target: "/v1/sandboxes/sbx_1:stop", status: 405, code: "method_not_allowed", allow: "POST"},
		{name: "wrong method on literal verb", method: "GET", target: "/v1/sandboxes/sbx_1/files:mkdir", status: 405, code: "method_not_allowed", allow: "POST"},
		{name: "no key", method: "GET", target: "/v1/sandboxes", headers: []string{"Authorization", ""}, status: 401, code: "unauthorized"},
		{name: "unknown key", method: "GET", target: "/v1/sandboxes", headers: []string{"Authorization", "Bearer nope"}, status: 401, code: "unauthorized"},
		{name: "not bearer", method: "GET", target: "/v1/sandboxes", headers: []string{"Authorization", "Basic secret-a"}, status: 401, code: "unauthorized"},
		{name: "not found", method: "GET", target: "/v1/sandboxes/sbx_9", status: 404, code: "not_found"},
		{name: "panic", method: "GET", target: "/v1/sandboxes/panic", status: 500, code: "internal"},
		{name: "internal", method: "GET", target: "/v1/sandboxes/broken", status: 500, code: "internal"},
		{name: "bad query", method: "GET", target: "/v1/sandboxes?limit=0", status: 400, code: "invalid_request"},
		{name: "bad json", method: "POST", target: "/v1/sandboxes", status: 400, code: "invalid_request"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t)
			body := ""
			if tt.name == "bad json" {
				body = "{"
			}
			w := e.do(tt.method, tt.target, body, tt.headers...)
			if w.Code != tt.status {
				t.Fatalf("status = %d, want %d: %s", w.Code, tt.status, w.Body)
			}
			got := errorOf(t, w)
			if got.Code != tt.code {
				t.Errorf("code = %q, want %q", got.Code, tt.code)
			}
			if got := w.Header().Get("Allow"); got != tt.allow {
				t.Errorf("Allow = %q, want %q", got, tt.allow)
			}
			if strings.Contains(w.Body.String(), "secret") || strings.Contains(w.Body.String(), "boom") {
				t.Errorf("answer leaks internal detail: %s", w.Body)
			}
		})
	}
}

func TestRequestIDOnSuccessAndUnique(t *testing.T) {
	e := newEnv(t)
	a, b := e.do("GET", "/healthz", ""), e.do("GET", "/v1/openapi.json", "", "Authorization", "")
	for _, w := range []*httptest.ResponseRecorder{a, b} {
		if w.Code != 200 || !requestIDRE.MatchString(w.Header().Get("x-request-id")) {
			t.Errorf("status %d, x-request-id %q", w.Code, w.Header().Get("x-request-id"))
		}
	}
	if a.Header().Get("x-request-id") == b.Header().Get("x-request-id") {
		t.Error("two requests got the same id")
	}
	r := httptest.NewRequest("GET", "/healthz", nil)
	r.Header.Set("x-request-id", "evil\nid")
	w := httptest.NewRecorder()
	e.s.ServeHTTP(w, r)
	if !requestIDRE.MatchString(w.Header().Get("x-request-id")) {
		t.Errorf("incoming id echoed: %q", w.Header().Get("x-request-id"))
	}
}

func issuesOf(t *testing.T, w *httptest.ResponseRecorder) []issue {
	t.Helper()
	var body struct {
		Error struct {
			Details struct {
				Issues []issue `json:"issues"`
			} `json:"details"`
		} `json:"error"`
	}
	if err := json.Unmarshal(w.Body.Bytes(), &body); err != nil {
		t.Fatal(err)
	}
	return body.Error.Details.Issues
}

func TestCreateRefusesEveryUnknownFieldAtOnce(t *testing.T) {
	e := newEnv(t)
	w := e.do("POST", "/v1/sandboxes", `{"memoryMb": 1, "zed": true, "vcpu": "two", "labels": {"a": 1}, "name": "ok"}`)
	if w.Code != 400 {
		t.Fatalf("status %d: %s", w.Code, w.Body)
	}
	if got := errorOf(t, w).Code; got != "invalid_request" {
		t.Errorf("code %q", got)
	}
	want := []issue{
		{Path: "labels", Message: "must be an object of strings"},
		{Path: "memoryMb", Message: "is not a known field"},
		{Path: "vcpu", Message: "must be an integer"},
		{Path: "zed", Message: "is not a known field"},
	}
	if diff := cmp.Diff(want, issuesOf(t, w)); diff != "" {
		t.Errorf("issues (-want +got):\n%s", diff)
	}
	if e.m.creates != 0 {
		t.Errorf("manager called %d times", e.m.creates)
	}
}

func TestCreateValidation(t *testing.T) {
	manyLabels := map[string]string{}
	for i := range 33 {
		manyLabels[strings.Repeat("k", i+1)] = "v"
	}
	labels, _ := json.Marshal(manyLabels)
	tests := []struct {
		name, body string
		code       string
		paths      []string
	}{
		{name: "ranges", body: `{"vcpu":0,"memoryMiB":127,"diskMiB":65537,"timeoutSeconds":59}`, code: "invalid_request",
			paths: []string{"diskMiB", "memoryMiB", "timeoutSeconds", "vcpu"}},
		{name: "lease end", body: `{"onLeaseEnd":"explode"}`, code: "invalid_request", paths: []string{"onLeaseEnd"}},
		{name: "idle pause", body: `{"idlePauseSeconds":86401,"persistent":true,"timeoutSeconds":600}`, code: "invalid_request",
			paths: []string{"idlePauseSeconds", "timeoutSeconds"}},
		{name: "copy with a shape", body: `{"snapshot":"snap_1","vcpu":4}`, code: "invalid_request", paths: []string{"snapshot"}},
		{name: "name", body: `{"name":"-bad"}`, code: "invalid_request", paths: []string{"name"}},
		{name: "long name", body: `{"name":"` + strings.Repeat("a", 64) + `"}`, code: "invalid_request", paths: []string{"name"}},
		{name: "labels", body: `{"labels":` + string(labels) + `}`, code: "invalid_request", paths: []string{"labels"}},
		{name: "env name", body: `{"env":{"1BAD":"x","GOOD":"y"}}`, code: "invalid_request", paths: []string{"env.1BAD"}},
		{name: "env size", body: `{"env":{"BIG":"` + strings.Repeat("x", 33<<10) + `"}}`, code: "invalid_request", paths: []string{"env"}},
		{name: "not here", body: `{"image":"python","pausable":true,"region":"us-east"}`, code: "invalid_request",
			paths: []string{"image", "region"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t)
			w := e.do("POST", "/v1/sandboxes", tt.body)
			if w.Code != 400 {
				t.Fatalf("status %d: %s", w.Code, w.Body)
			}
			got := errorOf(t, w)
			if got.Code != tt.code {
				t.Errorf("code %q, want %q", got.Code, tt.code)
			}
			var paths []string
			for _, is := range issuesOf(t, w) {
				paths = append(paths, is.Path)
			}
			if diff := cmp.Diff(tt.paths, paths); diff != "" {
				t.Errorf("issue paths (-want +got):\n%s", diff)
			}
		})
	}
}

func TestCreateDefaultsAndObject(t *testing.T) {
	e := newEnv(t)
	w := e.do("POST", "/v1/sandboxes", "") // an empty body is {}
	if w.Code != 200 {
		t.Fatalf("status %d: %s", w.Code, w.Body)
	}
	// No time limit: it pauses when idle instead, as withruntime documents.
	want := sandbox.CreateSpec{VCPU: sandbox.DefaultVCPU, MemoryMiB: sandbox.DefaultMemoryMiB, DiskMiB: sandbox.DefaultDiskMiB,
		OnLeaseEnd: "stop", IdlePauseSeconds: sandbox.DefaultIdlePauseSeconds}
	if diff := cmp.Diff(want, e.m.lastSpec); diff != "" {
		t.Errorf("spec (-want +got):\n%s", diff)
	}
	got := decodeBody[map[string]any](t, w)
	wantObj := map[string]any{
		"id": "sbx_1", "kind": "sandbox", "name": nil, "labels": map[string]any{}, "status": "pending", "state": "starting",
		"region": "local", "vcpu": 2.0, "memoryMiB": 4096.0, "diskMiB": 4096.0, "cpu": "shared", "timeoutSeconds": 0.0,
		"onLeaseEnd": "stop", "pausable": true, "persistent": false, "createdAt": "2026-11-01T12:00:00.123Z",
		"autoWake": true, "idlePauseSeconds": 300.0, "pausedAt": nil,
		"readyAt": nil, "expiresAt": nil, "endsAt": nil, "endedAt": nil, "stopReason": nil, "envNames": []any{},
		"accel": "tcg", "driver": nil,
	}
	if diff := cmp.Diff(wantObj, got); diff != "" {
		t.Errorf("sandbox object (-want +got):\n%s", diff)
	}
	// The fields withruntime 0.35.0 sends are accepted.
	w = e.do("POST", "/v1/sandboxes", `{"timeoutSeconds":900,"onLeaseEnd":"stop","funding":"trial","autoWake":true,"cpu":"shared","user":"sandbox"}`)
	if w.Code != 200 {
		t.Fatalf("status %d: %s", w.Code, w.Body)
	}
}

func TestPreferWaitAndWaitFor(t *testing.T) {
	tests := []struct {
		name, method, target string
		prefer               string
		want                 []waitCall
		state                string
	}{
		{name: "create waits", method: "POST", target: "/v1/sandboxes", prefer: "wait=60",
			want: []waitCall{{id: "sbx_1", states: []sandbox.State{"running"}, timeout: 60 * time.Second}}, state: "running"},
		{name: "create wait capped", method: "POST", target: "/v1/sandboxes", prefer: "respond-async, wait=600",
			want: []waitCall{{id: "sbx_1", states: []sandbox.State{"running"}, timeout: 120 * time.Second}}, state: "running"},
		{name: "create no wait", method: "POST", target: "/v1/sandboxes", state: "starting"},
		{name: "stop waits", method: "POST", target: "/v1/sandboxes/sbx_r:stop", prefer: "wait=30",
			want: []waitCall{{id: "sbx_r", states: []sandbox.State{"stopped"}, timeout: 30 * time.Second}}, state: "stopped"},
		{name: "stop no wait", method: "POST", target: "/v1/sandboxes/sbx_r:stop", state: "stopping"},
		{name: "get waitFor default", method: "GET", target: "/v1/sandboxes/sbx_s?waitFor=running",
			want: []waitCall{{id: "sbx_s", states: []sandbox.State{"running"}, timeout: 60 * time.Second}}, state: "running"},
		{name: "get waitFor capped", method: "GET", target: "/v1/sandboxes/sbx_s?waitFor=running&timeoutSeconds=900",
			want: []waitCall{{id: "sbx_s", states: []sandbox.State{"running"}, timeout: 120 * time.Second}}, state: "running"},
		{name: "get waitFor 5", method: "GET", target: "/v1/sandboxes/sbx_s?waitFor=running&timeoutSeconds=5",
			want: []waitCall{{id: "sbx_s", states: []sandbox.State{"running"}, timeout: 5 * time.Second}}, state: "running"},
		{name: "get plain", method: "GET", target: "/v1/sandboxes/sbx_s", state: "starting"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t)
			e.m.add("key_a", "sbx_r", sandbox.StateRunning, time.Hour)
			e.m.add("key_a", "sbx_s", sandbox.StateStarting, time.Hour)
			body := ""
			if tt.method == "POST" {
				body = "{}"
			}
			w := e.do(tt.method, tt.target, body, "Prefer", tt.prefer)
			if w.Code != 200 {
				t.Fatalf("status %d: %s", w.Code, w.Body)
			}
			if diff := cmp.Diff(tt.want, e.m.waits, cmp.AllowUnexported(waitCall{})); diff != "" {
				t.Errorf("waits (-want +got):\n%s", diff)
			}
			if got := decodeBody[map[string]any](t, w)["state"]; got != tt.state {
				t.Errorf("state %v, want %s", got, tt.state)
			}
		})
	}
}

func TestOwnerIsolation(t *testing.T) {
	e := newEnv(t)
	w := e.do("POST", "/v1/sandboxes", `{"name":"mine"}`)
	id := decodeBody[map[string]any](t, w)["id"].(string)
	asB := []string{"Authorization", "Bearer secret-b"}
	for _, req := range []struct{ method, target, body string }{
		{"GET", "/v1/sandboxes/" + id, ""},
		{"DELETE", "/v1/sandboxes/" + id, ""},
		{"POST", "/v1/sandboxes/" + id + ":stop", "{}"},
		{"POST", "/v1/sandboxes/" + id + ":exec", `{"command":"id"}`},
		{"GET", "/v1/sandboxes/" + id + "/files/content?path=/etc/passwd", ""},
		{"GET", "/v1/sandboxes/" + id + "/files/stat?path=/x", ""},
	} {
		w := e.do(req.method, req.target, req.body, asB...)
		if w.Code != 404 {
			t.Errorf("%s %s as another key: status %d, want 404: %s", req.method, req.target, w.Code, w.Body)
			continue
		}
		errorOf(t, w)
	}
	list := decodeBody[listJSON[map[string]any]](t, e.do("GET", "/v1/sandboxes", "", asB...))
	if len(list.Data) != 0 {
		t.Errorf("key b lists %d sandboxes of key a", len(list.Data))
	}
	if w := e.do("GET", "/v1/sandboxes/"+id, ""); w.Code != 200 {
		t.Errorf("owner reads its sandbox: %d", w.Code)
	}
}

func TestListParams(t *testing.T) {
	e := newEnv(t)
	e.m.add("key_a", "sbx_1", sandbox.StateRunning, time.Hour)
	e.m.listNext = "cur_2"
	w := e.do("GET", "/v1/sandboxes?state=running&state=stopped&label=team:ml&label=env:a:b&includeStopped=true&limit=7&cursor=cur_1&name=x", "")
	if w.Code != 200 {
		t.Fatalf("status %d: %s", w.Code, w.Body)
	}
	want := sandbox.ListOptions{OwnerKeyID: "key_a", States: []sandbox.State{"running", "stopped"}, Name: "x",
		Labels: map[string]string{"team": "ml", "env": "a:b"}, IncludeStopped: true, Limit: 7, Cursor: "cur_1"}
	if diff := cmp.Diff(want, e.m.listOpts); diff != "" {
		t.Errorf("options (-want +got):\n%s", diff)
	}
	got := decodeBody[struct {
		Data       []map[string]any `json:"data"`
		NextCursor *string          `json:"nextCursor"`
	}](t, w)
	if got.NextCursor == nil || *got.NextCursor != "cur_2" {
		t.Errorf("nextCursor %v", got.NextCursor)
	}
	e.m.listNext = ""
	if !strings.Contains(e.do("GET", "/v1/sandboxes", "").Body.String(), `"nextCursor":null`) {
		t.Error("last page has no nextCursor:null")
	}
	if e.m.listOpts.Limit != 50 {
		t.Errorf("default limit %d", e.m.listOpts.Limit)
	}
	for _, q := range []string{"limit=101", "limit=x", "state=exploded", "label=nocolon", "includeStopped=maybe"} {
		if w := e.do("GET", "/v1/sandboxes?"+q, ""); w.Code != 400 {
			t.Errorf("%s: status %d", q, w.Code)
		}
	}
}

func TestDeleteAndExtend(t *testing.T) {
	e := newEnv(t)
	e.m.add("key_a", "sbx_r", sandbox.StateRunning, time.Hour)
	w := e.do("DELETE", "/v1/sandboxes/sbx_r", "")
	want := map[string]any{"id": "sbx_r", "status": "deleted", "state": "deleted", "deletedAt": "2026-11-01T13:00:00.000Z"}
	if diff := cmp.Diff(want, decodeBody[map[string]any](t, w)); diff != "" {
		t.Errorf("delete (-want +got):\n%s", diff)
	}
	e.m.add("key_a", "sbx_x", sandbox.StateRunning, time.Minute)
	for _, tt := range []struct {
		body   string
		status int
	}{{`{"seconds":600}`, 200}, {`{"seconds":0}`, 400}, {`{"seconds":3601}`, 400}, {`{}`, 400}, {`{"secs":5}`, 400}} {
		if w := e.do("POST", "/v1/sandboxes/sbx_x:extend", tt.body); w.Code != tt.status {
			t.Errorf("extend %s: status %d, want %d: %s", tt.body, w.Code, tt.status, w.Body)
		}
	}
}

func TestCodedErrors(t *testing.T) {
	tests := []struct {
		err    error
		status int
		code   string
	}{
		{errdefs.New(errdefs.ErrConflict, "name_taken", "taken"), 409, "name_taken"},
		{errdefs.New(errdefs.ErrInvalidArgument, "too_large", "big"), 413, "too_large"},
		{errdefs.New(errdefs.ErrUnavailable, "no_capacity", "full"), 503, "no_capacity"},
		{errdefs.ErrConflict, 409, "conflict"},
		{errdefs.ErrInvalidArgument, 400, "invalid_request"},
		{errdefs.ErrUnavailable, 503, "unavailable"},
		{errdefs.ErrPermission, 403, "permission_denied"},
		{errdefs.New(errdefs.ErrInternal, "db_broken", "secret db path"), 500, "internal"},
	}
	for _, tt := range tests {
		t.Run(tt.code, func(t *testing.T) {
			e := newEnv(t)
			e.m.createErr = tt.err
			w := e.do("POST", "/v1/sandboxes", "{}")
			if w.Code != tt.status {
				t.Fatalf("status %d, want %d", w.Code, tt.status)
			}
			if got := errorOf(t, w); got.Code != tt.code || strings.Contains(got.Message, "secret") {
				t.Errorf("got %+v, want code %s and no detail", got, tt.code)
			}
		})
	}
}

func newTestUploads(t *testing.T) *Uploads {
	t.Helper()
	u, err := NewUploads(upload.Config{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	return u
}

func TestHealthReportsConfinement(t *testing.T) {
	s := newServer(Config{Manager: rolesOf(newFakeManager()), Keys: fakeKeys{}, Version: "test",
		Accel:       func() string { return "tcg" },
		Confinement: func() any { return map[string]any{"confined": true, "seccomp": "on"} }})
	w := httptest.NewRecorder()
	s.ServeHTTP(w, httptest.NewRequest("GET", "/healthz", nil))
	var body struct {
		Status, Version, Accel string
		Confinement            map[string]any
	}
	if err := json.Unmarshal(w.Body.Bytes(), &body); err != nil {
		t.Fatal(err)
	}
	if body.Status != "ok" || body.Version != "test" || body.Accel != "tcg" || body.Confinement["confined"] != true {
		t.Errorf("health = %s", w.Body)
	}
}
