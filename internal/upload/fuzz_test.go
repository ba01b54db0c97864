package upload

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/emberbox/emberbox/internal/errdefs"
)

// fuzzMaxChunks bounds the uploads the fuzzer makes: each chunk is a real
// 1 MiB write.
const fuzzMaxChunks = 3

// FuzzUpload checks chunk offsets and lengths against their definition for
// any size and offset, then runs a fuzzed sequence of puts, commits and
// aborts on one small upload against a model of it: a put is taken exactly
// when its offset and length are those of a chunk; a commit writes exactly
// the bytes last put at each chunk, and only when every chunk came and
// their SHA-256 is the one promised; a committed or aborted upload takes
// nothing more; another owner or sandbox never finds it; and the staging
// file is never larger than the upload and is gone once it ends.
func FuzzUpload(f *testing.F) {
	f.Add(int64(ChunkSize+5), int64(ChunkSize), 5, uint8(2), []byte{0, 0, 'a', 0, 1, 'b', 3, 0, 0})
	f.Add(int64(0), int64(0), 0, uint8(0), []byte{3, 0, 0, 0, 0, 0})
	f.Add(int64(MaxSize), int64(MaxSize-ChunkSize), ChunkSize, uint8(3), []byte{0, 2, 'c', 0, 1, 'b', 0, 0, 'a', 3, 0, 0, 3, 0, 0, 4, 0, 0})
	f.Add(int64(-1), int64(-ChunkSize), -1, uint8(1), []byte{1, 0, 7, 2, 0, 9, 5, 0, 0, 4, 0, 0, 0, 0, 'a'})
	f.Add(int64(1<<62), int64(1<<62-ChunkSize), ChunkSize, uint8(2), []byte{0, 1, 'x', 3, 0, 0, 0, 1, 'b', 0, 0, 'a', 3, 0, 0})
	// One staging directory serves every input: New removes what the last
	// one left.
	dir := filepath.Join(f.TempDir(), "uploads")
	f.Fuzz(func(t *testing.T, size, off int64, n int, chunks uint8, ops []byte) {
		err := checkChunk(size, off, n)
		valid := off >= 0 && off%ChunkSize == 0 && off < size && int64(n) == min(ChunkSize, size-off)
		if (err == nil) != valid || err != nil && errdefs.Code(err) != CodeInvalid {
			t.Fatalf("checkChunk(%d, %d, %d) = %v", size, off, n, err)
		}
		runUpload(t, dir, int(chunks)%(fuzzMaxChunks+1), size, ops)
	})
}

// chunkData is the bytes put at chunk i of an upload of size, all b.
func chunkData(size int64, i int, b byte) []byte {
	return bytes.Repeat([]byte{b}, int(min(ChunkSize, size-int64(i)*ChunkSize)))
}

