package envd_test

import (
	"bytes"
	"compress/gzip"
	"encoding/base64"
	"encoding/json"
	"io"
	"mime/multipart"
	"net/http"
	"net/http/httptest"
	"os"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/emberbox/emberbox/internal/envd"
	"github.com/emberbox/emberbox/internal/envd/proto/filesystem"
	"github.com/emberbox/emberbox/internal/envd/proto/filesystem/filesystemconnect"
)

// A request that reached the server without a routed sandbox is refused,
// not served against nothing.
func TestNotRouted(t *testing.T) {
	ts := httptest.NewServer(envd.New(nil))
	defer ts.Close()
	c := filesystemconnect.NewFilesystemClient(http.DefaultClient, ts.URL)
	_, err := c.Stat(testCtx(t), connect.NewRequest(&filesystem.StatRequest{Path: "/"}))
	wantCode(t, err, connect.CodeInternal)
}

type uploadedEntry struct {
	Name, Type, Path string
}

func postFiles(t *testing.T, url, contentType string, body io.Reader, hdr map[string]string) (int, []uploadedEntry, string) {
	t.Helper()
	req, err := http.NewRequest("POST", url, body)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", contentType)
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	var out []uploadedEntry
	if res.StatusCode == 200 {
		if err := json.Unmarshal(b, &out); err != nil {
			t.Fatalf("answer %s: %v", b, err)
		}
	}
	return res.StatusCode, out, string(b)
}

// POST /files takes multipart files (named by path= or their file name)
// and octet-stream bodies (of a known length, chunked, gzipped); GET
// /files gives them back.
func TestFilesUploadDownload(t *testing.T) {
	e := newEnv(t)
	a, b := filepath.Join(e.dir, "m", "a.txt"), filepath.Join(e.dir, "m", "sub", "b.bin")

	var body bytes.Buffer
	mw := multipart.NewWriter(&body)
	for _, f := range []struct{ path, data string }{{a, "alpha"}, {b, "\x00beta"}} {
		w, err := mw.CreateFormFile("file", f.path)
		if err != nil {
			t.Fatal(err)
		}
		w.Write([]byte(f.data))
	}
	mw.Close()
	status, out, raw := postFiles(t, e.url+"/files?username=root", mw.FormDataContentType(), &body, nil)
	if status != 200 || len(out) != 2 || out[0] != (uploadedEntry{"a.txt", "file", a}) || out[1].Path != b {
		t.Fatalf("multipart upload: %d %s", status, raw)
	}

	c := filepath.Join(e.dir, "o", "c.txt")
	status, out, raw = postFiles(t, e.url+"/files?path="+c, "application/octet-stream", strings.NewReader("known length"), nil)
	if status != 200 || len(out) != 1 || out[0].Path != c {
		t.Fatalf("octet-stream upload: %d %s", status, raw)
	}
	d := filepath.Join(e.dir, "o", "d.txt")
	chunked := io.MultiReader(strings.NewReader("of unknown "), strings.NewReader("length"))
	if status, _, raw := postFiles(t, e.url+"/files?path="+d, "application/octet-stream", struct{ io.Reader }{chunked}, nil); status != 200 {
		t.Fatalf("chunked upload: %d %s", status, raw)
	}
	g := filepath.Join(e.dir, "o", "g.txt")
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Write(bytes.Repeat([]byte("zip"), 1000))
	zw.Close()
	if status, _, raw := postFiles(t, e.url+"/files?path="+g, "application/octet-stream", &gz, map[string]string{"Content-Encoding": "gzip"}); status != 200 {
		t.Fatalf("gzip upload: %d %s", status, raw)
	}
	for path, want := range map[string]string{a: "alpha", b: "\x00beta", c: "known length", d: "of unknown length", g: strings.Repeat("zip", 1000)} {
		if got, err := os.ReadFile(path); err != nil || string(got) != want {
			t.Errorf("%s holds %q (%v), want %q", path, got, err, want)
		}
		res, err := http.Get(e.url + "/files?path=" + path)
		if err != nil {
			t.Fatal(err)
		}
		got, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode != 200 || string(got) != want {
			t.Errorf("GET %s: %d %q", path, res.StatusCode, got)
		}
	}

	// Gzipped download when the client accepts it.
	req, _ := http.NewRequest("GET", e.url+"/files?path="+g, nil)
	req.Header.Set("Accept-Encoding", "gzip")
	res, err := http.DefaultTransport.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	zr, err := gzip.NewReader(res.Body)
	if err != nil || res.Header.Get("Content-Encoding") != "gzip" {
		t.Fatalf("gzip download: %v, %v", err, res.Header)
	}
	if got, _ := io.ReadAll(zr); string(got) != strings.Repeat("zip", 1000) {
		t.Errorf("gzip download gave %d bytes", len(got))
	}
	res.Body.Close()

	// Errors in envd's shape, with the statuses the SDK maps.
	for _, tc := range []struct {
		method, query string
		want          int
	}{
		{"GET", "path=" + filepath.Join(e.dir, "missing"), 404},
		{"GET", "path=" + e.dir, 400},
		{"GET", "", 400},
		{"POST", "", 400},
	} {
		req, _ := http.NewRequest(tc.method, e.url+"/files?"+tc.query, strings.NewReader("x"))
		req.Header.Set("Content-Type", "application/octet-stream")
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var eb struct {
			Code    int
			Message string
		}
		err = json.NewDecoder(res.Body).Decode(&eb)
		res.Body.Close()
		if res.StatusCode != tc.want || err != nil || eb.Code != tc.want || eb.Message == "" {
			t.Errorf("%s /files?%s: %d %+v (%v), want %d", tc.method, tc.query, res.StatusCode, eb, err, tc.want)
		}
	}
}

