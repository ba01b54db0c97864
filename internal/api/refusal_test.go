package api

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/emberbox/emberbox/internal/guest"
	"github.com/emberbox/emberbox/internal/sandbox"
)

// guestRouteRequests is a valid request to every route that calls a guest,
// by OpID; a route marked Guest without one here fails the test below.
// pid is the process in the path (default p1); running is the status a
// running sandbox answers when it is not a success; websocket routes sent
// without an upgrade answer 426 websocket_required.
var guestRouteRequests = map[string]struct {
	query, body, pid string
	running          int
	websocket        bool
}{
	"tunnel":             {websocket: true},
	"exec":               {body: `{"command":"true"}`},
	"spawnProcess":       {body: `{"command":"sleep 1"}`},
	"listProcesses":      {},
	"getProcess":         {},
	"processOutput":      {},
	"signalProcess":      {body: `{"signal":"SIGTERM"}`},
	"writeProcess":       {body: `{"data":"x"}`},
	"resizeProcess":      {body: `{"cols":100,"rows":30}`, pid: fakeTTYID},
	"terminal":           {query: "?cols=100", running: http.StatusUpgradeRequired}, // not a WebSocket here
	"readFile":           {query: "?path=/tmp/x"},
	"writeFile":          {query: "?path=/tmp/x", body: "hi"},
	"listFiles":          {query: "?path=/tmp"},
	"statFile":           {query: "?path=/tmp/x"},
	"mkdir":              {body: `{"path":"/tmp/d"}`},
	"removeFile":         {body: `{"path":"/tmp/y"}`},
	"chmodFile":          {body: `{"path":"/tmp/x","mode":"755"}`},
	"renameFile":         {body: `{"from":"/tmp/x","to":"/tmp/z","overwrite":true}`},
	"downloadArchive":    {query: "?path=/tmp"},
	"uploadArchive":      {query: "?path=/tmp/in", body: "tar"},
	"beginUpload":        {body: `{"path":"/workspace/big","size":2000000,"sha256":"` + strings.Repeat("0", 64) + `"}`},
	"beginArchiveUpload": {body: `{"path":"/tmp/in","gzip":true,"user":"sandbox"}`},
	"startWatch":         {body: `{"path":"/tmp"}`},
	"listWatches":        {},
	"watchEvents":        {},
	"stopWatch":          {},
	// The test server has no interpreter: a running sandbox gets 501.
	"interpreterRun":              {body: `{"code":"1"}`, running: http.StatusNotImplemented},
	"listInterpreterContexts":     {running: http.StatusNotImplemented},
	"createInterpreterContext":    {body: `{}`, running: http.StatusNotImplemented},
	"restartInterpreterContext":   {running: http.StatusNotImplemented},
	"interruptInterpreterContext": {running: http.StatusNotImplemented},
	"deleteInterpreterContext":    {running: http.StatusNotImplemented},
	"interpreterResult":           {running: http.StatusNotImplemented},
	// Nor computer use.
	"startBrowser":      {body: `{}`, running: http.StatusNotImplemented},
	"getBrowser":        {running: http.StatusNotImplemented},
	"stopBrowser":       {running: http.StatusNotImplemented},
	"startDesktop":      {body: `{}`, running: http.StatusNotImplemented},
	"getDesktop":        {running: http.StatusNotImplemented},
	"stopDesktop":       {running: http.StatusNotImplemented},
	"desktopAct":        {body: `{"action":"cursor"}`, running: http.StatusNotImplemented},
	"desktopScreenshot": {running: http.StatusNotImplemented},
	"startRecording":    {body: `{}`, running: http.StatusNotImplemented},
	"listRecordings":    {running: http.StatusNotImplemented},
	"getRecording":      {running: http.StatusNotImplemented},
	"stopRecording":     {running: http.StatusNotImplemented},
	"recordingVideo":    {running: http.StatusNotImplemented},
	"deleteRecording":   {running: http.StatusNotImplemented},
	"startMcp":          {body: `{"servers":[{"id":"time"}]}`, running: http.StatusNotImplemented},
	"getMcp":            {running: http.StatusNotImplemented},
	"stopMcp":           {running: http.StatusNotImplemented},
}

// TestGuestRoutesRefuseByStateTable checks that every route that needs a
// running guest answers, for a sandbox in each other state, exactly the
// refusal the state table gives: the same code for the same state
// everywhere.
func TestGuestRoutesRefuseByStateTable(t *testing.T) {
	e := newEnv(t)
	var routes []route
	for _, rt := range e.s.routes {
		if rt.Guest {
			routes = append(routes, rt)
		}
	}
	if len(routes) < len(guestRouteRequests) {
		t.Fatalf("%d routes marked Guest, %d sample requests: a route lost its mark", len(routes), len(guestRouteRequests))
	}
	for _, st := range sandbox.States() {
		id := "sbx_" + string(st.State)
		e.m.add("key_a", id, st.State, time.Hour)
		e.m.files[id+"\x00/tmp/x"] = []byte("x")
		e.m.execResult = guest.ExecResult{ExitCode: intPtr(0)}
		for _, rt := range routes {
			req, ok := guestRouteRequests[rt.OpID]
			if !ok {
				t.Fatalf("route %s %s calls a guest but has no sample request in guestRouteRequests", rt.Method, rt.Path)
			}
			pid := req.pid
			if pid == "" {
				pid = "p1"
			}
			target := strings.NewReplacer("{id}", id, "{pid}", pid, "{watchId}", "wat_1", "{ctx}", "python", "{name}", "r1.png").Replace(rt.Path) + req.query
			w := e.do(rt.Method, target, req.body)
			name := string(st.State) + "/" + rt.OpID
			if st.Refusal == nil {
				if req.websocket {
					if w.Code != http.StatusUpgradeRequired || errorOf(t, w).Code != "websocket_required" {
						t.Errorf("%s: %d %s, want 426 websocket_required", name, w.Code, w.Body)
					}
					continue
				}
				if req.running != 0 {
					if w.Code != req.running {
						t.Errorf("%s: %d %s, want %d", name, w.Code, w.Body, req.running)
					}
					continue
				}
				if w.Code >= 400 {
					t.Errorf("%s: %d %s, want success", name, w.Code, w.Body)
				}
				continue
			}
			got := errorOf(t, w)
			want := toAPIError(sandbox.Refusal(&sandbox.Sandbox{ID: id, State: st.State}))
			if w.Code != want.Status || got.Code != st.Refusal.Code {
				t.Errorf("%s: %d %q, want %d %q", name, w.Code, got.Code, want.Status, st.Refusal.Code)
			}
			if st.Refusal.Code != "not_found" && got.Details["state"] != string(st.Wire) {
				t.Errorf("%s: details.state = %v, want %q", name, got.Details["state"], st.Wire)
			}
		}
	}
	// The refusals are the ones the API promises: a wrong state is a
	// conflict, a deleted sandbox is gone.
	for _, st := range sandbox.States() {
		if st.Refusal == nil {
			continue
		}
		want := http.StatusConflict
		if st.State == sandbox.StateDeleted {
			want = http.StatusNotFound
		}
		if got := toAPIError(sandbox.Refusal(&sandbox.Sandbox{ID: "x", State: st.State})).Status; got != want {
			t.Errorf("state %s refuses with %d, want %d", st.State, got, want)
		}
	}
}
