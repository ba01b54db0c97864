// Package integration boots real sandboxes: it builds emberbox and
// emberbox-agent, runs `emberbox serve` on a free port with a fresh data dir,
// and drives the HTTP API with net/http. Every test here starts real QEMU
// VMs (under TCG where KVM does not work), so the package is skipped under
// -short and nowhere else.
//
// A server started by startServer is stopped by the test's cleanup, which
// first deletes every sandbox the test created through it (or through a
// later server on the same data dir) and then checks that no VM of the data
// dir is left running.
package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// binDir holds the emberbox and emberbox-agent binaries TestMain built; it
// is empty under -short.
var binDir string

func TestMain(m *testing.M) {
	flag.Parse()
	if testing.Short() {
		os.Exit(m.Run())
	}
	dir, err := os.MkdirTemp("", "emberbox-integration-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "integration:", err)
		os.Exit(1)
	}
	if err := buildBinaries(dir); err != nil {
		fmt.Fprintln(os.Stderr, "integration: building binaries:", err)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	binDir = dir
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// buildBinaries builds the server and the (static) guest agent into dir,
// from the module root.
func buildBinaries(dir string) error {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return fmt.Errorf("go env GOMOD: %w", err)
	}
	gomod := strings.TrimSpace(string(out))
	if gomod == "" || gomod == os.DevNull {
		return errors.New("not inside a Go module")
	}
	root := filepath.Dir(gomod)
	for _, b := range []struct {
		out, pkg string
		env      []string
	}{
		{"emberbox", "./cmd/emberbox", nil},
		{"emberbox-agent", "./cmd/emberbox-agent", []string{"CGO_ENABLED=0"}},
	} {
		cmd := exec.Command("go", "build", "-o", filepath.Join(dir, b.out), b.pkg)
		cmd.Dir = root
		cmd.Env = append(os.Environ(), b.env...)
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("go build %s: %v\n%s", b.pkg, err, out)
		}
	}
	return nil
}

// needVMs skips t under -short.
func needVMs(t testing.TB) {
	t.Helper()
	if testing.Short() || binDir == "" {
		t.Skip("boots VMs; skipped under -short")
	}
}

// Timeouts. The machine may be small, shared and without KVM.
const (
	healthTimeout   = 10 * time.Minute // a cold machine builds the guest image first
	requestTimeout  = 3 * time.Minute  // one ordinary API call
	stopGrace       = 15 * time.Second // SIGTERM to SIGKILL
	deleteWaitValue = "wait=60"
)

// tracker remembers the sandboxes created on one data dir, across restarts
// of its server, so the last server standing deletes them all.
type tracker struct {
	mu  sync.Mutex
	ids map[string]string // sandbox id → API key that created it
	ord []string
}

var trackers sync.Map // data dir → *tracker

func trackerFor(dataDir string) *tracker {
	v, _ := trackers.LoadOrStore(dataDir, &tracker{ids: map[string]string{}})
	return v.(*tracker)
}

func (tr *tracker) add(id, key string) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	if _, ok := tr.ids[id]; !ok {
		tr.ids[id] = key
		tr.ord = append(tr.ord, id)
	}
}

func (tr *tracker) all() []string {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return append([]string(nil), tr.ord...)
}

func (tr *tracker) key(id string) string {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return tr.ids[id]
}

// server is one running `emberbox serve`.
type server struct {
	URL      string
	DataDir  string
	AdminKey string
	LogPath  string

	cmd     *exec.Cmd
	exited  chan struct{} // closed when the process has been reaped
	waitErr error
	tr      *tracker
}

var serverSeq struct {
	sync.Mutex
	n int
}

// freePort returns a port that was free a moment ago: listen on :0, close.
func freePort(t testing.TB) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("finding a free port: %v", err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	return port
}

// startServer runs `emberbox serve` on a free port with dataDir and waits
// until /healthz answers. Its cleanup deletes every sandbox created on
// dataDir, stops the server (SIGTERM, then SIGKILL after 15 s), makes sure
// no VM of dataDir is left, and prints the log's tail if the test failed.
func startServer(t testing.TB, dataDir string) *server {
	t.Helper()
	return startServerEnv(t, dataDir)
}