func TestFilesystemRPCs(t *testing.T) {
	e := newEnv(t)
	for _, codec := range codecs {
		t.Run(codec.name, func(t *testing.T) {
			ctx := testCtx(t)
			c := e.filesystem(codec.opts...)
			root := filepath.Join(e.dir, codec.name)
			dir := filepath.Join(root, "x", "y")
			mk, err := c.MakeDir(ctx, connect.NewRequest(&filesystem.MakeDirRequest{Path: dir}))
			if err != nil {
				t.Fatal(err)
			}
			if en := mk.Msg.GetEntry(); en.GetType() != filesystem.FileType_FILE_TYPE_DIRECTORY || en.GetPath() != dir || en.GetName() != "y" {
				t.Errorf("made %v", en)
			}
			_, err = c.MakeDir(ctx, connect.NewRequest(&filesystem.MakeDirRequest{Path: dir}))
			wantCode(t, err, connect.CodeAlreadyExists)

			f := filepath.Join(dir, "f.txt")
			if err := os.WriteFile(f, []byte("hello"), 0o640); err != nil {
				t.Fatal(err)
			}
			mtime := time.Now().Add(-time.Hour).Truncate(time.Second)
			os.Chtimes(f, mtime, mtime)
			if err := os.Symlink("f.txt", filepath.Join(dir, "link")); err != nil {
				t.Fatal(err)
			}
			st, err := c.Stat(ctx, connect.NewRequest(&filesystem.StatRequest{Path: f}))
			if err != nil {
				t.Fatal(err)
			}
			en := st.Msg.GetEntry()
			if en.GetType() != filesystem.FileType_FILE_TYPE_FILE || en.GetSize() != 5 || en.GetMode() != 0o640 ||
				en.GetPermissions() != "-rw-r-----" || en.GetOwner() == "" || en.GetGroup() == "" ||
				!en.GetModifiedTime().AsTime().Equal(mtime) || en.SymlinkTarget != nil {
				t.Errorf("stat %v", en)
			}
			st, err = c.Stat(ctx, connect.NewRequest(&filesystem.StatRequest{Path: filepath.Join(dir, "link")}))
			if err != nil {
				t.Fatal(err)
			}
			if en := st.Msg.GetEntry(); en.GetType() != filesystem.FileType_FILE_TYPE_SYMLINK || en.GetSymlinkTarget() != "f.txt" || !en.GetIsSymlink() {
				t.Errorf("stat of a symlink %v", en)
			}
			_, err = c.Stat(ctx, connect.NewRequest(&filesystem.StatRequest{Path: filepath.Join(dir, "nope")}))
			wantCode(t, err, connect.CodeNotFound)
			_, err = c.Stat(ctx, connect.NewRequest(&filesystem.StatRequest{}))
			wantCode(t, err, connect.CodeInvalidArgument)

			names := func(depth uint32) []string {
				t.Helper()
				ls, err := c.ListDir(ctx, connect.NewRequest(&filesystem.ListDirRequest{Path: root, Depth: depth}))
				if err != nil {
					t.Fatal(err)
				}
				var out []string
				for _, en := range ls.Msg.GetEntries() {
					rel, _ := filepath.Rel(root, en.GetPath())
					out = append(out, rel)
				}
				slices.Sort(out)
				return out
			}
			if got := names(1); !slices.Equal(got, []string{"x"}) {
				t.Errorf("depth 1: %v", got)
			}
			if got := names(3); !slices.Equal(got, []string{"x", "x/y", "x/y/f.txt", "x/y/link"}) {
				t.Errorf("depth 3: %v", got)
			}
			_, err = c.ListDir(ctx, connect.NewRequest(&filesystem.ListDirRequest{Path: f}))
			wantCode(t, err, connect.CodeInvalidArgument)

			g := filepath.Join(root, "g.txt")
			mv, err := c.Move(ctx, connect.NewRequest(&filesystem.MoveRequest{Source: f, Destination: g}))
			if err != nil {
				t.Fatal(err)
			}
			if mv.Msg.GetEntry().GetPath() != g {
				t.Errorf("moved to %v", mv.Msg.GetEntry())
			}
			if _, err := c.Remove(ctx, connect.NewRequest(&filesystem.RemoveRequest{Path: filepath.Join(root, "x")})); err != nil {
				t.Fatal(err)
			}
			if got := names(3); !slices.Equal(got, []string{"g.txt"}) {
				t.Errorf("after move and remove: %v", got)
			}
		})
	}
}

