package envd_test

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/user"
	"strings"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/emberbox/emberbox/internal/agent"
	"github.com/emberbox/emberbox/internal/envd"
	"github.com/emberbox/emberbox/internal/envd/proto/filesystem/filesystemconnect"
	"github.com/emberbox/emberbox/internal/envd/proto/process/processconnect"
	"github.com/emberbox/emberbox/internal/guest"
	"github.com/emberbox/emberbox/internal/sandbox"
)

// env is an envd Server in front of a real agent (as the current user, on
// this host), reached over HTTP/1.1 as the router hands requests to it.
type env struct {
	url string
	dir string // a directory of the test's own
}

func newEnv(t *testing.T) *env {
	t.Helper()
	u, err := user.Current()
	if err != nil {
		t.Fatal(err)
	}
	return newAgentEnv(t, agent.Config{Root: "/", User: u.Username}, "")
}

// newAgentEnv is newEnv with an agent made from cfg and, if home is set,
// the router's layout home (Routed.Home).
func newAgentEnv(t *testing.T, cfg agent.Config, home string) *env {
	t.Helper()
	dir := t.TempDir()
	a, err := agent.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	hostEnd, guestEnd := socketPair(t)
	go func() { _ = a.ServeConn(ctx, guestEnd) }()
	hctx, hcancel := context.WithTimeout(ctx, 10*time.Second)
	defer hcancel()
	c, err := guest.Handshake(hctx, hostEnd)
	if err != nil {
		t.Fatal(err)
	}
	rt := sandbox.Routed{Sandbox: &sandbox.Sandbox{ID: "sb-test"}, Guest: c.Handle(), Home: home}
	srv := envd.New(nil)
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		srv.ServeHTTP(w, r.WithContext(sandbox.WithRouted(r.Context(), rt)))
	}))
	t.Cleanup(func() { ts.Close(); c.Close(); cancel(); guestEnd.Close() })
	return &env{url: ts.URL, dir: dir}
}

// codecs are the two a Connect client may speak; E2B's SDKs use JSON.
var codecs = []struct {
	name string
	opts []connect.ClientOption
}{
	{"json", []connect.ClientOption{connect.WithProtoJSON()}},
	{"proto", nil},
}

func (e *env) process(opts ...connect.ClientOption) processconnect.ProcessClient {
	return processconnect.NewProcessClient(http.DefaultClient, e.url, opts...)
}

func (e *env) filesystem(opts ...connect.ClientOption) filesystemconnect.FilesystemClient {
	return filesystemconnect.NewFilesystemClient(http.DefaultClient, e.url, opts...)
}

func socketPair(t *testing.T) (net.Conn, net.Conn) {
	t.Helper()
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	conns := make([]net.Conn, 2)
	for i, fd := range fds {
		f := os.NewFile(uintptr(fd), "socketpair")
		c, err := net.FileConn(f)
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		conns[i] = c
	}
	return conns[0], conns[1]
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func wantCode(t *testing.T, err error, code connect.Code) {
	t.Helper()
	var ce *connect.Error
	if !errors.As(err, &ce) || ce.Code() != code {
		t.Fatalf("got error %v, want code %v", err, code)
	}
}

// waitUntil polls cond until it holds or the deadline passes.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestHealth(t *testing.T) {
	e := newEnv(t)
	res, err := http.Get(e.url + "/health")
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusNoContent {
		t.Errorf("GET /health: %d, want 204", res.StatusCode)
	}
}

func TestUnservedPathsAnswerInEnvdsShape(t *testing.T) {
	srv := httptest.NewServer(envd.New(nil))
	defer srv.Close()
	for _, p := range []string{"/metrics", "/envs", "/init", "/files/compose"} {
		resp, err := http.Post(srv.URL+p, "application/json", strings.NewReader("{}"))
		if err != nil {
			t.Fatal(err)
		}
		var e struct {
			Code    int    `json:"code"`
			Message string `json:"message"`
		}
		err = json.NewDecoder(resp.Body).Decode(&e)
		resp.Body.Close()
		if resp.StatusCode != 404 || err != nil || e.Code != 404 || !strings.Contains(e.Message, "not served") {
			t.Errorf("%s: %d %+v %v", p, resp.StatusCode, e, err)
		}
	}
}