// startServerEnv is startServer with extra environment variables
// ("NAME=value") for the server.
func startServerEnv(t testing.TB, dataDir string, env ...string) *server {
	t.Helper()
	return startServerArgs(t, dataDir, nil, env...)
}

// startServerArgs is startServerEnv with extra flags for emberbox serve.
func startServerArgs(t testing.TB, dataDir string, args []string, env ...string) *server {
	t.Helper()
	needVMs(t)
	var lastErr error
	for attempt := 1; attempt <= 3; attempt++ {
		s, err := launch(t, "127.0.0.1", dataDir, args, env)
		if err == nil {
			return s
		}
		lastErr = err
		if !errors.Is(err, errPortTaken) {
			break
		}
		t.Logf("port taken between probe and listen; retrying (%v)", err)
	}
	t.Fatalf("starting emberbox serve: %v", lastErr)
	return nil
}

var errPortTaken = errors.New("address already in use")

func launch(t testing.TB, host, dataDir string, args, env []string) (*server, error) {
	serverSeq.Lock()
	serverSeq.n++
	n := serverSeq.n
	serverSeq.Unlock()

	logDir := t.TempDir()
	port := freePort(t)
	s := &server{
		URL:     fmt.Sprintf("http://%s:%d", host, port),
		DataDir: dataDir,
		LogPath: filepath.Join(logDir, fmt.Sprintf("server-%d.log", n)),
		exited:  make(chan struct{}),
		tr:      trackerFor(dataDir),
	}
	logf, err := os.Create(s.LogPath)
	if err != nil {
		return nil, err
	}
	s.cmd = exec.Command(filepath.Join(binDir, "emberbox"), append([]string{"serve",
		"--listen", fmt.Sprintf("%s:%d", host, port), "--data-dir", dataDir}, args...)...)
	s.cmd.Stdout, s.cmd.Stderr = logf, logf
	if len(env) > 0 {
		s.cmd.Env = append(os.Environ(), env...)
	}
	// Its own process group, so a terminal's ^C reaches it only through us.
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := s.cmd.Start(); err != nil {
		logf.Close()
		return nil, err
	}
	go func() {
		s.waitErr = s.cmd.Wait()
		logf.Close()
		close(s.exited)
	}()
	registerServer(s)
	t.Cleanup(func() { s.cleanup(t) })

	start := time.Now()
	deadline := start.Add(healthTimeout)
	hc := &http.Client{Transport: &http.Transport{Proxy: nil}, Timeout: 5 * time.Second}
	defer hc.CloseIdleConnections()
	for {
		select {
		case <-s.exited:
			tail := s.logTail(40)
			if strings.Contains(tail, "address already in use") {
				return nil, fmt.Errorf("%w: %s", errPortTaken, s.URL)
			}
			return nil, fmt.Errorf("server exited (%v) before answering /healthz; log tail:\n%s", s.waitErr, tail)
		default:
		}
		resp, err := hc.Get(s.URL + "/healthz")
		if err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("/healthz did not answer within %s; log tail:\n%s", healthTimeout, s.logTail(40))
		}
		select {
		case <-s.exited:
		case <-time.After(200 * time.Millisecond):
		}
	}
	key, err := os.ReadFile(filepath.Join(dataDir, "admin.key"))
	switch {
	case err == nil:
		s.AdminKey = strings.TrimSpace(string(key))
	case errors.Is(err, os.ErrNotExist) && slices.Contains(args, "--store"):
		// A node of a cluster whose store had keys already: the first
		// node's admin key is the cluster's.
	default:
		return nil, fmt.Errorf("reading admin key: %w", err)
	}
	t.Logf("emberbox serve %s (data dir %s, pid %d) ready in %s", s.URL, dataDir, s.cmd.Process.Pid, time.Since(start).Round(time.Millisecond))
	return s, nil
}

// alive reports whether the server process is still running.
func (s *server) alive() bool {
	select {
	case <-s.exited:
		return false
	default:
		return true
	}
}

// kill9 kills the server with SIGKILL (its VMs keep running) and waits
// until it is gone.
func (s *server) kill9(t testing.TB) {
	t.Helper()
	if err := s.cmd.Process.Signal(syscall.SIGKILL); err != nil && s.alive() {
		t.Fatalf("SIGKILL server: %v", err)
	}
	select {
	case <-s.exited:
	case <-time.After(30 * time.Second):
		t.Fatalf("server pid %d still running 30 s after SIGKILL", s.cmd.Process.Pid)
	}
}

