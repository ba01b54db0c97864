package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	emberbox "github.com/emberbox/emberbox/sdk/go"
)

func TestResolvePrecedence(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "config.json")
	os.WriteFile(cfg, []byte(`{"server":"http://cfg:1","key":"cfgkey"}`), 0o600)
	os.WriteFile(filepath.Join(dir, adminKeyFile), []byte("adminkey\n"), 0o600)
	for _, k := range []string{"EMBERBOX_URL", "EMBERBOX_API_URL", "RUNTIME_API_URL", "EMBERBOX_API_KEY", "RUNTIME_API_KEY"} {
		t.Setenv(k, "")
	}
	t.Setenv("EMBERBOX_CONFIG", cfg)
	f := serverFlags{dataDir: dir}
	check := func(wantServer, wantKey string) {
		t.Helper()
		s, k, err := f.resolve()
		if err != nil || s != wantServer || k != wantKey {
			t.Errorf("resolve: %q %q %v; want %q %q", s, k, err, wantServer, wantKey)
		}
	}
	check("http://cfg:1", "cfgkey")
	t.Setenv("RUNTIME_API_URL", "http://runtime:2")
	t.Setenv("RUNTIME_API_KEY", "rtkey")
	check("http://runtime:2", "rtkey")
	t.Setenv("EMBERBOX_URL", "http://env:3/")
	t.Setenv("EMBERBOX_API_KEY", "envkey")
	check("http://env:3", "envkey")
	f.server, f.key = "http://flag:4", "flagkey"
	check("http://flag:4", "flagkey")
	t.Setenv("EMBERBOX_CONFIG", filepath.Join(dir, "none.json"))
	f = serverFlags{dataDir: dir}
	t.Setenv("EMBERBOX_URL", "")
	t.Setenv("RUNTIME_API_URL", "")
	t.Setenv("EMBERBOX_API_KEY", "")
	t.Setenv("RUNTIME_API_KEY", "")
	check(emberbox.DefaultURL, "adminkey")
	os.WriteFile(cfg, []byte(`{"server":`), 0o600)
	t.Setenv("EMBERBOX_CONFIG", cfg)
	if _, _, err := f.resolve(); err == nil {
		t.Error("a broken config file was read")
	}
}

func TestSplitRemote(t *testing.T) {
	for arg, want := range map[string][2]string{
		"sb_1:/workspace/a": {"sb_1", "/workspace/a"},
		"sb_1:":             {"sb_1", "."},
		"./a:b":             {"", "./a:b"},
		"/tmp/x":            {"", "/tmp/x"},
		":x":                {"", ":x"},
	} {
		if id, p := splitRemote(arg); id != want[0] || p != want[1] {
			t.Errorf("splitRemote(%q) = %q, %q", arg, id, p)
		}
	}
}

