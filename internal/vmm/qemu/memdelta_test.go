package qemu

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
)

// writePages writes a RAM file of n pages, sparse where pages[i] is 0,
// else page i filled with byte pages[i].
func writePages(t *testing.T, name string, pages []byte) {
	t.Helper()
	f, err := os.Create(name)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Truncate(int64(len(pages)) * pageSize); err != nil {
		t.Fatal(err)
	}
	for i, b := range pages {
		if b != 0 {
			if _, err := f.WriteAt(bytes.Repeat([]byte{b}, pageSize), int64(i)*pageSize); err != nil {
				t.Fatal(err)
			}
		}
	}
}

func allocated1(t *testing.T, name string) int64 {
	t.Helper()
	f, err := os.Open(name)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	st, _ := f.Stat()
	ext, err := extents(f, st.Size())
	if err != nil {
		t.Fatal(err)
	}
	return allocatedBytes(ext)
}

// TestMemDelta: a delta holds exactly the differing pages (a page zeroed
// since the base too), and the base's RAM with the delta applied is the
// live RAM, byte for byte; a delta past its share is not written.
func TestMemDelta(t *testing.T) {
	root := t.TempDir()
	baseDir, dir := filepath.Join(root, "ckpt_base"), filepath.Join(root, "ckpt_new")
	for _, d := range []string{baseDir, dir} {
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	// 4 MiB of RAM: base pages, then live: page 3 changed, page 5 zeroed,
	// page 700 new, the rest as the base had it.
	const n = 1024
	base := make([]byte, n)
	for i := range 600 {
		base[i] = byte(1 + i%200)
	}
	live := append([]byte(nil), base...)
	live[3], live[5], live[700] = 250, 0, 251
	writePages(t, filepath.Join(baseDir, memFile), base)
	liveName := filepath.Join(root, "live")
	writePages(t, liveName, live)

	ok, err := writeMemDelta(liveName, baseDir, dir)
	if err != nil || !ok {
		t.Fatalf("writeMemDelta: %v, %v", ok, err)
	}
	if got := allocated1(t, filepath.Join(dir, memDeltaFile)); got != 3*pageSize {
		t.Errorf("delta allocates %d bytes, want the 3 pages that differ", got)
	}
	if _, err := os.Stat(filepath.Join(dir, memFile)); !os.IsNotExist(err) {
		t.Errorf("a delta snapshot has a whole RAM file too: %v", err)
	}
	if size, err := memSize(dir); err != nil || size != n*pageSize {
		t.Errorf("memSize: %d, %v", size, err)
	}
	out := filepath.Join(root, "copy")
	if err := copyMem(dir, out); err != nil {
		t.Fatal(err)
	}
	want, _ := os.ReadFile(liveName)
	got, _ := os.ReadFile(out)
	if !bytes.Equal(got, want) {
		t.Fatalf("base + delta differs from the live RAM")
	}
	// A whole snapshot copies as itself.
	if err := copyMem(baseDir, out); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(out); !bytes.Equal(got, mustRead(t, filepath.Join(baseDir, memFile))) {
		t.Errorf("copy of a whole snapshot's RAM differs")
	}

	// Most of the RAM changed: no delta, the caller writes it whole.
	for i := range 600 {
		live[i] = 99
	}
	writePages(t, liveName, live)
	other := filepath.Join(root, "ckpt_other")
	if err := os.Mkdir(other, 0o700); err != nil {
		t.Fatal(err)
	}
	if ok, err := writeMemDelta(liveName, baseDir, other); err != nil || ok {
		t.Fatalf("a delta of most of the RAM: %v, %v; want none", ok, err)
	}
	if entries, _ := os.ReadDir(other); len(entries) != 0 {
		t.Errorf("a refused delta left %d files", len(entries))
	}
	// A base that is gone: no delta either.
	if ok, err := writeMemDelta(liveName, filepath.Join(root, "gone"), other); err != nil || ok {
		t.Fatalf("a delta over a missing base: %v, %v", ok, err)
	}

	// A base file naming anything but a sibling is refused.
	if err := os.WriteFile(filepath.Join(dir, baseFile), []byte("/etc\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, _, err := snapshotMem(dir); err == nil {
		t.Errorf("a base outside the snapshots was followed")
	}
}

func mustRead(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
