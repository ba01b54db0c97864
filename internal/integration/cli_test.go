package integration

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"encoding/json"
	"errors"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/creack/pty"
)

// cliRun runs bin/emberbox with args against s, as the admin.
type cliRun struct {
	t *testing.T
	s *server
}

func (r cliRun) cmd(args ...string) *exec.Cmd {
	cmd := exec.Command(filepath.Join(binDir, "emberbox"), args...)
	cmd.Env = append(os.Environ(), "EMBERBOX_URL="+r.s.URL, "EMBERBOX_API_KEY="+r.s.AdminKey,
		"EMBERBOX_CONFIG="+filepath.Join(r.t.TempDir(), "none.json"))
	return cmd
}

// run returns the command's stdout, stderr and exit status.
func (r cliRun) run(args ...string) (string, string, int) {
	r.t.Helper()
	cmd := r.cmd(args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		return stdout.String(), stderr.String(), ee.ExitCode()
	case err != nil:
		r.t.Fatalf("emberbox %v: %v", args, err)
	}
	return stdout.String(), stderr.String(), 0
}

// ok runs a command that must succeed and returns its stdout.
func (r cliRun) ok(args ...string) string {
	r.t.Helper()
	out, errOut, code := r.run(args...)
	if code != 0 {
		r.t.Fatalf("emberbox %v: exit %d\nstdout: %s\nstderr: %s", args, code, out, errOut)
	}
	return out
}

