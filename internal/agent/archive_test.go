package agent

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/emberbox/emberbox/internal/agentproto"
)

// unarchiveCall sends data to file.unarchive into dst and returns the reply.
func unarchiveCall(t *testing.T, a *Agent, dst string, data []byte) agentproto.Reply {
	t.Helper()
	var buf bytes.Buffer
	c := agentproto.NewConn(&buf)
	for off := 0; off < len(data); off += agentproto.DataChunk {
		if err := c.WriteFrame(agentproto.KindData, data[off:min(len(data), off+agentproto.DataChunk)]); err != nil {
			t.Fatal(err)
		}
	}
	req := agentproto.Request{Method: agentproto.MethodFileUnarchive, File: &agentproto.FileRequest{Path: dst, Size: int64(len(data))}}
	if err := a.dispatch(context.Background(), c, &req); err != nil {
		pe, ok := err.(*agentproto.Error)
		if !ok {
			t.Fatalf("unarchive: error without a code: %v", err)
		}
		if buf.Len() != 0 {
			t.Fatalf("unarchive left %d bytes of its body unread", buf.Len())
		}
		return agentproto.Reply{Error: pe}
	}
	var rep agentproto.Reply
	if err := c.ReadJSON(&rep); err != nil {
		t.Fatal(err)
	}
	return rep
}

// archiveCall runs file.archive and returns the tar bytes.
func archiveCall(t *testing.T, a *Agent, dir string, gz bool, exclude []string) []byte {
	t.Helper()
	var buf bytes.Buffer
	c := agentproto.NewConn(&buf)
	req := agentproto.Request{Method: agentproto.MethodFileArchive, File: &agentproto.FileRequest{Path: dir, Gzip: gz, Exclude: exclude}}
	if err := a.dispatch(context.Background(), c, &req); err != nil {
		t.Fatalf("archive: %v", err)
	}
	var out []byte
	jsons := 0
	for {
		kind, payload, err := c.ReadFrame()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if kind == agentproto.KindData {
			out = append(out, payload...)
			continue
		}
		jsons++
		if !strings.Contains(string(payload), `"ok":true`) {
			t.Fatalf("archive reply %s", payload)
		}
	}
	if jsons != 2 {
		t.Fatalf("archive sent %d JSON frames, want 2", jsons)
	}
	if gz {
		zr, err := gzip.NewReader(bytes.NewReader(out))
		if err != nil {
			t.Fatal(err)
		}
		if out, err = io.ReadAll(zr); err != nil {
			t.Fatal(err)
		}
	}
	return out
}

type tarEntry struct {
	name, link string
	typ        byte
	mode       int64
	body       string
}

