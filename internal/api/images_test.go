package api

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/emberbox/emberbox/internal/catalog"
	"github.com/emberbox/emberbox/internal/store"
)

// testBuilder writes a file of the recipe's first command as the disk;
// a command "fail" fails, "wait" waits for release.
type testBuilder struct{ release chan struct{} }

func (b *testBuilder) Build(ctx context.Context, job catalog.Job, log catalog.LogSink) (catalog.Result, error) {
	cmd := "x"
	if job.Recipe != nil && len(job.Recipe.Commands) > 0 {
		cmd = job.Recipe.Commands[0]
	}
	log.Line("build", "step 1/1 RUN "+cmd)
	if cmd == "fail" {
		return catalog.Result{}, &stepError{"step 1/1 RUN fail: exit 1"}
	}
	if cmd == "wait" {
		select {
		case <-b.release:
		case <-ctx.Done():
			return catalog.Result{}, ctx.Err()
		}
	}
	p := filepath.Join(job.WorkDir, "rootfs.img")
	if err := os.WriteFile(p, []byte(cmd), 0o600); err != nil {
		return catalog.Result{}, err
	}
	sum := sha256.Sum256([]byte(cmd))
	return catalog.Result{RootfsPath: p, Digest: "sha256:" + hex.EncodeToString(sum[:]), MinDiskMiB: 5000,
		Env: map[string]string{"IMG": "1", "BOTH": "image"}}, nil
}

type stepError struct{ s string }

func (e *stepError) Error() string { return e.s }

// newTestImages is a catalog over a real store in a temporary directory,
// building with b (nil: no builds run).
func newTestImages(tb testing.TB, b catalog.Builder) *catalog.Service {
	tb.Helper()
	return newTestImagesWith(tb, b, catalog.ChunkLimits{})
}