// TestCLI drives `emberbox sandbox` end to end against a real VM: create,
// ls, exec exit codes and streaming, cp round trips of a file and of a
// tree, a shell on a pseudo-terminal, events, stop and rm.
func TestCLI(t *testing.T) {
	s := startServer(t, t.TempDir())
	defer s.cleanup(t)
	cli := cliRun{t, s}

	id := strings.TrimSpace(cli.ok("sandbox", "create", "--name", "cli-e2e", "--label", "suite=cli", "--timeout", "30m"))
	if id == "" {
		t.Fatal("create printed no id")
	}
	s.tr.add(id, s.AdminKey)

	t.Run("ls", func(t *testing.T) {
		table := cli.ok("sandbox", "ls")
		if !strings.Contains(table, "LEASE END") {
			t.Errorf("no header:\n%s", table)
		}
		var row string
		for _, l := range strings.Split(table, "\n") {
			if strings.HasPrefix(l, id) {
				row = l
			}
		}
		if !strings.Contains(row, "cli-e2e") || !strings.Contains(row, "running") || !strings.Contains(row, "in 2") {
			t.Errorf("row of %s: %q in\n%s", id, row, table)
		}
		var list []struct {
			ID, State string
			Labels    map[string]string
		}
		if err := json.Unmarshal([]byte(cli.ok("sandbox", "ls", "-o", "json", "-l", "suite=cli")), &list); err != nil {
			t.Fatal(err)
		}
		if len(list) != 1 || list[0].ID != id || list[0].State != "running" || list[0].Labels["suite"] != "cli" {
			t.Errorf("ls -o json: %+v", list)
		}
	})

	t.Run("exec", func(t *testing.T) {
		out, errOut, code := cli.run("sandbox", "exec", id, "--", "sh", "-c", "echo out; echo err >&2; exit 3")
		if code != 3 || out != "out\n" || errOut != "err\n" {
			t.Errorf("exit 3: code %d, stdout %q, stderr %q", code, out, errOut)
		}
		if out, _, code := cli.run("sandbox", "exec", id, "--", "uname", "-s"); code != 0 || out != "Linux\n" {
			t.Errorf("uname: code %d, stdout %q", code, out)
		}
		// Streaming: the first line arrives while the command waits for a
		// file that only a second exec, made after seeing it, creates.
		cmd := cli.cmd("sandbox", "exec", id, "--", "sh", "-c",
			"echo first; while [ ! -e /tmp/cli-go ]; do sleep 0.1; done; echo second")
		pipe, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		br := bufio.NewReader(pipe)
		if line, err := br.ReadString('\n'); err != nil || line != "first\n" {
			t.Fatalf("first line %q: %v", line, err)
		}
		cli.ok("sandbox", "exec", id, "--", "touch", "/tmp/cli-go")
		rest, _ := io.ReadAll(br)
		if err := cmd.Wait(); err != nil || string(rest) != "second\n" {
			t.Errorf("rest %q, %v", rest, err)
		}
	})

	t.Run("cp file", func(t *testing.T) {
		dir := t.TempDir()
		for name, size := range map[string]int{"small.bin": 300 << 10, "large.bin": 3<<20 + 17} {
			src := filepath.Join(dir, name)
			writeRandom(t, src, size)
			cli.ok("sandbox", "cp", src, id+":/workspace/files/")
			back := filepath.Join(dir, "back-"+name)
			cli.ok("sandbox", "cp", id+":/workspace/files/"+name, back)
			sameFile(t, src, back)
		}
	})

	t.Run("cp tree", func(t *testing.T) {
		src := filepath.Join(t.TempDir(), "tree")
		for _, d := range []string{"a/b/c", "empty", "bin"} {
			if err := os.MkdirAll(filepath.Join(src, d), 0o755); err != nil {
				t.Fatal(err)
			}
		}
		for i := range 40 {
			writeRandom(t, filepath.Join(src, "a", "b", "c", "f"+strings.Repeat("x", i%5)+string(rune('a'+i%26))+".txt"), 1000+i*997)
		}
		writeRandom(t, filepath.Join(src, "a", "big.bin"), 700<<10)
		writeRandom(t, filepath.Join(src, "a", "b", "mid.bin"), 400<<10)
		if err := os.WriteFile(filepath.Join(src, "bin", "run.sh"), []byte("#!/bin/sh\necho ran\n"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink("a/b", filepath.Join(src, "link")); err != nil {
			t.Fatal(err)
		}
		cli.ok("sandbox", "cp", src, id+":/workspace/tree")
		if out := cli.ok("sandbox", "exec", id, "--", "/workspace/tree/bin/run.sh"); out != "ran\n" {
			t.Errorf("run.sh in the sandbox: %q", out)
		}
		dst := filepath.Join(t.TempDir(), "back")
		cli.ok("sandbox", "cp", id+":/workspace/tree", dst)
		sameTree(t, src, dst)
	})

	t.Run("shell", func(t *testing.T) {
		cmd := cli.cmd("sandbox", "shell", id)
		f, err := pty.StartWithSize(cmd, &pty.Winsize{Cols: 100, Rows: 30})
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		var mu sync.Mutex
		var out bytes.Buffer
		go func() {
			buf := make([]byte, 4096)
			for {
				n, err := f.Read(buf)
				mu.Lock()
				out.Write(buf[:n])
				mu.Unlock()
				if err != nil {
					return
				}
			}
		}()
		seen := func(s string) func() bool {
			return func() bool { mu.Lock(); defer mu.Unlock(); return strings.Contains(out.String(), s) }
		}
		if _, err := f.Write([]byte("echo hi-$((6*7)) cols-$(tput cols)\r")); err != nil {
			t.Fatal(err)
		}
		if !waitUntil(90*time.Second, 100*time.Millisecond, seen("hi-42 cols-100")) {
			mu.Lock()
			t.Fatalf("no hi-42 cols-100 in %q", out.String())
		}
		if _, err := f.Write([]byte("exit 4\r")); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case err := <-done:
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ExitCode() != 4 {
				t.Errorf("shell ended with %v, want exit status 4", err)
			}
		case <-time.After(60 * time.Second):
			_ = cmd.Process.Kill()
			t.Fatal("the shell did not end after exit 4")
		}
	})

	t.Run("events", func(t *testing.T) {
		if out := cli.ok("sandbox", "logs", id); !strings.Contains(out, "ready") {
			t.Errorf("events lack ready:\n%s", out)
		}
	})

	t.Run("stop and rm", func(t *testing.T) {
		if out := cli.ok("sandbox", "stop", id); out != id+"\tstopped\n" {
			t.Errorf("stop: %q", out)
		}
		if _, errOut, code := cli.run("sandbox", "exec", id, "--", "true"); code != 1 || !strings.Contains(errOut, "stopped") {
			t.Errorf("exec in a stopped sandbox: exit %d, %q", code, errOut)
		}
		if out := cli.ok("sandbox", "rm", id); out != id+"\tdeleted\n" {
			t.Errorf("rm: %q", out)
		}
		if out := cli.ok("sandbox", "ls", "-a"); strings.Contains(out, id) {
			t.Errorf("ls -a still lists %s:\n%s", id, out)
		}
	})
}

func writeRandom(t *testing.T, p string, n int) {
	t.Helper()
	b := make([]byte, n)
	_, _ = rand.Read(b)
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

func sameFile(t *testing.T, a, b string) {
	t.Helper()
	x, err := os.ReadFile(a)
	if err != nil {
		t.Fatal(err)
	}
	y, err := os.ReadFile(b)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(x, y) {
		t.Errorf("%s (%d bytes) and %s (%d bytes) differ", a, len(x), b, len(y))
	}
}

// sameTree compares names, types, permissions, contents and link targets.
func sameTree(t *testing.T, a, b string) {
	t.Helper()
	describe := func(root string) map[string]string {
		m := map[string]string{}
		err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			rel, _ := filepath.Rel(root, p)
			fi, err := d.Info()
			if err != nil {
				return err
			}
			desc := fi.Mode().String()
			switch {
			case fi.Mode()&fs.ModeSymlink != 0:
				target, _ := os.Readlink(p)
				desc += " -> " + target
			case fi.Mode().IsRegular():
				data, _ := os.ReadFile(p)
				desc += " " + string(data)
			}
			m[rel] = desc
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	x, y := describe(a), describe(b)
	if len(x) != len(y) {
		t.Errorf("%d entries went, %d came back", len(x), len(y))
	}
	for name, d := range x {
		if y[name] != d {
			t.Errorf("%s: differs after the round trip (%.60q vs %.60q)", name, d, y[name])
		}
	}
}
