package api

import (
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/emberbox/emberbox/internal/errdefs"
	"github.com/emberbox/emberbox/internal/sandbox"
)

// pathOnly decodes the path of a file entry.
type pathOnly struct {
	Path string `json:"path"`
}

func TestGlobList(t *testing.T) {
	e := newEnv(t)
	e.m.add("key_a", "sbx_r", sandbox.StateRunning, time.Hour)
	e.m.files["sbx_r\x00/workspace/a.py"] = []byte("x")
	e.m.files["sbx_r\x00/workspace/b.txt"] = []byte("y")
	w := e.do("GET", "/v1/sandboxes/sbx_r/files/list?path=%2Fworkspace&glob=*.py", "")
	got := decodeBody[dataJSON[pathOnly]](t, w)
	if w.Code != 200 || len(got.Data) != 1 || got.Data[0].Path != "/workspace/a.py" || e.m.arch.glob != "/workspace *.py" {
		t.Fatalf("glob: %d %s (asked %q)", w.Code, w.Body, e.m.arch.glob)
	}
	// An absolute pattern under the root is made relative; one outside is refused.
	if w := e.do("GET", "/v1/sandboxes/sbx_r/files/list?path=/workspace&glob=/workspace/**/*.py", ""); w.Code != 200 || e.m.arch.glob != "/workspace **/*.py" {
		t.Errorf("absolute glob: %d %s (asked %q)", w.Code, w.Body, e.m.arch.glob)
	}
	if w := e.do("GET", "/v1/sandboxes/sbx_r/files/list?path=/workspace&glob=/etc/*", ""); w.Code != 400 {
		t.Errorf("glob outside the root: %d %s", w.Code, w.Body)
	}
	if w := e.do("GET", "/v1/sandboxes/sbx_r/files/list?glob="+strings.Repeat("a", 2000), ""); w.Code != 400 {
		t.Errorf("long glob: %d", w.Code)
	}
}

func TestRenameRoute(t *testing.T) {
	e := newEnv(t)
	e.m.add("key_a", "sbx_r", sandbox.StateRunning, time.Hour)
	e.m.files["sbx_r\x00/a"] = []byte("A")
	e.m.files["sbx_r\x00/b"] = []byte("B")
	w := e.do("POST", "/v1/sandboxes/sbx_r/files:rename", `{"from":"/a","to":"/b"}`)
	if w.Code != 409 || errorOf(t, w).Code != "file_exists" {
		t.Errorf("rename onto b: %d %s", w.Code, w.Body)
	}
	w = e.do("POST", "/v1/sandboxes/sbx_r/files:rename", `{"from":"/a","to":"/b","overwrite":true}`)
	if w.Code != 200 || decodeBody[pathOnly](t, w).Path != "/b" || string(e.m.files["sbx_r\x00/b"]) != "A" {
		t.Errorf("rename with overwrite: %d %s", w.Code, w.Body)
	}
	if w := e.do("POST", "/v1/sandboxes/sbx_r/files:rename", `{"from":"/b"}`); w.Code != 400 || !strings.Contains(w.Body.String(), `"to"`) {
		t.Errorf("no target: %d %s", w.Code, w.Body)
	}
	e.m.add("key_a", "sbx_p", sandbox.StatePaused, time.Hour)
	if w := e.do("POST", "/v1/sandboxes/sbx_p/files:rename", `{"from":"/a","to":"/c"}`); w.Code != 409 {
		t.Errorf("paused sandbox: %d %s", w.Code, w.Body)
	}
}

func TestArchiveRoutes(t *testing.T) {
	e := newEnv(t)
	e.m.add("key_a", "sbx_r", sandbox.StateRunning, time.Hour)
	w := e.do("GET", "/v1/sandboxes/sbx_r/files/archive?path=/workspace/p&gzip=false&exclude=node_modules&exclude=.git&user=root", "")
	if w.Code != 200 || w.Header().Get("Content-Type") != "application/x-tar" || w.Body.Len() != 100_000 {
		t.Fatalf("archive: %d %v %d bytes", w.Code, w.Header(), w.Body.Len())
	}
	if want := `/workspace/p user="root" gzip=false exclude=["node_modules" ".git"]`; e.m.arch.archive != want {
		t.Errorf("guest was asked %s, want %s", e.m.arch.archive, want)
	}
	w = e.do("GET", "/v1/sandboxes/sbx_r/files/archive?path=/workspace/p", "")
	if w.Code != 200 || w.Header().Get("Content-Type") != "application/gzip" || !strings.Contains(e.m.arch.archive, `user="" gzip=true`) {
		t.Errorf("default archive: %d %v %s", w.Code, w.Header(), e.m.arch.archive)
	}
	for _, q := range []string{"", "path=/p&user=admin", "path=/p&gzip=maybe", "path=/p&exclude=/abs"} {
		if w := e.do("GET", "/v1/sandboxes/sbx_r/files/archive?"+q, ""); w.Code != 400 {
			t.Errorf("archive?%s: %d %s", q, w.Code, w.Body)
		}
	}

	w = e.do("PUT", "/v1/sandboxes/sbx_r/files/archive?path=/workspace/in&user=sandbox", "TARBYTES")
	if w.Code != 200 || string(e.m.arch.unpacked) != "TARBYTES" || e.m.arch.unpackTo != `/workspace/in user=""` {
		t.Errorf("unarchive: %d %s, guest got %q into %s", w.Code, w.Body, e.m.arch.unpacked, e.m.arch.unpackTo)
	}
	if got := decodeBody[unpackedJSON](t, w); got.Entries != 3 || got.Bytes != 8 || got.Path != "/workspace/in" {
		t.Errorf("unarchive answer %+v", got)
	}
	e.m.arch.unpackErr = errdefs.New(errdefs.ErrInvalidArgument, "unsafe_archive", "entry \"../x\" leaves the directory")
	if w := e.do("PUT", "/v1/sandboxes/sbx_r/files/archive?path=/workspace/in", "TAR"); w.Code != 400 || errorOf(t, w).Code != "unsafe_archive" {
		t.Errorf("unsafe archive: %d %s", w.Code, w.Body)
	}
	if w := e.do("PUT", "/v1/sandboxes/sbx_r/files/archive?path=/workspace/in", strings.Repeat("x", 1<<20+1)); w.Code != 413 {
		t.Errorf("over 1 MiB: %d", w.Code)
	}
}

// An archive that fails part way must not look complete: the connection
// breaks instead of the body ending.
func TestArchiveCutBreaksConnection(t *testing.T) {
	e := newEnv(t)
	e.m.add("key_a", "sbx_r", sandbox.StateRunning, time.Hour)
	e.m.arch.cutAfter = 5000
	srv := httptest.NewServer(e.s)
	defer srv.Close()
	req, _ := http.NewRequest("GET", srv.URL+"/v1/sandboxes/sbx_r/files/archive?path=/p", nil)
	req.Header.Set("Authorization", "Bearer secret-a")
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 || err == nil || errors.Is(err, io.EOF) {
		t.Fatalf("status %d, %d bytes, err %v: want a broken body", resp.StatusCode, len(body), err)
	}
}