// terminate sends SIGTERM and, after stopGrace, SIGKILL.
func (s *server) terminate(t testing.TB) {
	if !s.alive() {
		return
	}
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.exited:
		return
	case <-time.After(stopGrace):
	}
	t.Errorf("server pid %d ignored SIGTERM for %s; killing it", s.cmd.Process.Pid, stopGrace)
	_ = s.cmd.Process.Signal(syscall.SIGKILL)
	<-s.exited
}

func (s *server) cleanup(t testing.TB) {
	if t.Failed() {
		s.logConsoles(t) // before the deletes below remove them
	}
	if s.alive() {
		c := s.client(s.AdminKey)
		for _, id := range s.tr.all() {
			key := s.tr.key(id)
			if key == "" {
				continue
			}
			c.key = key
			resp := c.raw(t, "DELETE", "/v1/sandboxes/"+id, nil, http.Header{"Prefer": {deleteWaitValue}}, requestTimeout)
			if resp.err != nil {
				t.Errorf("cleanup: DELETE %s: %v", id, resp.err)
				continue
			}
			if resp.Status != http.StatusOK && resp.Status != http.StatusNotFound {
				t.Errorf("cleanup: DELETE %s: HTTP %d %s", id, resp.Status, resp.Body)
			}
		}
		s.terminate(t)
	}
	// Whatever still runs on this data dir now has nobody to account for it,
	// unless a later server on the same dir is still up (restart tests).
	if !anotherServerAlive(s) {
		for _, p := range vmProcesses(s.DataDir) {
			report := t.Errorf
			if t.Failed() {
				report = t.Logf
			}
			report("cleanup: VM pid %d (%s) left running on %s; killing it", p.PID, p.Name, s.DataDir)
			_ = syscall.Kill(p.PID, syscall.SIGKILL)
		}
		// A template build a kill -9 cut short leaves its VM for the next
		// server on the data dir to end; there is none.
		for _, p := range templateVMs(s.DataDir) {
			_ = syscall.Kill(p.PID, syscall.SIGKILL)
		}
	}
	if t.Failed() {
		t.Logf("server %s log (%s), last lines:\n%s", s.URL, s.LogPath, s.logTail(60))
	}
	unregisterServer(s)
}

// live servers, by data dir, so a dead server's cleanup can tell whether a
// successor will clean up.
var liveServers struct {
	sync.Mutex
	m map[*server]bool
}

func registerServer(s *server) {
	liveServers.Lock()
	defer liveServers.Unlock()
	if liveServers.m == nil {
		liveServers.m = map[*server]bool{}
	}
	liveServers.m[s] = true
}

func unregisterServer(s *server) {
	liveServers.Lock()
	defer liveServers.Unlock()
	delete(liveServers.m, s)
}

func anotherServerAlive(s *server) bool {
	liveServers.Lock()
	defer liveServers.Unlock()
	for o := range liveServers.m {
		if o != s && o.DataDir == s.DataDir && o.alive() {
			return true
		}
	}
	return false
}

// logTail returns the last n lines of the server's log.
// consolesLogged holds the data dirs whose guests' consoles a failed test
// has logged already: several servers may share one.
var consolesLogged sync.Map

// logConsoles logs the last lines of each sandbox's console (its kernel
// and agent), once per data dir: what a guest did is often why a check
// failed, and the files go with the sandboxes.
func (s *server) logConsoles(t testing.TB) {
	if _, done := consolesLogged.LoadOrStore(s.DataDir, true); done {
		return
	}
	logs, _ := filepath.Glob(filepath.Join(s.DataDir, "sandboxes", "*", "console.log"))
	for _, p := range logs {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
		if len(lines) > 25 {
			lines = lines[len(lines)-25:]
		}
		t.Logf("guest console %s, last lines:\n%s", filepath.Base(filepath.Dir(p)), strings.Join(lines, "\n"))
	}
}