// TestSandboxCommands runs ls, exec and rm against an httptest server.
func TestSandboxCommands(t *testing.T) {
	now := time.Now().UTC()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer k1" {
			w.WriteHeader(401)
			fmt.Fprint(w, `{"error":{"code":"unauthorized","status":401,"message":"no"}}`)
			return
		}
		switch r.Method + " " + r.URL.Path {
		case "GET /v1/sandboxes":
			fmt.Fprintf(w, `{"data":[{"id":"sb_1","name":"web","state":"running","vcpu":2,"memoryMiB":1024,
				"createdAt":%q,"endsAt":%q}],"nextCursor":null}`,
				now.Add(-3*time.Hour).Format(time.RFC3339), now.Add(90*time.Minute).Format(time.RFC3339))
		case "POST /v1/sandboxes/sb_1:exec":
			fmt.Fprintln(w, `{"type":"start","processId":"p1"}`)
			fmt.Fprintln(w, `{"type":"stdout","data":"out\n","offset":0}`)
			fmt.Fprintln(w, `{"type":"stderr","data":"err\n","offset":4}`)
			fmt.Fprintln(w, `{"type":"exit","exitCode":3}`)
		case "DELETE /v1/sandboxes/sb_1":
			fmt.Fprint(w, `{"id":"sb_1","state":"deleted"}`)
		default:
			w.WriteHeader(404)
			fmt.Fprint(w, `{"error":{"code":"not_found","status":404,"message":"no such route"}}`)
		}
	}))
	defer srv.Close()
	run := func(args ...string) (string, string, error) {
		root := newRootCommand()
		var out, errOut bytes.Buffer
		root.SetOut(&out)
		root.SetErr(&errOut)
		root.SetArgs(append([]string{"sandbox", "--server", srv.URL, "--key", "k1"}, args...))
		err := root.Execute()
		return out.String(), errOut.String(), err
	}
	out, _, err := run("ls")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"ID", "LEASE END", "sb_1", "web", "running", "1024 MiB", "3h", "in 1h"} {
		if !strings.Contains(out, want) {
			t.Errorf("ls lacks %q:\n%s", want, out)
		}
	}
	if out, _, err := run("ls", "-o", "json"); err != nil || !strings.Contains(out, `"id": "sb_1"`) {
		t.Errorf("ls -o json: %v\n%s", err, out)
	}
	out, errOut, err := run("exec", "sb_1", "--", "sh", "-c", "x")
	var ec *exitCodeError
	if !errors.As(err, &ec) || ec.code != 3 || out != "out\n" || errOut != "err\n" {
		t.Errorf("exec: %v, stdout %q, stderr %q", err, out, errOut)
	}
	if out, _, err := run("rm", "sb_1"); err != nil || out != "sb_1\tdeleted\n" {
		t.Errorf("rm: %v %q", err, out)
	}
	if _, _, err := run("stop", "sb_2"); err == nil || !strings.Contains(err.Error(), "not_found") {
		t.Errorf("stop of a missing sandbox: %v", err)
	}
}

// TestExtractTreeStaysInside: an archive from a sandbox cannot write
// outside the directory, by name or through a symlink it made.
func TestExtractTreeStaysInside(t *testing.T) {
	build := func(entries ...tar.Header) []byte {
		var buf bytes.Buffer
		gz := gzip.NewWriter(&buf)
		tw := tar.NewWriter(gz)
		for _, h := range entries {
			h.Mode = 0o644
			body := ""
			if h.Typeflag == tar.TypeReg {
				body = "x"
				h.Size = 1
			}
			tw.WriteHeader(&h)
			tw.Write([]byte(body))
		}
		tw.Close()
		gz.Close()
		return buf.Bytes()
	}
	outside := t.TempDir()
	for name, archive := range map[string][]byte{
		"dotdot": build(tar.Header{Name: "../escaped", Typeflag: tar.TypeReg}),
		"abs":    build(tar.Header{Name: "/" + filepath.Join(outside, "escaped"), Typeflag: tar.TypeReg}),
		"symlink": build(tar.Header{Name: "l", Typeflag: tar.TypeSymlink, Linkname: outside},
			tar.Header{Name: "l/escaped", Typeflag: tar.TypeReg}),
	} {
		dir := filepath.Join(t.TempDir(), "d")
		os.MkdirAll(dir, 0o755)
		if err := extractTree(bytes.NewReader(archive), dir); err == nil {
			t.Errorf("%s: extracted", name)
		}
		if _, err := os.Stat(filepath.Join(outside, "escaped")); err == nil {
			t.Fatalf("%s: a file was written outside", name)
		}
		if _, err := os.Stat(filepath.Join(filepath.Dir(dir), "escaped")); err == nil {
			t.Fatalf("%s: a file was written beside the directory", name)
		}
	}
	dir := t.TempDir()
	ok := build(tar.Header{Name: "a/", Typeflag: tar.TypeDir}, tar.Header{Name: "a/f", Typeflag: tar.TypeReg})
	if err := extractTree(bytes.NewReader(ok), dir); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "a", "f")); err != nil || string(b) != "x" {
		t.Errorf("a/f: %q %v", b, err)
	}
}
