package volumes

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
)

func TestCopyFileKeepsDataAndHoles(t *testing.T) {
	dir := t.TempDir()
	const size = 8 << 20
	src, err := os.Create(filepath.Join(dir, "src"))
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	if err := src.Truncate(size); err != nil {
		t.Fatal(err)
	}
	a, b := bytes.Repeat([]byte{'a'}, 3<<20), bytes.Repeat([]byte{'b'}, 4096)
	src.WriteAt(a, 1<<20)
	src.WriteAt(b, size-4096)
	dst, err := os.Create(filepath.Join(dir, "dst"))
	if err != nil {
		t.Fatal(err)
	}
	defer dst.Close()
	method, err := copyFile(dst, src, size)
	if err != nil || (method != MethodClone && method != MethodSparseCopy) {
		t.Fatalf("copyFile: %q %v", method, err)
	}
	got, _ := os.ReadFile(dst.Name())
	want, _ := os.ReadFile(src.Name())
	if !bytes.Equal(got, want) {
		t.Fatalf("the copy differs")
	}
	st, _ := dst.Stat()
	if st.Size() != size {
		t.Errorf("size %d", st.Size())
	}
	t.Logf("method %s", method)
}