func TestWatchDir(t *testing.T) {
	e := newEnv(t)
	for _, codec := range codecs {
		t.Run(codec.name, func(t *testing.T) {
			ctx := testCtx(t)
			c := e.filesystem(codec.opts...)
			dir := filepath.Join(e.dir, "w-"+codec.name)
			if err := os.MkdirAll(filepath.Join(dir, "sub"), 0o755); err != nil {
				t.Fatal(err)
			}
			s, err := c.WatchDir(ctx, connect.NewRequest(&filesystem.WatchDirRequest{Path: dir, Recursive: true, IncludeEntry: true}))
			if err != nil {
				t.Fatal(err)
			}
			if !s.Receive() || s.Msg().GetStart() == nil {
				t.Fatalf("first event %v, %v; want start", s.Msg(), s.Err())
			}
			if err := os.WriteFile(filepath.Join(dir, "sub", "new.txt"), []byte("x"), 0o644); err != nil {
				t.Fatal(err)
			}
			var created *filesystem.FilesystemEvent
			for created == nil && s.Receive() {
				if ev := s.Msg().GetFilesystem(); ev.GetType() == filesystem.EventType_EVENT_TYPE_CREATE {
					created = ev
				}
			}
			if created.GetName() != "sub/new.txt" || created.GetEntry().GetName() != "new.txt" {
				t.Errorf("create event %v", created)
			}
			s.Close()

			_, err = c.CreateWatcher(ctx, connect.NewRequest(&filesystem.CreateWatcherRequest{Path: filepath.Join(dir, "sub", "new.txt")}))
			wantCode(t, err, connect.CodeInvalidArgument)
			_, err = c.CreateWatcher(ctx, connect.NewRequest(&filesystem.CreateWatcherRequest{Path: filepath.Join(dir, "missing")}))
			wantCode(t, err, connect.CodeNotFound)

			w, err := c.CreateWatcher(ctx, connect.NewRequest(&filesystem.CreateWatcherRequest{Path: dir}))
			if err != nil {
				t.Fatal(err)
			}
			id := w.Msg.GetWatcherId()
			if err := os.Remove(filepath.Join(dir, "sub", "new.txt")); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, "top.txt"), nil, 0o644); err != nil {
				t.Fatal(err)
			}
			var got []string
			waitUntil(t, "the watcher's create event", func() bool {
				r, err := c.GetWatcherEvents(ctx, connect.NewRequest(&filesystem.GetWatcherEventsRequest{WatcherId: id}))
				if err != nil {
					t.Fatal(err)
				}
				for _, ev := range r.Msg.GetEvents() {
					got = append(got, ev.GetType().String()+" "+ev.GetName())
				}
				return slices.Contains(got, "EVENT_TYPE_CREATE top.txt")
			})
			if slices.Contains(got, "EVENT_TYPE_REMOVE sub/new.txt") {
				t.Errorf("a non-recursive watcher saw %v", got)
			}
			if _, err := c.RemoveWatcher(ctx, connect.NewRequest(&filesystem.RemoveWatcherRequest{WatcherId: id})); err != nil {
				t.Fatal(err)
			}
			_, err = c.GetWatcherEvents(ctx, connect.NewRequest(&filesystem.GetWatcherEventsRequest{WatcherId: id}))
			wantCode(t, err, connect.CodeNotFound)
		})
	}
}

