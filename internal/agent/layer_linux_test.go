package agent

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestExt4Label reads the label mkfs.ext4 wrote, and nothing from what is
// not ext4.
func TestExt4Label(t *testing.T) {
	if _, err := exec.LookPath("mkfs.ext4"); err != nil {
		t.Skip("no mkfs.ext4")
	}
	img := filepath.Join(t.TempDir(), "layer.img")
	if err := os.WriteFile(img, make([]byte, 8<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mkfs.ext4", "-q", "-F", "-L", layerLabel, img).CombinedOutput(); err != nil {
		t.Fatalf("mkfs.ext4: %v: %s", err, out)
	}
	if got := ext4Label(img); got != layerLabel {
		t.Fatalf("label %q, want %q", got, layerLabel)
	}
	junk := filepath.Join(t.TempDir(), "junk")
	if err := os.WriteFile(junk, []byte(strings.Repeat("emberbox-layer", 200)), 0o600); err != nil {
		t.Fatal(err)
	}
	if got := ext4Label(junk); got != "" {
		t.Fatalf("a file of no file system has label %q", got)
	}
	if got := ext4Label(filepath.Join(t.TempDir(), "missing")); got != "" {
		t.Fatalf("a missing device has label %q", got)
	}
}

// TestLayerEnv: a layer's program gets the account's home and the layer's
// PATH, whatever the environment said.
func TestLayerEnv(t *testing.T) {
	env := layerEnv([]string{"HOME=/root", "PATH=/evil", "LANG=C.UTF-8", "USER=root"},
		&account{name: "user", home: "/workspace"})
	for _, want := range []string{"HOME=/workspace", "USER=user", "PATH=/usr/local/bin:/usr/bin:/bin", "LANG=C.UTF-8"} {
		if !slices.Contains(env, want) {
			t.Errorf("env %q lacks %q", env, want)
		}
	}
	for _, bad := range []string{"HOME=/root", "PATH=/evil", "USER=root"} {
		if slices.Contains(env, bad) {
			t.Errorf("env %q keeps %q", env, bad)
		}
	}
}
