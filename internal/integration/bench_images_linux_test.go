package integration

import (
	"fmt"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// BenchmarkImages times the three ways to build an image through the API
// and what a sandbox of one costs to create: a recipe with a pip package
// (cold, then again from the step cache), a two-stage Dockerfile, an
// import of an uploaded OCI layout of Debian minbase, and creates until
// the first output of "echo hi" from the default image against the recipe
// image. It reports figures and asserts nothing about time.
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
		custom := createTimes(b, c, map[string]any{"image": "bench-recipe"}, 3)
		oci := createTimes(b, c, map[string]any{"image": "bench-oci"}, 3)

		b.ReportMetric(cold, "recipe-build-s")
		b.ReportMetric(cached, "recipe-cached-build-s")
		b.ReportMetric(docker, "dockerfile-build-s")
		b.ReportMetric(upload, "oci-upload-s")
		b.ReportMetric(imported, "oci-import-s")
		b.ReportMetric(percentile(def, 50), "create-default-p50-ms")
		b.ReportMetric(percentile(custom, 50), "create-recipe-image-p50-ms")
		b.ReportMetric(percentile(oci, 50), "create-oci-image-p50-ms")
	}
}
