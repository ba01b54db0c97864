package upload_test

import (
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/emberbox/emberbox/internal/errdefs"
	"github.com/emberbox/emberbox/internal/upload"
)

// diskUse is the bytes the staging files take on disk (they are sparse).
func diskUse(t *testing.T, dir string) (apparent int64) {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		fi, err := os.Stat(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		apparent += fi.Size()
	}
	return apparent
}

// Staging stays within its bounds under a loop of maximal begins from
// several keys: the per-key quota, the global budget and the free-space
// reserve each refuse with their own code, and nothing staged passes them.
func TestStagingBounds(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "uploads")
	clk := &clock{t: time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)}
	var free atomic.Int64
	free.Store(1 << 40)
	const size = 40 << 20 // a "maximal" upload at this scale
	s, err := upload.New[*entry](upload.Config{Dir: dir, Now: clk.now,
		MaxBytes: 10 * size, MaxBytesPerOwner: 4 * size, FreeReserve: 8 * size, MaxAge: 3 * time.Hour,
		FreeSpace: func(string) (int64, error) { return free.Load(), nil }})
	if err != nil {
		t.Fatal(err)
	}
	spec := func(owner string, n int64) upload.Spec {
		return upload.Spec{Owner: owner, SandboxID: "sbx_1", Path: "/workspace/f", Size: n, SHA256: sumHex(nil)}
	}
	_, err = s.Begin(spec("key_a", 4*size+1))
	wantCode(t, "over the per-key quota", err, upload.CodeTooLarge, errdefs.ErrInvalidArgument)

	counts := map[string]int{}
	for i := range 1000 {
		owner := []string{"key_a", "key_b", "key_c"}[i%3]
		_, err := s.Begin(spec(owner, size))
		counts[errdefs.Code(err)]++
		if use := diskUse(t, dir); use > 10*size {
			t.Fatalf("after %d begins: %d bytes staged, over the budget", i, use)
		}
	}
	if counts[""] != 10 || counts[upload.CodeTooMany] == 0 || counts[upload.CodeFull] == 0 {
		t.Errorf("outcomes %v, want 10 begun, and per-key and global refusals", counts)
	}
	_, err = s.Begin(spec("key_e", size))
	wantCode(t, "budget reached", err, upload.CodeFull, errdefs.ErrUnavailable)

	// The free-space reserve: with little free, a begin is refused even
	// within the budget, and so is a chunk.
	clk.add(upload.TTL)
	s.Sweep()
	free.Store(9 * size)
	u := begin(t, s, "key_a", payload(upload.ChunkSize))
	_, err = s.Begin(spec("key_b", size))
	wantCode(t, "free-space reserve", err, upload.CodeFull, errdefs.ErrUnavailable)
	free.Store(3 * size)
	_, err = put(s, u.ID, payload(upload.ChunkSize), 0)
	wantCode(t, "chunk with the disk nearly full", err, upload.CodeFull, errdefs.ErrUnavailable)
}

// An upload kept busy still ends MaxAge after it began.
func TestAbsoluteExpiry(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "uploads")
	clk := &clock{t: time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)}
	s, err := upload.New[*entry](upload.Config{Dir: dir, Now: clk.now, MaxAge: 90 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	data := payload(2 * upload.ChunkSize)
	u := begin(t, s, "key_a", data)
	for range 3 {
		clk.add(29 * time.Minute)
		if _, err := put(s, u.ID, data, 0); err != nil {
			t.Fatal(err)
		}
	}
	clk.add(3 * time.Minute)
	_, err = put(s, u.ID, data, upload.ChunkSize)
	wantCode(t, "past MaxAge", err, upload.CodeNotFound, errdefs.ErrNotFound)
	s.Sweep()
	if names := staged(t, dir); len(names) != 0 {
		t.Errorf("staging files left: %v", names)
	}
}
