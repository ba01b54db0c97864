package housekeeping

import (
	"bufio"
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// moduleRoot returns the directory of the go.mod above the test's working
// directory and the module's path.
func moduleRoot(t *testing.T) (dir, path string) {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		data, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		if err == nil {
			sc := bufio.NewScanner(bytes.NewReader(data))
			for sc.Scan() {
				if p, ok := strings.CutPrefix(strings.TrimSpace(sc.Text()), "module "); ok {
					return dir, strings.Trim(strings.TrimSpace(p), `"`)
				}
			}
			t.Fatalf("%s/go.mod names no module", dir)
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("no go.mod above the working directory")
		}
		dir = parent
	}
}

// sdkModule is the directory of the module nested in this one: the Go SDK,
// which Go programs require without the server's dependencies.
const sdkModule = "sdk/go"

// goCmd returns a go command that runs in the module root with env added to
// the test's environment. It skips the test if go is not on PATH.
func goCmd(t *testing.T, env []string, args ...string) *exec.Cmd {
	t.Helper()
	return goCmdIn(t, "", env, args...)
}

// goCmdIn is goCmd run in dir, relative to the module root: a nested
// module's directory, where the go command sees that module.
func goCmdIn(t *testing.T, dir string, env []string, args ...string) *exec.Cmd {
	t.Helper()
	gobin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("the go command is not on PATH")
	}
	root, _ := moduleRoot(t)
	cmd := exec.Command(gobin, args...)
	cmd.Dir = filepath.Join(root, filepath.FromSlash(dir))
	cmd.Env = append(os.Environ(), env...)
	return cmd
}

// goList runs `go list -e` with args and returns its output lines.
func goList(t *testing.T, env []string, args ...string) []string {
	t.Helper()
	return goListIn(t, "", env, args...)
}

// goListIn is goList run in dir, relative to the module root.
func goListIn(t *testing.T, dir string, env []string, args ...string) []string {
	t.Helper()
	cmd := goCmdIn(t, dir, env, append([]string{"list", "-e"}, args...)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list %s (in %s): %v\n%s", strings.Join(args, " "), cmd.Dir, err, stderr.Bytes())
	}
	return strings.Split(strings.TrimSpace(string(out)), "\n")
}

// within reports whether package pkg is path or below it.
func within(pkg, path string) bool {
	return pkg == path || strings.HasPrefix(pkg, path+"/")
}
