package agent

import (
	"os"
	"path/filepath"
	"testing"
)

// linkHome links E2B's /home/user to the user's home once, and leaves an
// image's own /home/user alone.
func TestLinkHome(t *testing.T) {
	a := newTestAgent(t, os.Getuid(), os.Getgid(), "/workspace")
	link := filepath.Join(a.root, "home", "user")
	if err := a.linkHome(); err != nil {
		t.Fatal(err)
	}
	if got, err := os.Readlink(link); err != nil || got != "/workspace" {
		t.Fatalf("/home/user -> %q, %v; want a link to /workspace", got, err)
	}
	if err := a.linkHome(); err != nil { // every boot runs it
		t.Errorf("a second boot: %v", err)
	}

	own := newTestAgent(t, os.Getuid(), os.Getgid(), "/workspace")
	dir := filepath.Join(own.root, "home", "user")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := own.linkHome(); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Lstat(dir); err != nil || !fi.IsDir() {
		t.Errorf("an image's own /home/user became %v, %v", fi, err)
	}

	e2bLike := newTestAgent(t, os.Getuid(), os.Getgid(), "/home/user")
	if err := e2bLike.linkHome(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(filepath.Join(e2bLike.root, "home", "user")); !os.IsNotExist(err) {
		t.Errorf("a user whose home is /home/user got a link: %v", err)
	}
}
