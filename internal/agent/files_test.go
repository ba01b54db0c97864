package agent

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/emberbox/emberbox/internal/agentproto"
)

// newTestAgent returns an agent whose default account "user" has uid and
// gid and the home home, read from a passwd file of its own.
func newTestAgent(t *testing.T, uid, gid int, home string) *Agent {
	t.Helper()
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "etc"), 0o755); err != nil {
		t.Fatal(err)
	}
	passwd := fmt.Sprintf("root:x:0:0:root:/root:/bin/bash\nuser:x:%d:%d::%s:/bin/bash\n", uid, gid, home)
	group := fmt.Sprintf("root:x:0:\nuser:x:%d:\n", gid)
	if err := os.WriteFile(filepath.Join(root, "etc/passwd"), []byte(passwd), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "etc/group"), []byte(group), 0o644); err != nil {
		t.Fatal(err)
	}
	a, err := New(Config{Root: root, User: "user"})
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// call runs one request through dispatch and returns its reply.
func call(t *testing.T, a *Agent, req agentproto.Request) agentproto.Reply {
	t.Helper()
	var buf bytes.Buffer
	c := agentproto.NewConn(&buf)
	if err := a.dispatch(context.Background(), c, &req); err != nil {
		var pe *agentproto.Error
		if !errors.As(err, &pe) {
			t.Fatalf("%s: error without a code: %v", req.Method, err)
		}
		return agentproto.Reply{Error: pe}
	}
	var rep agentproto.Reply
	if err := c.ReadJSON(&rep); err != nil {
		t.Fatalf("%s: reading the reply: %v", req.Method, err)
	}
	return rep
}

func chmodReq(p string, mode uint32) agentproto.Request {
	return agentproto.Request{Method: agentproto.MethodFileChmod, File: &agentproto.FileRequest{Path: p, Mode: mode}}
}

func TestChmod(t *testing.T) {
	home := t.TempDir()
	a := newTestAgent(t, os.Geteuid(), os.Getegid(), home)
	f := filepath.Join(home, "s.sh")
	if err := os.WriteFile(f, []byte("#!/bin/sh\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		mode uint32
		want string
	}{{0o755, "755"}, {0, "0"}, {0o4750, "4750"}, {0o1777, "1777"}, {0o600, "600"}} {
		rep := call(t, a, chmodReq("s.sh", tc.mode)) // relative: under the home
		if rep.Error != nil || rep.Entry == nil || rep.Entry.Mode != tc.want || rep.Entry.Path != f {
			t.Errorf("chmod %o: %+v %+v, want mode %s of %s", tc.mode, rep.Entry, rep.Error, tc.want, f)
		}
	}
	// A final symlink is followed, as chmod(1) does; the entry is the link's.
	link := filepath.Join(home, "link")
	if err := os.Symlink(f, link); err != nil {
		t.Fatal(err)
	}
	rep := call(t, a, chmodReq(link, 0o700))
	if rep.Error != nil || rep.Entry == nil || rep.Entry.Type != agentproto.TypeSymlink {
		t.Errorf("chmod through a symlink: %+v %+v", rep.Entry, rep.Error)
	}
	if fi, err := os.Stat(f); err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("target after chmod through a symlink: %v %v", fi.Mode(), err)
	}

	for _, tc := range []struct {
		name string
		req  agentproto.Request
		code string
	}{
		{"missing", chmodReq(filepath.Join(home, "missing"), 0o644), agentproto.CodeFileNotFound},
		{"below a file", chmodReq(filepath.Join(f, "x"), 0o644), agentproto.CodeNotADirectory},
		{"file type bits", chmodReq(f, 0o100644), agentproto.CodeInvalid},
		{"all bits", chmodReq(f, 1<<32-1), agentproto.CodeInvalid},
		{"empty path", chmodReq("", 0o755), agentproto.CodeInvalid},
		{"NUL", chmodReq(f+"\x00x", 0o644), agentproto.CodeInvalid},
		{"long path", chmodReq("/"+strings.Repeat("a", maxPath), 0o644), agentproto.CodeInvalid},
		{"no body", agentproto.Request{Method: agentproto.MethodFileChmod}, agentproto.CodeInvalid},
		{"unknown user", agentproto.Request{Method: agentproto.MethodFileChmod,
			File: &agentproto.FileRequest{Path: f, Mode: 0o644, User: "nobody-here"}}, agentproto.CodeInvalid},
	} {
		rep := call(t, a, tc.req)
		if rep.Error == nil || rep.Error.Code != tc.code {
			t.Errorf("%s: %+v %+v, want code %s", tc.name, rep.Entry, rep.Error, tc.code)
		}
	}
	if fi, err := os.Stat(f); err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("refused chmods changed the file: %v %v", fi.Mode(), err)
	}
}

