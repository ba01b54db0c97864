package envd_test

import (
	"encoding/base64"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"connectrpc.com/connect"

	"github.com/emberbox/emberbox/internal/envd/proto/filesystem"
	"github.com/emberbox/emberbox/internal/envd/proto/process"
)

// In E2B's layout (a routed Home) the sandbox user's command starts in the
// home with $HOME and $PWD naming it, and relative paths of files are
// under it; root, and a sandbox without the layout, keep the guest's.
func TestE2BLayout(t *testing.T) {
	run := func(e *env, user string) string {
		t.Helper()
		c := e.process()
		req := connect.NewRequest(&process.StartRequest{Process: bash(`echo "$HOME|$PWD|$(pwd -P)"`)})
		if user != "" {
			req.Header().Set("Authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte(user+":")))
		}
		s, err := c.Start(testCtx(t), req)
		if err != nil {
			t.Fatal(err)
		}
		ev := &events{}
		drain(t, s, func() *process.ProcessEvent { return s.Msg().GetEvent() }, ev)
		return strings.TrimSpace(ev.stdout.String())
	}
	e := newLayoutEnv(t, true)
	home, err := filepath.EvalSymlinks(e.dir)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := run(e, ""), e.dir+"|"+e.dir+"|"+home; got != want {
		t.Errorf("the sandbox user's command: %q, want $HOME|$PWD|pwd -P = %q", got, want)
	}
	if got := run(e, "root"); strings.HasPrefix(got, e.dir) {
		t.Errorf("root's command ran in the layout's home: %q", got)
	}
	if got := run(newEnv(t), ""); strings.HasPrefix(got, e.dir) {
		t.Errorf("without the layout: %q", got)
	}

	// Relative paths: /files and the filesystem service.
	status, out, raw := postFiles(t, e.url+"/files?path=rel/x.txt", "application/octet-stream", strings.NewReader("x"), nil)
	if want := filepath.Join(e.dir, "rel", "x.txt"); status != 200 || len(out) != 1 || out[0].Path != want {
		t.Fatalf("a relative upload: %d %s, want it at %s", status, raw, want)
	}
	if b, err := os.ReadFile(filepath.Join(e.dir, "rel", "x.txt")); err != nil || string(b) != "x" {
		t.Errorf("the file: %q %v", b, err)
	}
	st, err := e.filesystem().Stat(testCtx(t), connect.NewRequest(&filesystem.StatRequest{Path: "rel/x.txt"}))
	if err != nil || st.Msg.GetEntry().GetPath() != filepath.Join(e.dir, "rel", "x.txt") {
		t.Errorf("Stat of a relative path: %v %v", st, err)
	}
}
