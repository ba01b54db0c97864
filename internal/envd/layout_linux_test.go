package envd_test

import (
	"encoding/base64"
	"fmt"
	"os"
	"os/user"
	"path/filepath"
	"strings"
	"testing"

	"connectrpc.com/connect"

	"github.com/emberbox/emberbox/internal/agent"
	"github.com/emberbox/emberbox/internal/envd/proto/filesystem"
	"github.com/emberbox/emberbox/internal/envd/proto/process"
)

// layoutGuest is an agent whose account "user" has its home in workspace,
// and link, a link to workspace, as the guest's /home/user is.
func layoutGuest(t *testing.T) (cfg agent.Config, workspace, link string) {
	t.Helper()
	root, dir := t.TempDir(), t.TempDir()
	workspace, link = filepath.Join(dir, "workspace"), filepath.Join(dir, "home-user")
	if err := os.MkdirAll(workspace, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(workspace, link); err != nil {
		t.Fatal(err)
	}
	me, err := user.Current()
	if err != nil {
		t.Fatal(err)
	}
	passwd := fmt.Sprintf("root:x:0:0:root:/root:/bin/bash\nuser:x:%s:%s::%s:/bin/bash\n", me.Uid, me.Gid, workspace)
	if err := os.MkdirAll(filepath.Join(root, "etc"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "etc/passwd"), []byte(passwd), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "etc/group"), []byte("root:x:0:\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return agent.Config{Root: root, User: "user"}, workspace, link
}

// In E2B's layout (a routed Home) the sandbox user's command starts in the
// home (the directory it links to) with $HOME and $PWD naming it, so a
// shell's pwd does, and relative paths of files are under it; root, and a
// sandbox without the layout, keep the guest's.
func TestE2BLayout(t *testing.T) {
	run := func(e *env, user, cwd string) string {
		t.Helper()
		cfg := bash(`echo "$HOME|$(pwd)|$(pwd -P)"`)
		if cwd != "" {
			cfg.Cwd = &cwd
		}
		req := connect.NewRequest(&process.StartRequest{Process: cfg})
		if user != "" {
			req.Header().Set("Authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte(user+":")))
		}
		s, err := e.process().Start(testCtx(t), req)
		if err != nil {
			t.Fatal(err)
		}
		ev := &events{}
		drain(t, s, func() *process.ProcessEvent { return s.Msg().GetEvent() }, ev)
		return strings.TrimSpace(ev.stdout.String())
	}
	cfg, workspace, link := layoutGuest(t)
	e := newAgentEnv(t, cfg, link)
	for _, u := range []string{"", "user"} {
		if got, want := run(e, u, ""), link+"|"+link+"|"+workspace; got != want {
			t.Errorf("user %q: $HOME|pwd|pwd -P = %q, want %q", u, got, want)
		}
	}
	if err := os.Mkdir(filepath.Join(workspace, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	if got, want := run(e, "", "sub"), link+"|"+link+"/sub|"+workspace+"/sub"; got != want {
		t.Errorf("a relative cwd: %q, want %q", got, want)
	}
	if got := run(e, "root", ""); strings.Contains(got, link) {
		t.Errorf("root's command has the layout's home: %q", got)
	}
	if got := run(newAgentEnv(t, cfg, ""), "", ""); strings.Contains(got, link) {
		t.Errorf("without the layout: %q", got)
	}

	// Relative paths: /files and the filesystem service.
	want := filepath.Join(link, "rel", "x.txt")
	status, out, raw := postFiles(t, e.url+"/files?path=rel/x.txt", "application/octet-stream", strings.NewReader("x"), nil)
	if status != 200 || len(out) != 1 || out[0].Path != want {
		t.Fatalf("a relative upload: %d %s, want it at %s", status, raw, want)
	}
	if b, err := os.ReadFile(filepath.Join(workspace, "rel", "x.txt")); err != nil || string(b) != "x" {
		t.Errorf("the file in the linked home: %q %v", b, err)
	}
	st, err := e.filesystem().Stat(testCtx(t), connect.NewRequest(&filesystem.StatRequest{Path: "rel/x.txt"}))
	if err != nil || st.Msg.GetEntry().GetPath() != want {
		t.Errorf("Stat of a relative path: %v %v", st, err)
	}
}