// runUpload runs ops (3 bytes each) on an upload staged in dir of nchunks
// chunks whose last is short by tail bytes, promising the SHA-256 of chunk i
// filled with 'a'+i.
func runUpload(t *testing.T, dir string, nchunks int, tail int64, ops []byte) {
	size := int64(nchunks) * ChunkSize
	if size > 0 {
		size -= (tail%ChunkSize + ChunkSize) % ChunkSize
	}
	var want []byte
	for i := range nchunks {
		want = append(want, chunkData(size, i, 'a'+byte(i))...)
	}
	sum := sha256.Sum256(want)
	s, err := New[[]byte](Config{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	u, err := s.Begin(Spec{Owner: "key_a", SandboxID: "sbx_1", Path: "/workspace/f", Size: size, SHA256: hex.EncodeToString(sum[:]), Mode: 0o640})
	if err != nil {
		t.Fatal(err)
	}
	if u.Chunks != nchunks || u.Size != size {
		t.Fatalf("upload of %d bytes has %d chunks, want %d", u.Size, u.Chunks, nchunks)
	}
	// The model.
	have := make([][]byte, nchunks)
	ended, committed := false, false
	writes := 0
	write := func(ctx context.Context, p string, mode uint32, n int64, r io.Reader) ([]byte, error) {
		writes++
		b, err := io.ReadAll(r)
		if err != nil || p != "/workspace/f" || mode != 0o640 || int64(len(b)) != n || n != size {
			t.Fatalf("write of %q %o %d: %d bytes, %v", p, mode, n, len(b), err)
		}
		return b, nil
	}
	code := func(err error) string {
		if err == nil {
			return ""
		}
		var ce *errdefs.CodedError
		if !errors.As(err, &ce) {
			t.Fatalf("error without a code: %v", err)
		}
		return ce.Code
	}
	stateCode := func() string {
		switch {
		case committed:
			return CodeCommitted
		case ended:
			return CodeNotFound
		}
		return ""
	}
	for len(ops) >= 3 {
		kind, idx, b := ops[0]%6, int(ops[1]), ops[2]
		ops = ops[3:]
		switch kind {
		case 0, 1, 2: // a chunk; 1: of a wrong length, 2: at a wrong offset
			i := idx % (nchunks + 1)
			data := chunkData(size, min(i, max(nchunks-1, 0)), b)
			off := int64(i) * ChunkSize
			if kind == 1 {
				data = data[:len(data)-int(b)%(len(data)+1)]
				data = append(data, bytes.Repeat([]byte{b}, int(b)%3)...)
			}
			if kind == 2 {
				off += int64(int8(b))
			}
			p, err := s.Put("key_a", "sbx_1", u.ID, off, data)
			wantCode := stateCode()
			if wantCode == "" && checkChunk(size, off, len(data)) != nil {
				wantCode = CodeInvalid
			}
			if got := code(err); got != wantCode {
				t.Fatalf("put %d bytes at %d of %d: %v, want code %q", len(data), off, size, err, wantCode)
			}
			if err == nil {
				have[off/ChunkSize] = data
				received := 0
				for _, h := range have {
					if h != nil {
						received++
					}
				}
				if p.ChunksReceived != received || p.Chunks != nchunks || p.Offset != off || p.Bytes != len(data) {
					t.Fatalf("progress %+v, want %d of %d", p, received, nchunks)
				}
			}
		case 3: // commit
			before := writes
			got, err := s.Commit(context.Background(), "key_a", "sbx_1", u.ID, write)
			var staged []byte
			complete := true
			for _, h := range have {
				complete = complete && h != nil
				staged = append(staged, h...)
			}
			var wantCode string
			switch {
			case ended && !committed:
				wantCode = CodeNotFound
			case committed:
			case !complete:
				wantCode = CodeIncomplete
			case !bytes.Equal(staged, want):
				wantCode = CodeChecksum
			}
			if c := code(err); c != wantCode {
				t.Fatalf("commit: %v, want code %q", err, wantCode)
			}
			if err == nil {
				if !bytes.Equal(got, want) || committed && writes != before || !committed && writes != before+1 {
					t.Fatalf("commit wrote %d bytes (%d writes), want %d", len(got), writes-before, len(want))
				}
				committed, ended = true, true
			}
		case 4: // abort
			err := s.Abort("key_a", "sbx_1", u.ID)
			if got := code(err); got != stateCode() {
				t.Fatalf("abort: %v, want code %q", err, stateCode())
			}
			if err == nil {
				ended = true
			}
		case 5: // someone else's
			for _, who := range [][2]string{{"key_b", "sbx_1"}, {"key_a", "sbx_2"}} {
				_, perr := s.Put(who[0], who[1], u.ID, 0, chunkData(size, 0, b))
				cerr := s.Abort(who[0], who[1], u.ID)
				if code(perr) != CodeNotFound || code(cerr) != CodeNotFound {
					t.Fatalf("%v reached the upload: %v, %v", who, perr, cerr)
				}
			}
		}
		checkStaging(t, dir, size, !ended)
	}
}

// checkStaging checks the staging directory holds one file no larger than
// the upload while it is open, and none after.
func checkStaging(t *testing.T, dir string, size int64, open bool) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if open != (len(ents) == 1) || len(ents) > 1 {
		t.Fatalf("%d staging files, upload open: %v", len(ents), open)
	}
	for _, e := range ents {
		fi, err := e.Info()
		if err != nil || fi.Size() != size {
			t.Fatalf("staging file of %d bytes for an upload of %d (%v)", fi.Size(), size, err)
		}
	}
}
