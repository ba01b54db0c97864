package integration

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

// TestImageImportAPI imports OCI images through the API, the two ways a
// tenant has: an OCI layout uploaded as a tar in chunks (POST /v1/images
// {archive}), and a registry reference, here as a Dockerfile's FROM of an
// in-process registry on loopback (reachable because the server runs with
// --registry-allow-private; without it such a pull is refused, as the
// ociimage unit tests show). Each image boots and runs commands as user.
func TestImageImportAPI(t *testing.T) {
	needVMs(t)
	fixture := debianFixture(t)
	s := startServerArgs(t, t.TempDir(), []string{"--registry-allow-private"})
	c := s.client(s.AdminKey)

	top := tarLayer(t, map[string]string{
		"etc/.wh.issue.net":   "",
		"etc/emberbox-import": "imported\n",
	})
	img := debianImage(t, fixture, v1.Config{Env: []string{"GREETING=oci"}, Cmd: []string{"bash"}}, top)

	// 0. A poisoned copy first, under the same name: the genuine config
	// with other bytes for its top layer. Refused naming the layer and
	// both digests (before any VM); the genuine import below then boots
	// its own disk.
	evilTop := tarLayer(t, map[string]string{
		"etc/.wh.issue.net":   "",
		"etc/emberbox-import": "backdoored\n",
	})
	poisoned := poisonedImage(t, img, evilTop)
	begin := time.Now()
	failed, state := runBuild(t, c, map[string]any{"name": "oci-archive", "archive": uploadChunks(t, c, tarDir(t, writeLayout(t, poisoned)))})
	t.Logf("poisoned OCI layout refused in %s", time.Since(begin).Round(time.Millisecond))
	wantTop, _ := top.DiffID()
	gotTop, _ := evilTop.DiffID()
	msg, _ := failed["error"].(string)
	if state != "failed" || !strings.Contains(msg, "layer 1 of 2") || !strings.Contains(msg, wantTop.String()) ||
		!strings.Contains(msg, gotTop.String()) {
		t.Errorf("the poisoned import is %s: %q; want failed naming layer 1, %s and %s", state, msg, wantTop, gotTop)
	}

	// 1. An OCI layout, packed as a plain tar and uploaded in 1 MiB chunks.
	layoutDir := writeLayout(t, img)
	archive := tarDir(t, layoutDir)
	begin = time.Now()
	ref := uploadChunks(t, c, archive)
	t.Logf("uploaded a %d MiB OCI layout in %d chunks in %s", len(archive)>>20, len(ref["chunks"].([]string)),
		time.Since(begin).Round(time.Millisecond))
	begin = time.Now()
	imported := buildImage(t, c, map[string]any{"name": "oci-archive", "archive": ref})
	t.Logf("import of the uploaded archive: %s", time.Since(begin).Round(time.Second))

	created := time.Now()
	sb := c.createRunning(t, map[string]any{"image": "oci-archive"})
	t.Logf("create from the imported image until running: %s", time.Since(created).Round(time.Millisecond))
	out := c.sh(t, sb.ID, `whoami; cat /etc/emberbox-import; test -e /etc/issue.net && echo present || echo whited-out; echo "$GREETING"; cat /etc/debian_version`)
	if lines := strings.Split(out, "\n"); len(lines) < 5 || lines[0] != "user" || lines[1] != "imported" ||
		lines[2] != "whited-out" || lines[3] != "oci" || !strings.HasPrefix(lines[4], "12.") {
		t.Errorf("in a sandbox of the imported archive: %q", out)
	}
	c.raw(t, "DELETE", "/v1/sandboxes/"+sb.ID, nil, nil, requestTimeout)

	// 2. The same image in a registry, named by a Dockerfile's FROM.
	reg := httptest.NewServer(registry.New())
	defer reg.Close()
	host := strings.TrimPrefix(reg.URL, "http://")
	tag, err := name.NewTag(host + "/emberbox/debian:test")
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(tag, img); err != nil {
		t.Fatal(err)
	}
	begin = time.Now()
	built := buildImage(t, c, map[string]any{"name": "oci-from", "dockerfile": fmt.Sprintf(
		"FROM %s\nRUN echo \"built on $(cat /etc/emberbox-import)\" > /etc/emberbox-built\n", tag.String())})
	t.Logf("Dockerfile FROM a registry image (import + one RUN): %s", time.Since(begin).Round(time.Second))
	if built["digest"] == imported["digest"] {
		t.Errorf("a build on the import has the import's digest %v", built["digest"])
	}
	sb = c.createRunning(t, map[string]any{"image": "oci-from"})
	if out := c.sh(t, sb.ID, "whoami; cat /etc/emberbox-built"); out != "user\nbuilt on imported\n" {
		t.Errorf("in a sandbox of the Dockerfile on the registry image: %q", out)
	}
	c.raw(t, "DELETE", "/v1/sandboxes/"+sb.ID, nil, nil, requestTimeout)
}