func makeTar(t *testing.T, gz bool, entries ...tarEntry) []byte {
	t.Helper()
	var buf bytes.Buffer
	var w io.Writer = &buf
	var zw *gzip.Writer
	if gz {
		zw = gzip.NewWriter(&buf)
		w = zw
	}
	tw := tar.NewWriter(w)
	for _, e := range entries {
		mode := e.mode
		if mode == 0 {
			mode = 0o644
		}
		h := &tar.Header{Name: e.name, Linkname: e.link, Typeflag: e.typ, Mode: mode, Size: int64(len(e.body))}
		if e.typ != tar.TypeReg {
			h.Size = 0
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if h.Size > 0 {
			if _, err := tw.Write([]byte(e.body)); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if zw != nil {
		if err := zw.Close(); err != nil {
			t.Fatal(err)
		}
	}
	return buf.Bytes()
}

func TestArchiveRoundTrip(t *testing.T) {
	home := t.TempDir()
	a := newTestAgent(t, os.Geteuid(), os.Getegid(), home)
	src := filepath.Join(home, "src")
	must(t, os.MkdirAll(filepath.Join(src, "sub/deep"), 0o755))
	must(t, os.MkdirAll(filepath.Join(src, "node_modules/x"), 0o755))
	must(t, os.WriteFile(filepath.Join(src, "run.sh"), []byte("#!/bin/sh\necho hi\n"), 0o755))
	must(t, os.WriteFile(filepath.Join(src, "sub/deep/data"), bytes.Repeat([]byte("x"), 600_000), 0o600))
	must(t, os.WriteFile(filepath.Join(src, "node_modules/x/big"), []byte("skip"), 0o644))
	must(t, os.Symlink("sub/deep/data", filepath.Join(src, "link")))
	must(t, os.Symlink("/etc/passwd", filepath.Join(src, "abs")))
	must(t, os.Chmod(filepath.Join(src, "sub"), 0o750))

	for _, gz := range []bool{true, false} {
		data := archiveCall(t, a, "src", gz, []string{"node_modules"})
		dst := filepath.Join(home, "dst")
		must(t, os.RemoveAll(dst))
		rep := unarchiveCall(t, a, "dst", data)
		if rep.Error != nil || rep.Unpacked == nil || rep.Unpacked.Bytes != 600_000+18 {
			t.Fatalf("unarchive gz=%v: %+v %+v", gz, rep.Error, rep.Unpacked)
		}
		if fi, err := os.Stat(filepath.Join(dst, "run.sh")); err != nil || fi.Mode().Perm() != 0o755 {
			t.Errorf("run.sh: %v %v, want mode 755", fi, err)
		}
		if fi, err := os.Stat(filepath.Join(dst, "sub/deep/data")); err != nil || fi.Mode().Perm() != 0o600 || fi.Size() != 600_000 {
			t.Errorf("data: %v %v", fi, err)
		}
		if fi, err := os.Stat(filepath.Join(dst, "sub")); err != nil || fi.Mode().Perm() != 0o750 {
			t.Errorf("sub: %v %v, want mode 750", fi, err)
		}
		if l, err := os.Readlink(filepath.Join(dst, "link")); err != nil || l != "sub/deep/data" {
			t.Errorf("link: %q %v", l, err)
		}
		if l, err := os.Readlink(filepath.Join(dst, "abs")); err != nil || l != "/etc/passwd" {
			t.Errorf("abs: %q %v", l, err)
		}
		if _, err := os.Lstat(filepath.Join(dst, "node_modules")); !os.IsNotExist(err) {
			t.Errorf("excluded node_modules was archived: %v", err)
		}
	}
	// Not a directory, and missing: refused before any data.
	rep := call(t, a, agentproto.Request{Method: agentproto.MethodFileArchive, File: &agentproto.FileRequest{Path: "src/run.sh"}})
	if rep.Error == nil || rep.Error.Code != agentproto.CodeNotADirectory {
		t.Errorf("archive of a file: %+v", rep)
	}
	rep = call(t, a, agentproto.Request{Method: agentproto.MethodFileArchive, File: &agentproto.FileRequest{Path: "nope"}})
	if rep.Error == nil || rep.Error.Code != agentproto.CodeFileNotFound {
		t.Errorf("archive of nothing: %+v", rep)
	}
}

func TestUnarchiveHostile(t *testing.T) {
	home := t.TempDir()
	a := newTestAgent(t, os.Geteuid(), os.Getegid(), home)
	outside := t.TempDir()
	must(t, os.WriteFile(filepath.Join(outside, "secret"), []byte("keep"), 0o644))
	reg := func(name, body string) tarEntry { return tarEntry{name: name, typ: tar.TypeReg, body: body} }
	for _, tc := range []struct {
		name    string
		entries []tarEntry
		code    string
	}{
		{"dotdot", []tarEntry{reg("../escape", "x")}, agentproto.CodeUnsafeArchive},
		{"inner dotdot", []tarEntry{reg("a/../../escape", "x")}, agentproto.CodeUnsafeArchive},
		{"absolute", []tarEntry{reg(filepath.Join(outside, "secret"), "x")}, agentproto.CodeUnsafeArchive},
		{"through symlink", []tarEntry{{name: "out", typ: tar.TypeSymlink, link: outside}, reg("out/secret", "pwned")}, agentproto.CodeUnsafeArchive},
		{"through relative symlink", []tarEntry{{name: "up", typ: tar.TypeSymlink, link: "../../.."}, reg("up/x", "pwned")}, agentproto.CodeUnsafeArchive},
		{"symlink then overwrite it", []tarEntry{{name: "s", typ: tar.TypeSymlink, link: filepath.Join(outside, "secret")}, reg("s", "pwned")}, ""},
		{"hard link out", []tarEntry{{name: "h", typ: tar.TypeLink, link: "../../secret"}}, agentproto.CodeUnsafeArchive},
		{"hard link absolute", []tarEntry{{name: "h", typ: tar.TypeLink, link: filepath.Join(outside, "secret")}}, agentproto.CodeUnsafeArchive},
		{"hard link via symlink", []tarEntry{{name: "o", typ: tar.TypeSymlink, link: outside}, {name: "h", typ: tar.TypeLink, link: "o/secret"}}, agentproto.CodeUnsafeArchive},
		{"char device", []tarEntry{{name: "null", typ: tar.TypeChar}}, agentproto.CodeUnsafeArchive},
		{"block device", []tarEntry{{name: "sda", typ: tar.TypeBlock}}, agentproto.CodeUnsafeArchive},
		{"fifo", []tarEntry{{name: "p", typ: tar.TypeFifo}}, agentproto.CodeUnsafeArchive},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dst := filepath.Join(home, "t-"+strings.ReplaceAll(tc.name, " ", "-"))
			rep := unarchiveCall(t, a, dst, makeTar(t, true, tc.entries...))
			if tc.code == "" {
				if rep.Error != nil {
					t.Fatalf("refused: %+v", rep.Error)
				}
			} else if rep.Error == nil || rep.Error.Code != tc.code {
				t.Fatalf("got %+v %+v, want %s", rep.Error, rep.Unpacked, tc.code)
			}
			if b, err := os.ReadFile(filepath.Join(outside, "secret")); err != nil || string(b) != "keep" {
				t.Fatalf("outside file changed: %q %v", b, err)
			}
			if ents, _ := os.ReadDir(outside); len(ents) != 1 {
				t.Fatalf("outside holds %d entries", len(ents))
			}
			if _, err := os.Lstat(filepath.Join(home, "escape")); err == nil {
				t.Fatal("an entry escaped into the home")
			}
		})
	}
	// Not a tar, and a truncated gzip: refused, not unpacked.
	if rep := unarchiveCall(t, a, filepath.Join(home, "junk"), []byte("this is not a tar archive at all, just text")); rep.Error == nil {
		t.Error("junk was unpacked")
	}
	gz := makeTar(t, true, reg("a", strings.Repeat("y", 100_000)))
	if rep := unarchiveCall(t, a, filepath.Join(home, "cut"), gz[:len(gz)/2]); rep.Error == nil {
		t.Error("a cut archive was unpacked")
	}
}

func TestUnarchiveBounds(t *testing.T) {
	home := t.TempDir()
	a := newTestAgent(t, os.Geteuid(), os.Getegid(), home)
	defer func(e int, b int64) { maxArchiveEntries, maxUnarchiveBytes = e, b }(maxArchiveEntries, maxUnarchiveBytes)
	maxArchiveEntries, maxUnarchiveBytes = 3, 1000
	var many []tarEntry
	for _, n := range []string{"a", "b", "c", "d"} {
		many = append(many, tarEntry{name: n, typ: tar.TypeReg, body: "x"})
	}
	if rep := unarchiveCall(t, a, "many", makeTar(t, false, many...)); rep.Error == nil || rep.Error.Code != agentproto.CodeTooLarge {
		t.Errorf("4 entries over a bound of 3: %+v", rep)
	}
	// A gzip bomb in miniature: small compressed, large unpacked.
	bomb := makeTar(t, true, tarEntry{name: "z", typ: tar.TypeReg, body: strings.Repeat("0", 5000)})
	if rep := unarchiveCall(t, a, "bomb", bomb); rep.Error == nil || rep.Error.Code != agentproto.CodeTooLarge {
		t.Errorf("5000 bytes over a bound of 1000: %+v", rep)
	}
}

func TestGlob(t *testing.T) {
	home := t.TempDir()
	a := newTestAgent(t, os.Geteuid(), os.Getegid(), home)
	for _, f := range []string{"a.py", "b.txt", "src/c.py", "src/deep/d.py", "src/deep/e.go", ".hidden.py", "src/.cache/f.py"} {
		must(t, os.MkdirAll(filepath.Dir(filepath.Join(home, f)), 0o755))
		must(t, os.WriteFile(filepath.Join(home, f), nil, 0o644))
	}
	must(t, os.Symlink("/", filepath.Join(home, "src/root")))
	glob := func(pattern string, hidden bool) ([]string, *agentproto.Error) {
		rep := call(t, a, agentproto.Request{Method: agentproto.MethodFileGlob, File: &agentproto.FileRequest{Glob: pattern, Hidden: hidden}})
		var out []string
		for _, e := range rep.Entries {
			rel, _ := filepath.Rel(home, e.Path)
			out = append(out, rel)
		}
		return out, rep.Error
	}
	for _, tc := range []struct {
		pattern string
		hidden  bool
		want    []string
	}{
		{"*.py", false, []string{"a.py"}},
		{"**/*.py", false, []string{"a.py", "src/c.py", "src/deep/d.py"}},
		{"**/*.py", true, []string{".hidden.py", "a.py", "src/.cache/f.py", "src/c.py", "src/deep/d.py"}},
		{"src/**", false, []string{"src", "src/c.py", "src/deep", "src/deep/d.py", "src/deep/e.go", "src/root"}},
		{"src/*/*.go", false, []string{"src/deep/e.go"}},
		{".*.py", false, []string{".hidden.py"}},
		{"src/root/etc", false, nil}, // a symlink is never followed
	} {
		got, err := glob(tc.pattern, tc.hidden)
		if err != nil || !slices.Equal(got, tc.want) {
			t.Errorf("glob %q hidden=%v: %v %+v, want %v", tc.pattern, tc.hidden, got, err, tc.want)
		}
	}
	for _, bad := range []string{"", "/abs/*", "../*", "[", "**/**/a/**/b/**/c/**/d/**"} {
		if _, err := glob(bad, false); err == nil || err.Code != agentproto.CodeInvalid {
			t.Errorf("glob %q: %+v, want invalid", bad, err)
		}
	}
}

func TestRename(t *testing.T) {
	home := t.TempDir()
	a := newTestAgent(t, os.Geteuid(), os.Getegid(), home)
	must(t, os.WriteFile(filepath.Join(home, "a"), []byte("A"), 0o644))
	must(t, os.WriteFile(filepath.Join(home, "b"), []byte("B"), 0o644))
	rename := func(from, to string, overwrite bool) agentproto.Reply {
		return call(t, a, agentproto.Request{Method: agentproto.MethodFileRename,
			File: &agentproto.FileRequest{Path: from, Target: to, Overwrite: overwrite}})
	}
	if rep := rename("a", "b", false); rep.Error == nil || rep.Error.Code != agentproto.CodeExists {
		t.Errorf("rename over b without overwrite: %+v", rep)
	}
	if b, _ := os.ReadFile(filepath.Join(home, "b")); string(b) != "B" {
		t.Errorf("b was replaced: %q", b)
	}
	if rep := rename("a", "b", true); rep.Error != nil || rep.Entry == nil || rep.Entry.Path != filepath.Join(home, "b") {
		t.Errorf("rename with overwrite: %+v", rep)
	}
	if b, _ := os.ReadFile(filepath.Join(home, "b")); string(b) != "A" {
		t.Errorf("b holds %q, want A", b)
	}
	if rep := rename("a", "c", false); rep.Error == nil || rep.Error.Code != agentproto.CodeFileNotFound {
		t.Errorf("rename of a missing file: %+v", rep)
	}
	if rep := rename("b", "", false); rep.Error == nil || rep.Error.Code != agentproto.CodeInvalid {
		t.Errorf("rename without target: %+v", rep)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