// newTestImagesWith is newTestImages with these context chunk limits.
func newTestImagesWith(tb testing.TB, b catalog.Builder, chunks catalog.ChunkLimits) *catalog.Service {
	tb.Helper()
	dir := tb.TempDir()
	st, err := store.Open(context.Background(), filepath.Join(dir, "db"))
	if err != nil {
		tb.Fatal(err)
	}
	def := filepath.Join(dir, "default.img")
	if err := os.WriteFile(def, []byte("default"), 0o644); err != nil {
		tb.Fatal(err)
	}
	svc, err := catalog.New(catalog.Config{Store: catalog.Store{ImageRecords: st, ImageTags: st, ImageHolders: st, BuildLogs: st}, Builder: b, DataDir: dir, DefaultRootfs: def, DefaultDigest: strings.Repeat("d", 64),
		Chunks: chunks})
	if err != nil {
		tb.Fatal(err)
	}
	if err := svc.Recover(context.Background()); err != nil {
		tb.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	if b != nil {
		wg.Go(func() { svc.Run(ctx) })
	}
	tb.Cleanup(func() { cancel(); wg.Wait(); st.Close() })
	return svc
}

func newImagesEnv(t *testing.T) (*testEnv, *testBuilder) {
	e := newEnv(t)
	b := &testBuilder{release: make(chan struct{})}
	e.s.images = newTestImages(t, b)
	return e, b
}

// imageOut reads an image answer (jsonTime only writes).
type imageOut struct {
	imageJSON
	CreatedAt string  `json:"createdAt"`
	ReadyAt   *string `json:"readyAt"`
}

func decodeImage(t *testing.T, w *httptest.ResponseRecorder) imageOut {
	t.Helper()
	var img imageOut
	if err := json.Unmarshal(w.Body.Bytes(), &img); err != nil {
		t.Fatalf("%s: %v", w.Body, err)
	}
	return img
}

func (e *testEnv) waitImage(id string) imageOut {
	e.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		w := e.do("GET", "/v1/images/"+id, "")
		if w.Code != 200 {
			e.t.Fatalf("get image: %d %s", w.Code, w.Body)
		}
		img := decodeImage(e.t, w)
		if img.State != "queued" && img.State != "building" {
			return img
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("image %s still %s", id, img.State)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestImageRoutes(t *testing.T) {
	e, _ := newImagesEnv(t)
	w := e.do("POST", "/v1/images", `{"recipe":{"pip":["x"],"run":["echo 1"]},"name":"app","labels":{"team":"a"},"env":{"A":"1"},
		"start":{"command":"serve","readyPort":8000},"build":{"timeoutSeconds":600,"cacheMiB":10}}`)
	if w.Code != http.StatusCreated {
		t.Fatalf("create: %d %s", w.Code, w.Body)
	}
	img := decodeImage(t, w)
	if img.State != "queued" || img.Source != "recipe" || img.Version != 1 || !uuidLike(img.ID) {
		t.Fatalf("created %+v", img)
	}
	img = e.waitImage(img.ID)
	if img.State != "ready" || img.DiskMiB != 5000 || img.Env["A"] != "1" || img.Env["IMG"] != "1" ||
		img.Start == nil || img.Start.ReadyPort != 8000 || img.Labels["team"] != "a" || len(img.Tags) != 1 {
		t.Fatalf("ready %+v", img)
	}

	// resolve, list, tag, untag
	if w := e.do("GET", "/v1/images/resolve?ref=app:latest", ""); w.Code != 200 || decodeImage(t, w).ID != img.ID {
		t.Errorf("resolve: %d %s", w.Code, w.Body)
	}
	if w := e.do("GET", "/v1/images/resolve?ref=nope", ""); w.Code != 404 || errorOf(t, w).Code != "image_not_found" {
		t.Errorf("resolve unknown: %d %s", w.Code, w.Body)
	}
	if w := e.do("GET", "/v1/images/resolve", ""); w.Code != 400 || issuesOf(t, w)[0].Path != "ref" {
		t.Errorf("resolve without ref: %d %s", w.Code, w.Body)
	}
	w = e.do("GET", "/v1/images?name=app&limit=1", "")
	var list struct {
		Data       []imageOut `json:"data"`
		NextCursor *string    `json:"nextCursor"`
	}
	if err := json.Unmarshal(w.Body.Bytes(), &list); err != nil || len(list.Data) != 1 || list.Data[0].ID != img.ID {
		t.Errorf("list: %s", w.Body)
	}
	if w := e.do("GET", "/v1/images?limit=0", ""); w.Code != 400 {
		t.Errorf("limit 0: %d", w.Code)
	}
	if w := e.do("POST", "/v1/images/"+img.ID+":tag", `{"tag":"prod"}`); w.Code != 200 || len(decodeImage(t, w).Tags) != 2 {
		t.Errorf("tag: %d %s", w.Code, w.Body)
	}
	if w := e.do("POST", "/v1/images/"+img.ID+":tag", `{"tag":"no good"}`); w.Code != 400 || errorOf(t, w).Code != "invalid_request" {
		t.Errorf("bad tag: %d %s", w.Code, w.Body)
	}
	if w := e.do("POST", "/v1/images/"+img.ID+":untag", `{"tag":"prod"}`); w.Code != 200 || len(decodeImage(t, w).Tags) != 1 {
		t.Errorf("untag: %d %s", w.Code, w.Body)
	}
	// another key sees nothing of it
	if w := e.do("GET", "/v1/images/"+img.ID, "", "Authorization", "Bearer secret-b"); w.Code != 404 || errorOf(t, w).Code != "image_not_found" {
		t.Errorf("key b reads it: %d %s", w.Code, w.Body)
	}

	// the log, as a page and followed
	w = e.do("GET", "/v1/images/"+img.ID+"/logs?after=0", "")
	var page struct {
		Lines     []struct{ Seq int64 } `json:"lines"`
		NextAfter int64                 `json:"nextAfter"`
		Done      bool                  `json:"done"`
	}
	if err := json.Unmarshal(w.Body.Bytes(), &page); err != nil || !page.Done || len(page.Lines) < 3 || page.NextAfter != page.Lines[len(page.Lines)-1].Seq {
		t.Errorf("logs: %s", w.Body)
	}
	w = e.do("GET", "/v1/images/"+img.ID+"/logs?after=1&follow=true", "")
	events := ndjsonEvents(t, w)
	if len(events) < 2 || events[0]["type"] != "line" || events[0]["seq"].(float64) != 2 || events[len(events)-1]["type"] != "done" {
		t.Errorf("follow: %s", w.Body)
	}

	// the sandbox create: image resolved, env merged, disk raised, start reported
	w = e.do("POST", "/v1/sandboxes", `{"image":"app","env":{"BOTH":"create"}}`)
	if w.Code != 200 {
		t.Fatalf("create from image: %d %s", w.Code, w.Body)
	}
	spec := e.m.lastSpec
	if spec.Image == nil || spec.Image.ID != img.ID || spec.DiskMiB != 5000 || spec.Env["IMG"] != "1" || spec.Env["BOTH"] != "create" {
		t.Errorf("spec %+v image %+v", spec, spec.Image)
	}
	e.m.lastSpec.Image = nil
	if w := e.do("POST", "/v1/sandboxes", `{"image":"default"}`); w.Code != 200 || e.m.lastSpec.Image != nil {
		t.Errorf("default image: %d %+v", w.Code, e.m.lastSpec.Image)
	}
	if w := e.do("POST", "/v1/sandboxes", `{"image":"nope:1"}`); w.Code != 404 || errorOf(t, w).Code != "image_not_found" {
		t.Errorf("unknown image: %d %s", w.Code, w.Body)
	}
	if w := e.do("POST", "/v1/sandboxes", `{"image":7}`); w.Code != 400 || issuesOf(t, w)[0].Path != "image" {
		t.Errorf("image 7: %d %s", w.Code, w.Body)
	}

	// delete, and its 404 after
	if w := e.do("POST", "/v1/images/"+img.ID+":delete", `{}`); w.Code != 200 || decodeImage(t, w).State != "deleted" {
		t.Errorf("delete: %d %s", w.Code, w.Body)
	}
	if w := e.do("POST", "/v1/images/"+img.ID+":delete", `{}`); w.Code != 404 {
		t.Errorf("delete again: %d %s", w.Code, w.Body)
	}
}

func uuidLike(s string) bool { return len(s) == 36 && strings.Count(s, "-") == 4 }

func ndjsonEvents(t *testing.T, w *httptest.ResponseRecorder) []map[string]any {
	t.Helper()
	if ct := w.Header().Get("Content-Type"); ct != "application/x-ndjson" {
		t.Fatalf("content type %q: %s", ct, w.Body)
	}
	var out []map[string]any
	sc := bufio.NewScanner(strings.NewReader(w.Body.String()))
	for sc.Scan() {
		var ev map[string]any
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			t.Fatalf("line %q: %v", sc.Text(), err)
		}
		out = append(out, ev)
	}
	return out
}

func TestImageErrors(t *testing.T) {
	e, b := newImagesEnv(t)
	// invalid requests name the field
	for body, path := range map[string]string{
		`{}`:                              "image",
		`{"image":"x","name":"Bad Name"}`: "name",
		`{"image":"x","start":{"command":"","readyPort":1}}`: "start.command",
		`{"image":"x","build":{"timeoutSeconds":99999}}`:     "build.timeoutSeconds",
		`{"image":"x","env":{"1A":"x"}}`:                     "env.1A",
		`{"image":"x","nope":1}`:                             "nope",
	} {
		w := e.do("POST", "/v1/images", body)
		if w.Code != 400 || errorOf(t, w).Code != "invalid_request" {
			t.Errorf("%s: %d %s", body, w.Code, w.Body)
			continue
		}
		if is := issuesOf(t, w); len(is) == 0 || is[0].Path != path {
			t.Errorf("%s: issues %+v, want %s", body, is, path)
		}
	}
	// a build still running: 409 image_not_ready at create
	w := e.do("POST", "/v1/images", `{"recipe":{"commands":["wait"]},"name":"slow"}`)
	slow := decodeImage(t, w)
	if w := e.do("POST", "/v1/sandboxes", `{"image":"`+slow.ID+`"}`); w.Code != 409 || errorOf(t, w).Code != "image_not_ready" {
		t.Errorf("not ready: %d %s", w.Code, w.Body)
	}
	close(b.release)
	e.waitImage(slow.ID)
	// a failed build says why, and the log keeps the step
	w = e.do("POST", "/v1/images", `{"recipe":{"commands":["fail"]}}`)
	failed := e.waitImage(decodeImage(t, w).ID)
	if failed.State != "failed" || failed.Error == nil || *failed.Error != "step 1/1 RUN fail: exit 1" {
		t.Errorf("failed: %+v", failed)
	}
	// context chunks: missing, put, mismatch, oversize (413)
	data := "chunk"
	sum := sha256.Sum256([]byte(data))
	d := hex.EncodeToString(sum[:])
	if w := e.do("POST", "/v1/images/context/missing", `{"digests":["`+d+`"]}`); w.Code != 200 || !strings.Contains(w.Body.String(), d) {
		t.Errorf("missing: %d %s", w.Code, w.Body)
	}
	if w := e.do("POST", "/v1/images/context/missing", `{"digests":["zz"]}`); w.Code != 400 {
		t.Errorf("bad digest: %d %s", w.Code, w.Body)
	}
	if w := e.do("PUT", "/v1/images/context/"+d, "other"); w.Code != 400 || errorOf(t, w).Code != "digest_mismatch" {
		t.Errorf("mismatch: %d %s", w.Code, w.Body)
	}
	if w := e.do("PUT", "/v1/images/context/"+d, strings.Repeat("x", 1<<20+1)); w.Code != 413 {
		t.Errorf("oversize: %d %s", w.Code, w.Body)
	}
	if w := e.do("PUT", "/v1/images/context/"+d, data); w.Code != 200 {
		t.Errorf("put: %d %s", w.Code, w.Body)
	}
	if w := e.do("POST", "/v1/images/context/missing", `{"digests":["`+d+`"]}`); w.Code != 200 || strings.Contains(w.Body.String(), d) {
		t.Errorf("missing after put: %d %s", w.Code, w.Body)
	}
	// the default image is public and not deletable
	w = e.do("GET", "/v1/images/resolve?ref=default", "", "Authorization", "Bearer secret-b")
	def := decodeImage(t, w)
	if w.Code != 200 || !def.Public || def.Source != "default" {
		t.Errorf("default: %d %s", w.Code, w.Body)
	}
	if w := e.do("POST", "/v1/images/"+def.ID+":delete", `{}`); w.Code != 403 {
		t.Errorf("delete default: %d %s", w.Code, w.Body)
	}
	if w := e.do("GET", "/v1/images/not-a-uuid", ""); w.Code != 404 || errorOf(t, w).Code != "image_not_found" {
		t.Errorf("bad id: %d %s", w.Code, w.Body)
	}
}

// Without a catalog, image routes answer 501 and a create's image is
// refused by name.
func TestImagesOff(t *testing.T) {
	e := newEnv(t)
	if w := e.do("GET", "/v1/images", ""); w.Code != 501 || errorOf(t, w).Code != "images_unavailable" {
		t.Errorf("list: %d %s", w.Code, w.Body)
	}
	if w := e.do("POST", "/v1/sandboxes", `{"image":"app"}`); w.Code != 400 || issuesOf(t, w)[0].Path != "image" {
		t.Errorf("create: %d %s", w.Code, w.Body)
	}
}

// A follow of a build in progress streams its lines as they come and ends
// with done and the ready image.
func TestImageLogFollowWhileBuilding(t *testing.T) {
	e, b := newImagesEnv(t)
	w := e.do("POST", "/v1/images", `{"recipe":{"commands":["wait"]},"name":"slow"}`)
	id := decodeImage(t, w).ID
	srv := httptest.NewServer(e.s)
	defer srv.Close()
	req, _ := http.NewRequest("GET", srv.URL+"/v1/images/"+id+"/logs?follow=true", nil)
	req.Header.Set("Authorization", "Bearer secret-a")
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	var types []string
	released := false
	for sc.Scan() {
		var ev map[string]any
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			t.Fatalf("line %q: %v", sc.Text(), err)
		}
		types = append(types, ev["type"].(string))
		// The build waits until a line of it was streamed.
		if !released && ev["type"] == "line" && strings.HasPrefix(ev["text"].(string), "step 1/1") {
			released = true
			close(b.release)
		}
		if ev["type"] == "done" {
			img := ev["image"].(map[string]any)
			if img["state"] != "ready" || img["id"] != id {
				t.Errorf("done with %v", img)
			}
		}
	}
	if !released || len(types) < 3 || types[len(types)-1] != "done" {
		t.Errorf("events %v (released %v)", types, released)
	}
}

// Context chunks over HTTP: a key's chunks are invisible to another key,
// and a key over its chunk quota is answered 429 quota_exceeded.
func TestContextChunksPerKey(t *testing.T) {
	e := newEnv(t)
	e.s.images = newTestImagesWith(t, nil, catalog.ChunkLimits{PerKey: 1})
	data := "a's chunk"
	sum := sha256.Sum256([]byte(data))
	d := hex.EncodeToString(sum[:])
	if w := e.do("PUT", "/v1/images/context/"+d, data); w.Code != 200 {
		t.Fatalf("put: %d %s", w.Code, w.Body)
	}
	if w := e.do("POST", "/v1/images/context/missing", `{"digests":["`+d+`"]}`); w.Code != 200 || strings.Contains(w.Body.String(), d) {
		t.Errorf("the owner asking: %d %s", w.Code, w.Body)
	}
	w := e.do("POST", "/v1/images/context/missing", `{"digests":["`+d+`"]}`, "Authorization", "Bearer secret-b")
	if w.Code != 200 || !strings.Contains(w.Body.String(), d) {
		t.Errorf("another key asking about the chunk: %d %s, want it missing", w.Code, w.Body)
	}
	if w := e.do("PUT", "/v1/images/context/"+d, "not a's chunk", "Authorization", "Bearer secret-b"); w.Code != 400 ||
		errorOf(t, w).Code != "digest_mismatch" {
		t.Errorf("bytes under another chunk's digest: %d %s", w.Code, w.Body)
	}
	other := sha256.Sum256([]byte("second"))
	w = e.do("PUT", "/v1/images/context/"+hex.EncodeToString(other[:]), "second")
	if w.Code != http.StatusTooManyRequests || errorOf(t, w).Code != "quota_exceeded" {
		t.Errorf("a second chunk over a quota of one: %d %s", w.Code, w.Body)
	}
	if w := e.do("PUT", "/v1/images/context/"+hex.EncodeToString(other[:]), "second", "Authorization", "Bearer secret-b"); w.Code != 200 {
		t.Errorf("another key's first chunk: %d %s", w.Code, w.Body)
	}
}