// tarDir packs dir (an OCI layout) into a plain tar.
func tarDir(t testing.TB, dir string) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || path == dir {
			return err
		}
		rel, _ := filepath.Rel(dir, path)
		info, err := d.Info()
		if err != nil {
			return err
		}
		h, err := tar.FileInfoHeader(info, "")
		if err != nil {
			return err
		}
		h.Name = filepath.ToSlash(rel)
		if d.IsDir() {
			h.Name += "/"
		}
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if d.Type().IsRegular() {
			f, err := os.Open(path)
			if err != nil {
				return err
			}
			defer f.Close()
			_, err = io.Copy(tw, f)
			return err
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// uploadChunks sends data as the SDK sends a context (missing chunks by
// digest, then PUT each) and returns the archive reference a build names.
func uploadChunks(t testing.TB, c *client, data []byte) map[string]any {
	t.Helper()
	const chunk = 1 << 20
	var digests []string
	for at := 0; at < len(data); at += chunk {
		sum := sha256.Sum256(data[at:min(at+chunk, len(data))])
		digests = append(digests, hex.EncodeToString(sum[:]))
	}
	missing, _ := call[struct {
		Missing []string `json:"missing"`
	}](t, c, "POST", "/v1/images/context/missing", map[string]any{"digests": digests}, nil)
	want := map[string]bool{}
	for _, d := range missing.Missing {
		want[d] = true
	}
	for i, d := range digests {
		if !want[d] {
			continue
		}
		r := c.raw(t, "PUT", "/v1/images/context/"+d, data[i*chunk:min((i+1)*chunk, len(data))], nil, time.Minute)
		if r.Status/100 != 2 {
			t.Fatalf("uploading chunk %d: %v", i, r)
		}
	}
	sum := sha256.Sum256(data)
	return map[string]any{"sha256": hex.EncodeToString(sum[:]), "size": len(data), "chunks": digests}
}

// poisonedImage is img's config with other bytes for its top layer: what
// a tenant would pack to pass a backdoored disk off as a known image.
func poisonedImage(t testing.TB, img v1.Image, top v1.Layer) v1.Image {
	t.Helper()
	layers, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	bad, err := mutate.AppendLayers(empty.Image, append(layers[:len(layers)-1:len(layers)-1], top)...)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if bad, err = mutate.ConfigFile(bad, cf); err != nil {
		t.Fatal(err)
	}
	want, _ := img.ConfigName()
	if got, _ := bad.ConfigName(); got != want {
		t.Fatalf("the poisoned image's config is %s, not the genuine %s", got, want)
	}
	return bad
}

// buildImage queues a build and waits until it is ready, failing the test
// with its log's tail otherwise.
func buildImage(t testing.TB, c *client, body map[string]any) map[string]any {
	t.Helper()
	img, state := runBuild(t, c, body)
	if state != "ready" {
		logs := c.raw(t, "GET", "/v1/images/"+img["id"].(string)+"/logs", nil, nil, requestTimeout)
		t.Fatalf("image %s is %s (%v): log %s", img["id"], state, img["error"], tail(string(logs.Body), 4000))
	}
	return img
}

// runBuild queues a build and waits until it is neither queued nor
// building; it returns the image and its state.
func runBuild(t testing.TB, c *client, body map[string]any) (map[string]any, string) {
	t.Helper()
	r := c.raw(t, "POST", "/v1/images", body, nil, requestTimeout)
	if r.err != nil || r.Status != http.StatusCreated {
		t.Fatalf("POST /v1/images: %v", r)
	}
	var img map[string]any
	if err := json.Unmarshal(r.Body, &img); err != nil {
		t.Fatal(err)
	}
	id := img["id"].(string)
	var state string
	waitUntil(30*time.Minute, 2*time.Second, func() bool {
		img, _ = call[map[string]any](t, c, "GET", "/v1/images/"+id, nil, nil)
		state, _ = img["state"].(string)
		return state != "queued" && state != "building"
	})
	img["id"] = id
	return img, state
}