func (s *server) logTail(n int) string {
	b, err := os.ReadFile(s.LogPath)
	if err != nil {
		return "(no log: " + err.Error() + ")"
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// createKey runs `emberbox keys create` against the data dir (the server
// may be running: the store is SQLite in WAL mode) and returns the secret.
func (s *server) createKey(t testing.TB, name string) string {
	t.Helper()
	cmd := exec.Command(filepath.Join(binDir, "emberbox"), "keys", "create", "--data-dir", s.DataDir, "--name", name)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("emberbox keys create: %v: %s", err, stderr.String())
	}
	secret := strings.TrimSpace(string(out))
	if secret == "" {
		t.Fatalf("emberbox keys create printed no secret (stderr %q)", stderr.String())
	}
	return secret
}

// vmProc is a QEMU process found in /proc.
type vmProc struct {
	PID  int
	Name string // the -name argument: emberbox-<sandbox id>
	Dir  string // its working directory: the sandbox's directory
}

// vmProcesses lists the live (not zombie) QEMU processes whose working
// directory is under dataDir: the VMs of that data dir's sandboxes.
func vmProcesses(dataDir string) []vmProc { return vmsUnder(dataDir, "sandboxes") }

// vmsUnder returns the VMs whose directory is under dataDir/sub.
func vmsUnder(dataDir, sub string) []vmProc {
	if d, err := filepath.EvalSymlinks(dataDir); err == nil {
		dataDir = d
	}
	prefix := filepath.Join(dataDir, sub) + string(filepath.Separator)
	var out []vmProc
	for _, p := range allVMs() {
		if strings.HasPrefix(p.Dir, prefix) {
			out = append(out, p)
		}
	}
	return out
}

// templateVMs returns the VMs of template builds on dataDir.
func templateVMs(dataDir string) []vmProc { return vmsUnder(dataDir, "templates") }

// vmPID returns the pid of the live QEMU process of sandbox id (its command
// line names emberbox-<id>), or 0.
func vmPID(id string) int {
	for _, p := range allVMs() {
		if p.Name == "emberbox-"+id {
			return p.PID
		}
	}
	return 0
}

func allVMs() []vmProc {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var out []vmProc
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if err != nil {
			continue
		}
		args := strings.Split(strings.TrimRight(string(cmdline), "\x00"), "\x00")
		name := ""
		for i := 0; i+1 < len(args); i++ {
			if args[i] == "-name" && strings.HasPrefix(args[i+1], "emberbox-") {
				name = args[i+1]
				break
			}
		}
		if name == "" || !processAlive(pid) {
			continue
		}
		dir, _ := os.Readlink(fmt.Sprintf("/proc/%d/cwd", pid))
		out = append(out, vmProc{PID: pid, Name: name, Dir: dir})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].PID < out[j].PID })
	return out
}

// processAlive reports whether pid exists and is not a zombie.
func processAlive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 || i+2 >= len(s) {
		return false
	}
	return s[i+2] != 'Z' && s[i+2] != 'X'
}

// waitUntil polls cond every interval until it returns true or timeout
// passes; it reports whether cond became true.
func waitUntil(timeout, interval time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	for {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(interval)
	}
}

// ---------------------------------------------------------------------------
// HTTP client

// client calls the API with one key.
type client struct {
	s   *server
	key string
	hc  *http.Client
}

// requestIDs are the x-request-id values seen, which must all differ.
var requestIDs struct {
	sync.Mutex
	seen map[string]bool
}

func (s *server) client(key string) *client {
	return &client{s: s, key: key, hc: &http.Client{Transport: &http.Transport{Proxy: nil, MaxIdleConnsPerHost: 8}}}
}

// apiError is the API's one error shape.
type apiError struct {
	Code      string         `json:"code"`
	Status    int            `json:"status"`
	Message   string         `json:"message"`
	Hint      string         `json:"hint"`
	Details   map[string]any `json:"details"`
	RequestID string         `json:"requestId"`
}

// issuePaths returns details.issues[].path of an invalid_request error.
func (e *apiError) issuePaths() []string {
	if e == nil {
		return nil
	}
	issues, _ := e.Details["issues"].([]any)
	var out []string
	for _, it := range issues {
		if m, ok := it.(map[string]any); ok {
			p, _ := m["path"].(string)
			out = append(out, p)
		}
	}
	return out
}

// response is an answer, with the error shape decoded when Status >= 400.
type response struct {
	Status int
	Header http.Header
	Body   []byte
	Err    *apiError // decoded error shape, for 4xx/5xx
	err    error     // transport error
}

