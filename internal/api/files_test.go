package api

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/emberbox/emberbox/internal/sandbox"
)

func TestFileContent(t *testing.T) {
	e := newEnv(t)
	e.m.add("key_a", "sbx_r", sandbox.StateRunning, time.Hour)
	w := e.do("PUT", "/v1/sandboxes/sbx_r/files/content?path=%2Fworkspace%2Fa+b.sh&mode=755", "echo hi\n",
		"Content-Type", "application/octet-stream")
	if w.Code != 200 || e.m.lastMode != 0o755 {
		t.Fatalf("put: %d %s, mode %o", w.Code, w.Body, e.m.lastMode)
	}
	w = e.do("GET", "/v1/sandboxes/sbx_r/files/content?path=/workspace/a%20b.sh", "")
	sum := sha256.Sum256([]byte("echo hi\n"))
	for k, want := range map[string]string{
		"Content-Type":     "application/octet-stream",
		"x-content-length": "8",
		"x-content-sha256": hex.EncodeToString(sum[:]),
	} {
		if got := w.Header().Get(k); got != want {
			t.Errorf("%s = %q, want %q", k, got, want)
		}
	}
	if w.Body.String() != "echo hi\n" {
		t.Errorf("body %q", w.Body)
	}
	big := strings.Repeat("x", 2<<20)
	e.m.files["sbx_r\x00/big"] = []byte(big)
	w = e.do("GET", "/v1/sandboxes/sbx_r/files/content?path=/big", "")
	if w.Header().Get("x-content-length") != strconv.Itoa(len(big)) || w.Header().Get("x-content-sha256") != "" || w.Body.Len() != len(big) {
		t.Errorf("big file: headers %v, %d bytes", w.Header(), w.Body.Len())
	}
	if w := e.do("GET", "/v1/sandboxes/sbx_r/files/content?path=/missing", ""); w.Code != 404 || errorOf(t, w).Code != "file_not_found" {
		t.Errorf("missing: %d %s", w.Code, w.Body)
	}
	if w := e.do("GET", "/v1/sandboxes/sbx_r/files/content", ""); w.Code != 400 {
		t.Errorf("no path: %d", w.Code)
	}
	w = e.do("PUT", "/v1/sandboxes/sbx_r/files/content?path=/huge", strings.Repeat("x", 1<<20+1))
	if w.Code != 413 || errorOf(t, w).Code != "too_large" {
		t.Errorf("huge: %d %s", w.Code, w.Body)
	}
	if w := e.do("PUT", "/v1/sandboxes/sbx_r/files/content?path=/m&mode=999", "x"); w.Code != 400 {
		t.Errorf("bad mode: %d", w.Code)
	}
	if w := e.do("PUT", "/v1/sandboxes/sbx_r/files/content?path=/exact", strings.Repeat("x", 1<<20)); w.Code != 200 {
		t.Errorf("exactly 1 MiB: %d", w.Code)
	}
}

func TestJSONBodyLimit(t *testing.T) {
	e := newEnv(t)
	w := e.do("POST", "/v1/sandboxes", `{"name":"`+strings.Repeat("x", 1<<20)+`"}`)
	if w.Code != 413 || errorOf(t, w).Code != "too_large" {
		t.Errorf("got %d %s", w.Code, w.Body)
	}
}

func TestFileStatListMkdirRemove(t *testing.T) {
	e := newEnv(t)
	e.m.add("key_a", "sbx_r", sandbox.StateRunning, time.Hour)
	e.m.files["sbx_r\x00/workspace/f"] = []byte("abc")
	w := e.do("GET", "/v1/sandboxes/sbx_r/files/stat?path=/workspace/f", "")
	got := decodeBody[map[string]any](t, w)
	if got["exists"] != true || got["size"] != 3.0 || got["type"] != "file" {
		t.Errorf("stat: %v", got)
	}
	w = e.do("GET", "/v1/sandboxes/sbx_r/files/stat?path=/workspace/none", "")
	if w.Code != 200 || strings.TrimSpace(w.Body.String()) != `{"exists":false}` {
		t.Errorf("stat missing: %d %s", w.Code, w.Body)
	}
	if w := e.do("GET", "/v1/sandboxes/sbx_gone/files/stat?path=/x", ""); w.Code != 404 {
		t.Errorf("stat in a missing sandbox: %d %s", w.Code, w.Body)
	}
	w = e.do("GET", "/v1/sandboxes/sbx_r/files/list?path=/workspace&depth=2&hidden=true&limit=10", "")
	var list struct {
		Data []map[string]any `json:"data"`
	}
	if err := json.Unmarshal(w.Body.Bytes(), &list); err != nil || len(list.Data) != 1 || list.Data[0]["path"] != "/workspace/a" {
		t.Errorf("list: %d %s", w.Code, w.Body)
	}
	for _, q := range []string{"depth=0", "limit=0", "hidden=perhaps"} {
		if w := e.do("GET", "/v1/sandboxes/sbx_r/files/list?path=/w&"+q, ""); w.Code != 400 {
			t.Errorf("list %s: %d", q, w.Code)
		}
	}
	if w := e.do("POST", "/v1/sandboxes/sbx_r/files:mkdir", `{"path":"/workspace/d","parents":true}`); w.Code != 200 {
		t.Errorf("mkdir: %d %s", w.Code, w.Body)
	}
	if w := e.do("POST", "/v1/sandboxes/sbx_r/files:mkdir", `{"parents":true}`); w.Code != 400 {
		t.Errorf("mkdir without path: %d", w.Code)
	}
	for _, want := range []string{`{"removed":true}`, `{"removed":false}`} {
		w := e.do("POST", "/v1/sandboxes/sbx_r/files:remove", `{"path":"/workspace/f","recursive":false}`)
		if strings.TrimSpace(w.Body.String()) != want {
			t.Errorf("remove: %s, want %s", w.Body, want)
		}
	}
}
