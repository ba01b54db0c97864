package upload_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/emberbox/emberbox/internal/errdefs"
	"github.com/emberbox/emberbox/internal/upload"
)

// clock is a settable time for the store.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// entry is what the test writer returns.
type entry struct {
	path string
	mode uint32
	data []byte
}

func newStore(t *testing.T) (*upload.Store[*entry], string, *clock) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "uploads")
	clk := &clock{t: time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)}
	s, err := upload.New[*entry](upload.Config{Dir: dir, Now: clk.now})
	if err != nil {
		t.Fatal(err)
	}
	return s, dir, clk
}

func payload(n int) []byte {
	r := rand.New(rand.NewPCG(7, uint64(n)))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

func sumHex(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// collect is a writer that keeps what it is given.
func collect(_ context.Context, path string, mode uint32, size int64, r io.Reader) (*entry, error) {
	data, err := io.ReadAll(r)
	if err != nil {
		return nil, err
	}
	if int64(len(data)) != size {
		return nil, errors.New("size and bytes differ")
	}
	return &entry{path: path, mode: mode, data: data}, nil
}

// neverWrite fails the test if a commit reaches the writer.
func neverWrite(t *testing.T) upload.WriteFunc[*entry] {
	return func(context.Context, string, uint32, int64, io.Reader) (*entry, error) {
		t.Error("the writer was called")
		return nil, errors.New("unexpected write")
	}
}

func begin(t *testing.T, s *upload.Store[*entry], owner string, data []byte) *upload.Upload {
	t.Helper()
	u, err := s.Begin(upload.Spec{Owner: owner, SandboxID: "sbx_1", Path: "/workspace/f", Size: int64(len(data)), SHA256: sumHex(data), Mode: 0o755})
	if err != nil {
		t.Fatal(err)
	}
	return u
}

func put(s *upload.Store[*entry], id string, data []byte, off int) (*upload.Progress, error) {
	end := min(off+upload.ChunkSize, len(data))
	return s.Put("key_a", "sbx_1", id, int64(off), data[off:end])
}

func staged(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	return names
}

func wantCode(t *testing.T, what string, err error, code string, class error) {
	t.Helper()
	if errdefs.Code(err) != code || !errors.Is(err, class) {
		t.Errorf("%s: got %v (code %q), want %s of class %v", what, err, errdefs.Code(err), code, class)
	}
}

func TestUploadInParallelAndRepeated(t *testing.T) {
	s, dir, _ := newStore(t)
	data := payload(16*upload.ChunkSize - 1000) // 16 chunks, the last one short
	u := begin(t, s, "key_a", data)
	if u.Chunks != 16 || u.Size != int64(len(data)) || !strings.HasPrefix(u.ID, "upl_") {
		t.Fatalf("begin: %+v", u)
	}
	// Every chunk twice, all at once, in no order.
	var wg sync.WaitGroup
	for range 2 {
		for off := 0; off < len(data); off += upload.ChunkSize {
			wg.Go(func() {
				if _, err := put(s, u.ID, data, off); err != nil {
					t.Errorf("chunk %d: %v", off, err)
				}
			})
		}
	}
	wg.Wait()
	p, err := put(s, u.ID, data, 0)
	if err != nil || p.ChunksReceived != 16 || p.Chunks != 16 || p.Bytes != upload.ChunkSize {
		t.Fatalf("progress %+v %v", p, err)
	}
	e, err := s.Commit(context.Background(), "key_a", "sbx_1", u.ID, collect)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(e.data, data) || e.path != "/workspace/f" || e.mode != 0o755 {
		t.Errorf("written %d bytes to %s mode %o", len(e.data), e.path, e.mode)
	}
	if names := staged(t, dir); len(names) != 0 {
		t.Errorf("staging left behind: %v", names)
	}
	// A repeated commit answers the same entry without writing again.
	if e2, err := s.Commit(context.Background(), "key_a", "sbx_1", u.ID, neverWrite(t)); err != nil || e2 != e {
		t.Errorf("second commit: %v %v", e2, err)
	}
	_, err = put(s, u.ID, data, 0)
	wantCode(t, "chunk after commit", err, upload.CodeCommitted, errdefs.ErrConflict)
	wantCode(t, "abort after commit", s.Abort("key_a", "sbx_1", u.ID), upload.CodeCommitted, errdefs.ErrConflict)
}

// A commit that starts while chunks are still being written waits for
// them, and counts them.
func TestCommitRacesChunks(t *testing.T) {
	s, _, _ := newStore(t)
	data := payload(4 * upload.ChunkSize)
	for range 10 {
		u := begin(t, s, "key_a", data)
		var wg sync.WaitGroup
		for off := 0; off < len(data); off += upload.ChunkSize {
			wg.Go(func() {
				if _, err := put(s, u.ID, data, off); err != nil && errdefs.Code(err) != upload.CodeCommitting && errdefs.Code(err) != upload.CodeCommitted {
					t.Errorf("chunk %d: %v", off, err)
				}
			})
		}
		_, err := s.Commit(context.Background(), "key_a", "sbx_1", u.ID, collect)
		if err != nil && errdefs.Code(err) != upload.CodeIncomplete {
			t.Errorf("commit during chunks: %v", err)
		}
		wg.Wait()
		if err != nil {
			// Every chunk has landed now; those refused as committing are sent again.
			for off := 0; off < len(data); off += upload.ChunkSize {
				_, _ = put(s, u.ID, data, off)
			}
			if _, err := s.Commit(context.Background(), "key_a", "sbx_1", u.ID, collect); err != nil {
				t.Fatalf("commit after the chunks: %v", err)
			}
		}
	}
}

func TestChecksumMismatch(t *testing.T) {
	s, _, _ := newStore(t)
	data := payload(3 * upload.ChunkSize / 2)
	u := begin(t, s, "key_a", data)
	bad := bytes.Clone(data)
	bad[len(bad)-1] ^= 0xff
	_, _ = put(s, u.ID, bad, 0)
	_, _ = put(s, u.ID, bad, upload.ChunkSize)
	_, err := s.Commit(context.Background(), "key_a", "sbx_1", u.ID, neverWrite(t))
	wantCode(t, "mismatch", err, upload.CodeChecksum, errdefs.ErrInvalidArgument)
	var ce *errdefs.CodedError
	if errors.As(err, &ce) && (ce.Details["expected"] != u.SHA256 || ce.Details["actual"] != sumHex(bad)) {
		t.Errorf("details %v", ce.Details)
	}
	// The upload stays open: the right chunk fixes it.
	if _, err := put(s, u.ID, data, upload.ChunkSize); err != nil {
		t.Fatal(err)
	}
	if e, err := s.Commit(context.Background(), "key_a", "sbx_1", u.ID, collect); err != nil || !bytes.Equal(e.data, data) {
		t.Fatalf("commit after the fix: %v", err)
	}
}

func TestIncompleteAndFailedWrites(t *testing.T) {
	s, dir, _ := newStore(t)
	data := payload(5 * upload.ChunkSize / 2)
	u := begin(t, s, "key_a", data)
	_, _ = put(s, u.ID, data, upload.ChunkSize)
	_, err := s.Commit(context.Background(), "key_a", "sbx_1", u.ID, neverWrite(t))
	wantCode(t, "incomplete", err, upload.CodeIncomplete, errdefs.ErrConflict)
	var ce *errdefs.CodedError
	if errors.As(err, &ce) && !slices.Equal(ce.Details["missingOffsets"].([]int64), []int64{0, 2 * upload.ChunkSize}) {
		t.Errorf("details %v", ce.Details)
	}
	_, _ = put(s, u.ID, data, 0)
	_, _ = put(s, u.ID, data, 2*upload.ChunkSize)

	// The writer's error comes back as it is and leaves the upload open.
	gone := errdefs.New(errdefs.ErrUnavailable, "guest_unavailable", "gone")
	_, err = s.Commit(context.Background(), "key_a", "sbx_1", u.ID, func(context.Context, string, uint32, int64, io.Reader) (*entry, error) {
		return nil, gone
	})
	if err != gone {
		t.Errorf("failed write: %v", err)
	}
	if len(staged(t, dir)) != 1 {
		t.Error("a failed write dropped the staging file")
	}
	// So does a cancelled commit.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := s.Commit(ctx, "key_a", "sbx_1", u.ID, neverWrite(t)); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled commit: %v", err)
	}
	if e, err := s.Commit(context.Background(), "key_a", "sbx_1", u.ID, collect); err != nil || !bytes.Equal(e.data, data) {
		t.Fatalf("commit after failures: %v", err)
	}
}

func TestCommitInProgress(t *testing.T) {
	s, _, _ := newStore(t)
	data := payload(10)
	u := begin(t, s, "key_a", data)
	_, _ = put(s, u.ID, data, 0)
	writing, release := make(chan struct{}), make(chan struct{})
	done := make(chan error)
	go func() {
		_, err := s.Commit(context.Background(), "key_a", "sbx_1", u.ID, func(ctx context.Context, p string, m uint32, n int64, r io.Reader) (*entry, error) {
			close(writing)
			<-release
			return collect(ctx, p, m, n, r)
		})
		done <- err
	}()
	<-writing
	_, err := put(s, u.ID, data, 0)
	wantCode(t, "chunk", err, upload.CodeCommitting, errdefs.ErrConflict)
	wantCode(t, "abort", s.Abort("key_a", "sbx_1", u.ID), upload.CodeCommitting, errdefs.ErrConflict)
	_, err = s.Commit(context.Background(), "key_a", "sbx_1", u.ID, neverWrite(t))
	wantCode(t, "commit", err, upload.CodeCommitting, errdefs.ErrConflict)
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

func TestAbortAndOwnership(t *testing.T) {
	s, dir, _ := newStore(t)
	data := payload(upload.ChunkSize + 1)
	u := begin(t, s, "key_a", data)
	_, _ = put(s, u.ID, data, 0)
	// Another owner, or the same owner through another sandbox, finds nothing.
	_, err := s.Put("key_b", "sbx_1", u.ID, 0, data[:upload.ChunkSize])
	wantCode(t, "other owner", err, upload.CodeNotFound, errdefs.ErrNotFound)
	wantCode(t, "other sandbox", s.Abort("key_a", "sbx_2", u.ID), upload.CodeNotFound, errdefs.ErrNotFound)
	_, err = s.Commit(context.Background(), "key_b", "sbx_1", u.ID, neverWrite(t))
	wantCode(t, "other owner's commit", err, upload.CodeNotFound, errdefs.ErrNotFound)

	if err := s.Abort("key_a", "sbx_1", u.ID); err != nil {
		t.Fatal(err)
	}
	if names := staged(t, dir); len(names) != 0 {
		t.Errorf("staging left behind: %v", names)
	}
	wantCode(t, "abort twice", s.Abort("key_a", "sbx_1", u.ID), upload.CodeNotFound, errdefs.ErrNotFound)
	_, err = put(s, u.ID, data, 0)
	wantCode(t, "chunk after abort", err, upload.CodeNotFound, errdefs.ErrNotFound)
	_, err = s.Put("key_a", "sbx_1", "../../etc/passwd", 0, nil)
	wantCode(t, "made-up id", err, upload.CodeNotFound, errdefs.ErrNotFound)
}

func TestValidation(t *testing.T) {
	s, dir, _ := newStore(t)
	sum := sumHex(nil)
	ok := upload.Spec{Owner: "key_a", SandboxID: "sbx_1", Path: "/workspace/a", SHA256: sum}
	for name, change := range map[string]func(*upload.Spec){
		"no path":      func(sp *upload.Spec) { sp.Path = "" },
		"NUL in path":  func(sp *upload.Spec) { sp.Path = "/workspace/a\x00b" },
		"long path":    func(sp *upload.Spec) { sp.Path = "/" + strings.Repeat("a", upload.MaxPathLen) },
		"negative":     func(sp *upload.Spec) { sp.Size = -1 },
		"too large":    func(sp *upload.Spec) { sp.Size = upload.MaxSize + 1 },
		"short sha":    func(sp *upload.Spec) { sp.SHA256 = "abc" },
		"not hex":      func(sp *upload.Spec) { sp.SHA256 = strings.Repeat("g", 64) },
		"mode":         func(sp *upload.Spec) { sp.Mode = 0o10000 },
		"no owner":     func(sp *upload.Spec) { sp.Owner = "" },
		"no sandbox":   func(sp *upload.Spec) { sp.SandboxID = "" },
		"several bads": func(sp *upload.Spec) { sp.Size, sp.SHA256 = -1, "" },
	} {
		sp := ok
		change(&sp)
		_, err := s.Begin(sp)
		wantCode(t, name, err, upload.CodeInvalid, errdefs.ErrInvalidArgument)
	}
	if names := staged(t, dir); len(names) != 0 {
		t.Errorf("refused begins staged files: %v", names)
	}
	// Upper-case hex is accepted and reported in lower case.
	data := payload(5 * upload.ChunkSize / 2)
	u, err := s.Begin(upload.Spec{Owner: "key_a", SandboxID: "sbx_1", Path: "/workspace/v", Size: int64(len(data)), SHA256: strings.ToUpper(sumHex(data))})
	if err != nil || u.SHA256 != sumHex(data) {
		t.Fatalf("begin: %+v %v", u, err)
	}
	for _, tc := range []struct {
		off int64
		n   int
	}{
		{-upload.ChunkSize, upload.ChunkSize},
		{1000, upload.ChunkSize},
		{3 * upload.ChunkSize, upload.ChunkSize}, // past the end
		{0, 1000},                                // short chunk
		{2 * upload.ChunkSize, upload.ChunkSize}, // the last chunk is half a chunk
		{2 * upload.ChunkSize, upload.ChunkSize/2 + 1},
	} {
		_, err := s.Put("key_a", "sbx_1", u.ID, tc.off, make([]byte, tc.n))
		wantCode(t, "bad chunk", err, upload.CodeInvalid, errdefs.ErrInvalidArgument)
	}
	// An empty upload has no chunk and commits at once.
	u, err = s.Begin(ok)
	if err != nil || u.Chunks != 0 {
		t.Fatalf("empty begin: %+v %v", u, err)
	}
	_, err = s.Put("key_a", "sbx_1", u.ID, 0, nil)
	wantCode(t, "chunk of an empty upload", err, upload.CodeInvalid, errdefs.ErrInvalidArgument)
	if e, err := s.Commit(context.Background(), "key_a", "sbx_1", u.ID, collect); err != nil || len(e.data) != 0 {
		t.Errorf("empty commit: %v %v", e, err)
	}
}

func TestPerOwnerLimit(t *testing.T) {
	s, _, clk := newStore(t)
	var ids []string
	for range upload.MaxPerOwner {
		ids = append(ids, begin(t, s, "key_a", nil).ID)
	}
	_, err := s.Begin(upload.Spec{Owner: "key_a", SandboxID: "sbx_1", Path: "/workspace/l", SHA256: sumHex(nil)})
	wantCode(t, "one too many", err, upload.CodeTooMany, errdefs.ErrConflict)
	begin(t, s, "key_b", nil) // another owner has its own allowance

	// Aborting one frees a slot, and so does committing one.
	if err := s.Abort("key_a", "sbx_1", ids[0]); err != nil {
		t.Fatal(err)
	}
	begin(t, s, "key_a", nil)
	if _, err := s.Commit(context.Background(), "key_a", "sbx_1", ids[1], collect); err != nil {
		t.Fatal(err)
	}
	begin(t, s, "key_a", nil)
	_, err = s.Begin(upload.Spec{Owner: "key_a", SandboxID: "sbx_1", Path: "/workspace/l", SHA256: sumHex(nil)})
	wantCode(t, "full again", err, upload.CodeTooMany, errdefs.ErrConflict)
	// Expired ones do not count.
	clk.add(upload.TTL)
	for range upload.MaxPerOwner {
		begin(t, s, "key_a", nil)
	}
}

func TestExpiry(t *testing.T) {
	s, dir, clk := newStore(t)
	data := payload(2 * upload.ChunkSize)
	idle := begin(t, s, "key_a", data)
	busy := begin(t, s, "key_a", data)
	if len(staged(t, dir)) != 2 {
		t.Fatal("no staging files")
	}
	clk.add(upload.TTL - time.Second)
	if _, err := put(s, busy.ID, data, 0); err != nil { // a call keeps it alive
		t.Fatal(err)
	}
	clk.add(time.Second)
	// Gone at once, before any sweep.
	_, err := put(s, idle.ID, data, 0)
	wantCode(t, "expired", err, upload.CodeNotFound, errdefs.ErrNotFound)
	s.Sweep()
	if names := staged(t, dir); len(names) != 1 || names[0] != busy.ID+".part" {
		t.Errorf("after the sweep: %v, want only %s's file", names, busy.ID)
	}
	clk.add(upload.TTL)
	s.Sweep()
	if names := staged(t, dir); len(names) != 0 {
		t.Errorf("after the second sweep: %v", names)
	}
	_, err = s.Commit(context.Background(), "key_a", "sbx_1", busy.ID, neverWrite(t))
	wantCode(t, "expired commit", err, upload.CodeNotFound, errdefs.ErrNotFound)
}

// Staging files nothing owns (left by a crash) are removed at start and by
// Sweep; everything else in the directory is left alone.
func TestOrphans(t *testing.T) {
	dir := t.TempDir()
	write := func(name string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(dir, name), []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("upl_0123456789abcdef01234567.part")
	write("upl_old.part")
	write("notes.txt")
	write("upl_x.partial")
	if err := os.Mkdir(filepath.Join(dir, "upl_dir.part"), 0o700); err != nil {
		t.Fatal(err)
	}
	s, err := upload.New[*entry](upload.Config{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := staged(t, dir), []string{"notes.txt", "upl_dir.part", "upl_x.partial"}; !slices.Equal(got, want) {
		t.Errorf("after start: %v, want %v", got, want)
	}
	live := begin(t, s, "key_a", payload(10))
	write("upl_later.part")
	s.Sweep()
	want := []string{"notes.txt", live.ID + ".part", "upl_dir.part", "upl_x.partial"}
	slices.Sort(want)
	if got := staged(t, dir); !slices.Equal(got, want) {
		t.Errorf("after a sweep: %v, want %v", got, want)
	}
}

func TestRunSweepsUntilCancelled(t *testing.T) {
	s, _, _ := newStore(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { s.Run(ctx); close(done) }()
	cancel()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return when its context ended")
	}
}

func TestNewNeedsADirectory(t *testing.T) {
	if _, err := upload.New[*entry](upload.Config{}); err == nil {
		t.Error("no directory: no error")
	}
	f := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(f, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := upload.New[*entry](upload.Config{Dir: f}); err == nil {
		t.Error("a file as directory: no error")
	}
}