func (r *response) String() string {
	if r.err != nil {
		return "transport error: " + r.err.Error()
	}
	b := r.Body
	if len(b) > 600 {
		b = append(b[:600:600], "…"...)
	}
	return fmt.Sprintf("HTTP %d %s", r.Status, b)
}

// raw sends one request. body is JSON-encoded unless it is []byte. Every
// answer must carry x-request-id; a missing one is reported on t.
func (c *client) raw(t testing.TB, method, path string, body any, hdr http.Header, timeout time.Duration) *response {
	t.Helper()
	var rd io.Reader
	isJSON := false
	switch b := body.(type) {
	case nil:
	case []byte:
		rd = bytes.NewReader(b)
	case string:
		rd, isJSON = strings.NewReader(b), true
	default:
		j, err := json.Marshal(b)
		if err != nil {
			t.Fatalf("encoding request body: %v", err)
		}
		rd, isJSON = bytes.NewReader(j), true
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, c.s.URL+path, rd)
	if err != nil {
		t.Fatalf("building request: %v", err)
	}
	if c.key != "" {
		req.Header.Set("Authorization", "Bearer "+c.key)
	}
	if isJSON {
		req.Header.Set("Content-Type", "application/json")
	} else if rd != nil {
		req.Header.Set("Content-Type", "application/octet-stream")
	}
	for k, vs := range hdr {
		for _, v := range vs {
			req.Header.Add(k, v)
		}
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return &response{err: err}
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	out := &response{Status: resp.StatusCode, Header: resp.Header, Body: data, err: err}
	// The Runtime API's answers carry a request id; E2B's protocol and
	// a sandbox's own answers (previews) need not.
	if !strings.HasPrefix(path, "/v1/") {
		return out
	}
	if rid := resp.Header.Get("x-request-id"); !strings.HasPrefix(rid, "req_") {
		t.Errorf("%s %s: answer has no x-request-id (got %q)", method, path, rid)
	} else {
		requestIDs.Lock()
		if requestIDs.seen == nil {
			requestIDs.seen = map[string]bool{}
		}
		if requestIDs.seen[rid] {
			t.Errorf("%s %s: x-request-id %q was already used by another answer", method, path, rid)
		}
		requestIDs.seen[rid] = true
		requestIDs.Unlock()
	}
	if method == "POST" && strings.HasPrefix(path, "/v1/sandboxes") && !strings.Contains(path[len("/v1/sandboxes"):], "/") &&
		!strings.Contains(path, ":") && resp.StatusCode == http.StatusOK {
		// A create: whatever made it, the sandbox is deleted at cleanup.
		var sb sandboxJSON
		if json.Unmarshal(data, &sb) == nil && sb.ID != "" {
			c.s.tr.add(sb.ID, c.key)
		}
	}
	if resp.StatusCode >= 400 {
		var eb struct {
			Error *apiError `json:"error"`
		}
		if jerr := json.Unmarshal(data, &eb); jerr != nil || eb.Error == nil {
			t.Errorf("%s %s: HTTP %d answer is not the error shape: %s", method, path, resp.StatusCode, data)
			out.Err = &apiError{Status: resp.StatusCode}
		} else {
			out.Err = eb.Error
			if eb.Error.Status != resp.StatusCode {
				t.Errorf("%s %s: error status %d differs from HTTP %d", method, path, eb.Error.Status, resp.StatusCode)
			}
			if eb.Error.RequestID != resp.Header.Get("x-request-id") {
				t.Errorf("%s %s: error requestId %q differs from x-request-id %q", method, path, eb.Error.RequestID, resp.Header.Get("x-request-id"))
			}
		}
	}
	return out
}

// call sends a request that must succeed with 200 and decodes the answer.
func call[T any](t testing.TB, c *client, method, path string, body any, hdr http.Header) (T, *response) {
	t.Helper()
	var v T
	r := c.raw(t, method, path, body, hdr, requestTimeout)
	if r.err != nil || r.Status != http.StatusOK {
		t.Fatalf("%s %s: %v", method, path, r)
	}
	if err := json.Unmarshal(r.Body, &v); err != nil {
		t.Fatalf("%s %s: decoding %s: %v", method, path, r.Body, err)
	}
	return v, r
}

// sandboxJSON is the wire form of a sandbox (the fields the tests read).
type sandboxJSON struct {
	ID               string            `json:"id"`
	Kind             string            `json:"kind"`
	Status           string            `json:"status"`
	State            string            `json:"state"`
	Labels           map[string]string `json:"labels"`
	VCPU             int               `json:"vcpu"`
	MemoryMiB        int               `json:"memoryMiB"`
	TimeoutSeconds   int               `json:"timeoutSeconds"`
	OnLeaseEnd       string            `json:"onLeaseEnd"`
	IdlePauseSeconds int               `json:"idlePauseSeconds"`
	CreatedAt        *time.Time        `json:"createdAt"`
	ReadyAt          *time.Time        `json:"readyAt"`
	ExpiresAt        *time.Time        `json:"expiresAt"`
	EndedAt          *time.Time        `json:"endedAt"`
	StopReason       *string           `json:"stopReason"`
	Accel            *string           `json:"accel"`
	Replayed         bool              `json:"replayed"`
	Node             string            `json:"node"`
}

func (sb sandboxJSON) stopReason() string {
	if sb.StopReason == nil {
		return ""
	}
	return *sb.StopReason
}

// create POSTs /v1/sandboxes with body (nil means {}), asking to wait up to
// 60 s for running, and tracks the sandbox for cleanup. It fails t unless
// the answer is 200.
func (c *client) create(t testing.TB, body map[string]any, hdr http.Header) sandboxJSON {
	t.Helper()
	if body == nil {
		body = map[string]any{}
	}
	h := http.Header{"Prefer": {"wait=60"}}
	for k, v := range hdr {
		h[k] = v
	}
	r := c.raw(t, "POST", "/v1/sandboxes", body, h, requestTimeout)
	if r.err != nil || r.Status != http.StatusOK {
		t.Fatalf("create: %v", r)
	}
	var sb sandboxJSON
	if err := json.Unmarshal(r.Body, &sb); err != nil || sb.ID == "" {
		t.Fatalf("create: decoding %s: %v", r.Body, err)
	}
	return sb
}

// createRunning creates a sandbox and, if the create's wait was not enough,
// waits for it to run; it fails t unless it runs.
func (c *client) createRunning(t testing.TB, body map[string]any) sandboxJSON {
	t.Helper()
	sb := c.create(t, body, nil)
	if sb.State != "running" {
		sb = c.waitState(t, sb.ID, "running")
	}
	return sb
}

// waitState waits (GET ?waitFor=, repeated, up to 5 min) for a state.
func (c *client) waitState(t testing.TB, id, state string) sandboxJSON {
	t.Helper()
	deadline := time.Now().Add(5 * time.Minute)
	for {
		sb, _ := call[sandboxJSON](t, c, "GET", "/v1/sandboxes/"+id+"?waitFor="+state+"&timeoutSeconds=60", nil, nil)
		if sb.State == state {
			return sb
		}
		if sb.State == "stopped" || sb.State == "deleted" || time.Now().After(deadline) {
			t.Fatalf("sandbox %s is %s (stopReason %q), want %s", id, sb.State, sb.stopReason(), state)
		}
	}
}

func (c *client) get(t testing.TB, id string) sandboxJSON {
	t.Helper()
	sb, _ := call[sandboxJSON](t, c, "GET", "/v1/sandboxes/"+id, nil, nil)
	return sb
}

func (c *client) delete(t testing.TB, id string) {
	t.Helper()
	r := c.raw(t, "DELETE", "/v1/sandboxes/"+id, nil, http.Header{"Prefer": {deleteWaitValue}}, requestTimeout)
	if r.err != nil || r.Status != http.StatusOK {
		t.Fatalf("DELETE %s: %v", id, r)
	}
}

// execReq is the body of …:exec.
type execReq struct {
	Command   string            `json:"command,omitempty"`
	Argv      []string          `json:"argv,omitempty"`
	Cwd       string            `json:"cwd,omitempty"`
	Env       map[string]string `json:"env,omitempty"`
	Stdin     *string           `json:"stdin,omitempty"`
	TimeoutMs int64             `json:"timeoutMs,omitempty"`
	Stream    bool              `json:"stream,omitempty"`
	User      string            `json:"user,omitempty"`
}

// execResult is the JSON answer of an exec.
type execResult struct {
	ExitCode        *int   `json:"exitCode"`
	Stdout          string `json:"stdout"`
	Stderr          string `json:"stderr"`
	TimedOut        bool   `json:"timedOut"`
	StdoutTruncated bool   `json:"stdoutTruncated"`
	StderrTruncated bool   `json:"stderrTruncated"`
	DurationMs      int64  `json:"durationMs"`
	ProcessID       string `json:"processId"`
}

func (r execResult) exit() string {
	if r.ExitCode == nil {
		return "null"
	}
	return strconv.Itoa(*r.ExitCode)
}

// exec runs a command and returns its result; it fails t unless the call
// answers 200.
func (c *client) exec(t testing.TB, id string, req execReq) (execResult, *response) {
	t.Helper()
	timeout := requestTimeout
	if d := time.Duration(req.TimeoutMs)*time.Millisecond + time.Minute; d > timeout {
		timeout = d
	}
	r := c.raw(t, "POST", "/v1/sandboxes/"+id+":exec", req, nil, timeout)
	if r.err != nil || r.Status != http.StatusOK {
		t.Fatalf("exec %q: %v", req.Command, r)
	}
	var res execResult
	if err := json.Unmarshal(r.Body, &res); err != nil {
		t.Fatalf("exec %q: decoding %s: %v", req.Command, r.Body, err)
	}
	return res, r
}

// sh runs command and fails t unless it exits 0; it returns stdout.
func (c *client) sh(t testing.TB, id, command string) string {
	t.Helper()
	res, _ := c.exec(t, id, execReq{Command: command})
	if res.ExitCode == nil || *res.ExitCode != 0 {
		t.Fatalf("%q: exit %s, stdout %q, stderr %q", command, res.exit(), res.Stdout, res.Stderr)
	}
	return res.Stdout
}

func filePath(id, path string) string {
	return "/v1/sandboxes/" + id + "/files/content?path=" + url.QueryEscape(path)
}

// writeFile PUTs data to path in the sandbox.
func (c *client) writeFile(t testing.TB, id, path string, data []byte) {
	t.Helper()
	r := c.raw(t, "PUT", filePath(id, path), data, nil, requestTimeout)
	if r.err != nil || r.Status != http.StatusOK {
		t.Fatalf("writing %s: %v", path, r)
	}
}

// readFile GETs path's bytes; it fails t unless the answer is 200.
func (c *client) readFile(t testing.TB, id, path string) ([]byte, *response) {
	t.Helper()
	r := c.raw(t, "GET", filePath(id, path), nil, nil, requestTimeout)
	if r.err != nil || r.Status != http.StatusOK {
		t.Fatalf("reading %s: %v", path, r)
	}
	return r.Body, r
}

// processJSON is the wire form of a process.
type processJSON struct {
	ID       string `json:"id"`
	State    string `json:"state"`
	ExitCode *int   `json:"exitCode"`
	Command  string `json:"command"`
	PID      int    `json:"pid"`
}

func (c *client) spawn(t testing.TB, id, command string) processJSON {
	t.Helper()
	p, _ := call[processJSON](t, c, "POST", "/v1/sandboxes/"+id+"/processes", map[string]any{"command": command}, nil)
	if p.ID == "" {
		t.Fatalf("spawn %q: no process id", command)
	}
	return p
}

func (c *client) processes(t testing.TB, id string) []processJSON {
	t.Helper()
	l, _ := call[struct {
		Data []processJSON `json:"data"`
	}](t, c, "GET", "/v1/sandboxes/"+id+"/processes", nil, nil)
	return l.Data
}

func (c *client) list(t testing.TB, query string) []sandboxJSON {
	t.Helper()
	l, _ := call[struct {
		Data []sandboxJSON `json:"data"`
	}](t, c, "GET", "/v1/sandboxes"+query, nil, nil)
	return l.Data
}

// percentile returns the p-th percentile (0..100, nearest rank) of xs.
func percentile(xs []float64, p float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	rank := int(p/100*float64(len(s))+0.999999) - 1
	rank = max(0, min(rank, len(s)-1))
	return s[rank]
}

// tail is the last n bytes of s, marked when cut.
func tail(s string, n int) string {
	if len(s) > n {
		return "…" + s[len(s)-n:]
	}
	return s
}