// File calls act as the user a request names: Basic auth for the RPCs,
// username= for /files.
func TestFilesystemUser(t *testing.T) {
	e := newEnv(t)
	ctx := testCtx(t)
	nobody, err := user.Lookup("nobody")
	if err != nil || os.Geteuid() != 0 {
		t.Skip("needs root and a nobody account")
	}
	private := filepath.Join(e.dir, "private")
	open := filepath.Join(e.dir, "open")
	if err := os.Mkdir(private, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(open, 0o777); err != nil {
		t.Fatal(err)
	}
	os.Chmod(open, 0o777)
	os.Chmod(e.dir, 0o755)
	os.Chmod(filepath.Dir(e.dir), 0o755) // t.TempDir makes it 0700
	if err := os.WriteFile(filepath.Join(private, "f"), []byte("secret"), 0o600); err != nil {
		t.Fatal(err)
	}

	c := e.filesystem(connect.WithProtoJSON())
	as := func(m any, name string) {
		type headered interface{ Header() http.Header }
		m.(headered).Header().Set("Authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte(name+":")))
	}
	req := connect.NewRequest(&filesystem.StatRequest{Path: filepath.Join(private, "f")})
	as(req, "nobody")
	_, err = c.Stat(ctx, req)
	wantCode(t, err, connect.CodePermissionDenied)
	req = connect.NewRequest(&filesystem.StatRequest{Path: filepath.Join(private, "f")})
	as(req, "root")
	if _, err := c.Stat(ctx, req); err != nil {
		t.Errorf("stat as root: %v", err)
	}
	mk := connect.NewRequest(&filesystem.MakeDirRequest{Path: filepath.Join(open, "d")})
	as(mk, "nobody")
	res, err := c.MakeDir(ctx, mk)
	if err != nil {
		t.Fatal(err)
	}
	if res.Msg.GetEntry().GetOwner() != "nobody" {
		t.Errorf("made as nobody, owned by %q", res.Msg.GetEntry().GetOwner())
	}

	res2, err := http.Get(e.url + "/files?username=nobody&path=" + filepath.Join(private, "f"))
	if err != nil {
		t.Fatal(err)
	}
	res2.Body.Close()
	if res2.StatusCode != http.StatusForbidden {
		t.Errorf("GET as nobody: %d, want 403", res2.StatusCode)
	}
	status, out, raw := postFiles(t, e.url+"/files?username=nobody&path="+filepath.Join(open, "n.txt"), "application/octet-stream", strings.NewReader("n"), nil)
	if status != 200 || len(out) != 1 {
		t.Fatalf("upload as nobody: %d %s", status, raw)
	}
	fi, err := os.Stat(filepath.Join(open, "n.txt"))
	if err != nil {
		t.Fatal(err)
	}
	if uid := fi.Sys().(*syscall.Stat_t).Uid; strconv.Itoa(int(uid)) != nobody.Uid {
		t.Errorf("uploaded as nobody, owned by uid %d", uid)
	}
	if status, _, _ := postFiles(t, e.url+"/files?username=nobody&path="+filepath.Join(private, "x"), "application/octet-stream", strings.NewReader("n"), nil); status != http.StatusForbidden {
		t.Errorf("upload as nobody into a private directory: %d, want 403", status)
	}
}