// The sandbox user changes only the modes of files it owns, and without
// the privileges root has (setgid of a group it is not in is dropped).
func TestChmodAsUser(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to act as another user")
	}
	const uid, gid = 65534, 65534
	dir, err := os.MkdirTemp("", "chmod-as-user")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	a := newTestAgent(t, uid, gid, dir)
	mine := filepath.Join(dir, "mine")
	roots := filepath.Join(dir, "roots")
	for _, p := range []string{mine, roots} {
		if err := os.WriteFile(p, nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chown(mine, uid, 0); err != nil { // group root: not one of the user's
		t.Fatal(err)
	}

	if rep := call(t, a, chmodReq(mine, 0o600)); rep.Error != nil || rep.Entry.Mode != "600" {
		t.Errorf("own file: %+v %+v", rep.Entry, rep.Error)
	}
	if rep := call(t, a, chmodReq(mine, 0o2755)); rep.Error != nil || rep.Entry.Mode != "755" {
		t.Errorf("setgid on a file of another group: %+v %+v, want 755 (setgid dropped)", rep.Entry, rep.Error)
	}
	if rep := call(t, a, chmodReq(roots, 0o666)); rep.Error == nil || rep.Error.Code != agentproto.CodePermission {
		t.Errorf("root's file: %+v %+v, want permission_denied", rep.Entry, rep.Error)
	}
	if fi, err := os.Stat(roots); err != nil || fi.Mode().Perm() != 0o644 {
		t.Errorf("root's file changed: %v %v", fi.Mode(), err)
	}
	// As root, when asked for.
	req := chmodReq(roots, 0o640)
	req.File.User = "root"
	if rep := call(t, a, req); rep.Error != nil || rep.Entry.Mode != "640" {
		t.Errorf("as root: %+v %+v", rep.Entry, rep.Error)
	}
}

func TestOOMKills(t *testing.T) {
	vmstat := "nr_free_pages 12345\noom_kill_other 9\noom_kill 3\nthp_fault_alloc 0\n"
	if got := oomKills([]byte(vmstat)); got != 3 {
		t.Errorf("oom_kill %d, want 3", got)
	}
	for _, bad := range []string{"", "nr_free_pages 1\n", "oom_kill x\n", "oom_kill -2\n"} {
		if got := oomKills([]byte(bad)); got != 0 {
			t.Errorf("%q: oom_kill %d, want 0", bad, got)
		}
	}
}

func TestCPUBusyMs(t *testing.T) {
	stat := "cpu  100 5 50 9000 7 3 2 11 0 0\ncpu0 50 2 25 4500 3 1 1 5 0 0\n"
	if got := cpuBusyMs([]byte(stat)); got != (100+5+50+3+2)*10 {
		t.Errorf("busy %d ms", got)
	}
	for _, bad := range []string{"", "cpu 1 2\n", "cpu0 1 2 3 4 5 6 7 8\n", "cpu -1 0 0 0 0 0 0 0\n"} {
		if got := cpuBusyMs([]byte(bad)); got != 0 {
			t.Errorf("%q: busy %d, want 0", bad, got)
		}
	}
}
