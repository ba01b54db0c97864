package integration

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"net/url"
	"strings"
	"testing"
)

// TestFilesGlobRenameArchive runs glob, rename and a directory's archive
// round trip (symlinks and modes kept, excludes honoured, a hostile archive
// refused) against one real VM.
func TestFilesGlobRenameArchive(t *testing.T) {
	needVMs(t)
	s := startServer(t, t.TempDir())
	c := s.client(s.AdminKey)
	sb := c.createRunning(t, nil)
	base := "/v1/sandboxes/" + sb.ID
	c.sh(t, sb.ID, `set -e; mkdir -p /workspace/tree/src/deep /workspace/tree/node_modules/x
		printf 'print(1)\n' > /workspace/tree/a.py; printf 'x' > /workspace/tree/src/deep/b.py
		printf '#!/bin/sh\necho hi\n' > /workspace/tree/run.sh; chmod 755 /workspace/tree/run.sh
		printf 'secret' > /workspace/tree/src/private; chmod 600 /workspace/tree/src/private
		printf 'junk' > /workspace/tree/node_modules/x/junk
		ln -s src/deep/b.py /workspace/tree/link; ln -s /etc/hostname /workspace/tree/abs`)

	type entry struct {
		Path, Type, Mode string
	}
	list, _ := call[struct{ Data []entry }](t, c, "GET", base+"/files/list?path=/workspace/tree&glob="+url.QueryEscape("**/*.py"), nil, nil)
	var got []string
	for _, e := range list.Data {
		got = append(got, e.Path)
	}
	if strings.Join(got, " ") != "/workspace/tree/a.py /workspace/tree/src/deep/b.py" {
		t.Errorf("glob **/*.py: %v", got)
	}

	c.sh(t, sb.ID, "printf A > /workspace/ra; printf B > /workspace/rb")
	if r := c.raw(t, "POST", base+"/files:rename", map[string]any{"from": "/workspace/ra", "to": "/workspace/rb"}, nil, requestTimeout); r.Status != 409 || r.Err.Code != "file_exists" {
		t.Errorf("rename onto an existing file: %v", r)
	}
	call[entry](t, c, "POST", base+"/files:rename", map[string]any{"from": "/workspace/ra", "to": "/workspace/rb", "overwrite": true}, nil)
	if out := c.sh(t, sb.ID, "cat /workspace/rb; test ! -e /workspace/ra && echo gone"); out != "Agone\n" {
		t.Errorf("after rename: %q", out)
	}
	if r := c.raw(t, "POST", base+"/files:rename", map[string]any{"from": "/workspace/rb", "to": "/run/rb"}, nil, requestTimeout); r.Status == 200 {
		t.Errorf("rename across file systems (or into root's /run) succeeded: %v", r)
	}

	r := c.raw(t, "GET", base+"/files/archive?path=/workspace/tree&exclude=node_modules", nil, nil, requestTimeout)
	if r.err != nil || r.Status != 200 || r.Header.Get("Content-Type") != "application/gzip" {
		t.Fatalf("archive: %v", r)
	}
	zr, err := gzip.NewReader(bytes.NewReader(r.Body))
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]string{}
	tr := tar.NewReader(zr)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		seen[h.Name] = fmt.Sprintf("%c %s %o", h.Typeflag, h.Linkname, h.Mode)
	}
	for name, want := range map[string]string{
		"run.sh": "0  755", "src/private": "0  600", "link": "2 src/deep/b.py 777", "abs": "2 /etc/hostname 777", "src/": "5  755",
	} {
		if seen[name] != want {
			t.Errorf("tar entry %s: %q, want %q", name, seen[name], want)
		}
	}
	if _, ok := seen["node_modules/"]; ok {
		t.Error("excluded node_modules is in the archive")
	}

	up := c.raw(t, "PUT", base+"/files/archive?path=/workspace/copy", r.Body, nil, requestTimeout)
	if up.Status != 200 {
		t.Fatalf("unarchive: %v", up)
	}
	out := c.sh(t, sb.ID, `cd /workspace/copy && stat -c '%n %a %F' run.sh src/private && readlink link abs && cat link && test ! -e node_modules && echo ok`)
	if want := "run.sh 755 regular file\nsrc/private 600 regular file\nsrc/deep/b.py\n/etc/hostname\nxok\n"; out != want {
		t.Errorf("unpacked tree:\n%s\nwant\n%s", out, want)
	}

	var hostile bytes.Buffer
	tw := tar.NewWriter(&hostile)
	_ = tw.WriteHeader(&tar.Header{Name: "out", Typeflag: tar.TypeSymlink, Linkname: "/workspace", Mode: 0o777})
	_ = tw.WriteHeader(&tar.Header{Name: "out/evil", Typeflag: tar.TypeReg, Mode: 0o644, Size: 4})
	_, _ = tw.Write([]byte("evil"))
	_ = tw.Close()
	bad := c.raw(t, "PUT", base+"/files/archive?path=/workspace/h", hostile.Bytes(), nil, requestTimeout)
	if bad.Status != 400 || bad.Err.Code != "unsafe_archive" {
		t.Errorf("hostile archive: %v", bad)
	}
	if out := c.sh(t, sb.ID, "test ! -e /workspace/evil && echo safe"); out != "safe\n" {
		t.Errorf("a hostile entry landed: %q", out)
	}
}
