package integration

import (
	"fmt"
	"path/filepath"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// BenchmarkImages times the three ways to build an image through the API
// and what a sandbox of one costs to create: a recipe with a pip package
// (cold, then again from the step cache), a two-stage Dockerfile, an
// import of an uploaded OCI layout of Debian minbase, and creates until
// the first output of "echo hi" from the default image against the recipe
// and the imported image: the first create of each (a cold boot, its
// template built beside it) and creates once their templates are built.
// It reports figures and asserts nothing about time.
//
//	go test -run '^$' -bench BenchmarkImages -benchtime 1x -timeout 60m ./internal/integration/
func BenchmarkImages(b *testing.B) {
	s := startServer(b, b.TempDir())
	c := s.client(s.AdminKey)
	timed := func(body map[string]any) (map[string]any, float64) {
		start := time.Now()
		img := buildImage(b, c, body)
		return img, time.Since(start).Seconds()
	}
	for i := range b.N {
		recipe := map[string]any{"pip": []string{"tabulate==0.9.0"}, "files": []map[string]string{{"path": "/opt/bench.txt", "content": fmt.Sprint(i)}}}
		_, cold := timed(map[string]any{"name": "bench-recipe", "recipe": recipe})
		_, cached := timed(map[string]any{"name": "bench-recipe", "recipe": recipe})
		_, docker := timed(map[string]any{"name": "bench-docker", "dockerfile": fmt.Sprintf(
			"ARG N=%d\nFROM default AS one\nARG N\nRUN echo $N > /tmp/n\nFROM default\nCOPY --from=one /tmp/n /opt/n\nRUN cat /opt/n\n", i)})

		dir := writeLayout(b, debianImage(b, debianFixture(b), v1.Config{Cmd: []string{"bash"}}))
		start := time.Now()
		ref := uploadChunks(b, c, tarDir(b, dir))
		upload := time.Since(start).Seconds()
		_, imported := timed(map[string]any{"name": "bench-oci", "archive": ref})

		def := createTimes(b, c, map[string]any{}, 3)
		// A custom image's first create boots (its template is built
		// beside it); once the template is there, creates restore it.
		customFirst := createTimes(b, c, map[string]any{"image": "bench-recipe"}, 1)
		waitImageTemplates(b, s, 1)
		ociFirst := createTimes(b, c, map[string]any{"image": "bench-oci"}, 1)
		waitImageTemplates(b, s, 2)
		custom := templateCreateTimes(b, c, map[string]any{"image": "bench-recipe"}, 3)
		oci := templateCreateTimes(b, c, map[string]any{"image": "bench-oci"}, 3)

		b.ReportMetric(cold, "recipe-build-s")
		b.ReportMetric(cached, "recipe-cached-build-s")
		b.ReportMetric(docker, "dockerfile-build-s")
		b.ReportMetric(upload, "oci-upload-s")
		b.ReportMetric(imported, "oci-import-s")
		b.ReportMetric(percentile(def, 50), "create-default-p50-ms")
		b.ReportMetric(customFirst[0], "create-recipe-image-first-ms")
		b.ReportMetric(percentile(custom, 50), "create-recipe-image-template-p50-ms")
		b.ReportMetric(ociFirst[0], "create-oci-image-first-ms")
		b.ReportMetric(percentile(oci, 50), "create-oci-image-template-p50-ms")
	}
}

// waitImageTemplates waits until n custom images' templates are built.
func waitImageTemplates(b *testing.B, s *server, n int) {
	b.Helper()
	ok := waitUntil(5*time.Minute, 200*time.Millisecond, func() bool {
		m, _ := filepath.Glob(filepath.Join(s.DataDir, "templates", "images", "*", "*", "*", "template.ok"))
		return len(m) >= n
	})
	if !ok {
		b.Fatalf("%d image templates were not built in 5 minutes; log:\n%s", n, s.logTail(30))
	}
}

// templateCreateTimes is createTimes for creates that must be made from a
// template (their ready event says so).
func templateCreateTimes(b *testing.B, c *client, body map[string]any, n int) []float64 {
	return createTimes(b, c, body, n, func(id string) {
		if tpl, _ := readyEvent(b, c, id)["template"].(bool); !tpl {
			b.Fatalf("a create of %v after its template was built booted", body["image"])
		}
	})
}
