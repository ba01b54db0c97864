package integration

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/emberbox/emberbox/internal/catalog"
	"github.com/emberbox/emberbox/internal/guest"
	"github.com/emberbox/emberbox/internal/guestimage"
	"github.com/emberbox/emberbox/internal/recipebuild"
	"github.com/emberbox/emberbox/internal/sandbox"
	"github.com/emberbox/emberbox/internal/store"
	"github.com/emberbox/emberbox/internal/tsc"
	"github.com/emberbox/emberbox/internal/vmm/qemu"
)

// buildLog is a LogSink that keeps the lines and passes them to the test
// log.
type buildLog struct {
	t     *testing.T
	mu    sync.Mutex
	lines []string
}

func (l *buildLog) Line(stream, text string) {
	l.mu.Lock()
	l.lines = append(l.lines, stream+": "+text)
	l.mu.Unlock()
	l.t.Logf("build %s: %s", stream, text)
}

func (l *buildLog) has(s string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, x := range l.lines {
		if strings.Contains(x, s) {
			return true
		}
	}
	return false
}

// publicDir is a directory the confined VMs' uids can read through.
func publicDir(t *testing.T) string {
	t.Helper()
	d, err := os.MkdirTemp("", "emberbox-imagebuild-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	if err := os.Chmod(d, 0o755); err != nil {
		t.Fatal(err)
	}
	return d
}

// TestImageBuild builds images in real VMs, at the manager level (the
// image catalog's API is built separately): a recipe with a pip package
// and a file, booted and checked; the same recipe again from the cache; a
// failing step; a two-stage Dockerfile with a context and a build arg.
func TestImageBuild(t *testing.T) {
	needVMs(t)
	img, err := guestimage.Lookup(guestimage.Config{})
	if err != nil {
		t.Skipf("no guest image is built: %v", err)
	}
	dir := publicDir(t)
	initrd, err := guestimage.BuildInitrd(img, filepath.Join(binDir, "emberbox-agent"), filepath.Join(dir, "initrd"))
	if err != nil {
		t.Fatal(err)
	}
	khz, _ := tsc.KHz()
	drv, err := qemu.New(qemu.Config{TSCkHz: khz, ProbeKernel: img.Kernel, ProbeCache: filepath.Join(filepath.Dir(img.Dir), "kvm-probe")})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	st, err := store.Open(ctx, filepath.Join(dir, "emberbox.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	// As the server does by default: guests trust the host's CAs too (a
	// proxy between this host and the internet may sign with its own).
	cas, _ := os.ReadFile("/etc/ssl/certs/ca-certificates.crt")
	m := sandbox.New(sandbox.Config{Store: st, Driver: drv, DataDir: dir, BootTimeout: 5 * time.Minute, ExtraCAs: string(cas),
		Boot: sandbox.BootFiles{Kernel: img.Kernel, Initrd: initrd, Rootfs: img.Rootfs}})
	defer m.Close()
	b := recipebuild.New(recipebuild.Config{Manager: m, Snapshots: m.Snapshots, Cache: st, DefaultDigest: img.RecipeHash, MemoryMiB: 2048, DiskMiB: 4096})
	t.Logf("accel %s", drv.Accel())

	newJob := func(kind string) catalog.Job {
		return catalog.Job{ImageID: "img-" + kind, Owner: "key_a", Kind: kind, Cache: true, WorkDir: publicDir(t)}
	}
	// boot creates a sandbox of the image (nil: the default image).
	boot := func(t *testing.T, res *catalog.Result) (string, guest.Handle) {
		t.Helper()
		t0 := time.Now()
		spec := sandbox.CreateSpec{VCPU: 1, MemoryMiB: 1024, DiskMiB: 4096, TimeoutSeconds: 1800, OnLeaseEnd: sandbox.LeaseEndDelete}
		what := "the default image"
		if res != nil {
			what = "the built image"
			spec.DiskMiB, spec.Image = res.MinDiskMiB, &sandbox.ImageRef{ID: "img", Rootfs: res.RootfsPath, MinDiskMiB: res.MinDiskMiB}
		}
		sb, err := m.Create(ctx, "key_a", spec)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _, _ = m.Delete(context.Background(), "key_a", sb.ID) })
		wctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
		defer cancel()
		got, err := m.WaitFor(wctx, "key_a", sb.ID, sandbox.StateRunning, sandbox.StateStopped)
		if err != nil || got.State != sandbox.StateRunning {
			t.Fatalf("a sandbox of the image: %v %+v", err, got)
		}
		t.Logf("create from %s: running in %s", what, time.Since(t0).Round(time.Millisecond))
		_, g, err := m.Guest(ctx, "key_a", sb.ID)
		if err != nil {
			t.Fatal(err)
		}
		return sb.ID, g
	}
	run := func(t *testing.T, g guest.Handle, cmd string) string {
		t.Helper()
		res, err := g.Exec(ctx, guest.ExecRequest{Command: cmd, TimeoutMs: 120_000}, nil)
		if err != nil {
			t.Fatalf("%s: %v", cmd, err)
		}
		if res.ExitCode == nil || *res.ExitCode != 0 {
			t.Fatalf("%s: exit %v: %s %s", cmd, res.ExitCode, res.Stdout, res.Stderr)
		}
		return strings.TrimSpace(string(res.Stdout))
	}

	recipe := func() *catalog.Recipe {
		return &catalog.Recipe{
			Pip:      []string{"tabulate==0.9.0"},
			Files:    []catalog.File{{Path: "/opt/demo/hello.txt", Content: "hello from the recipe\n"}, {Path: "/workspace/notes.txt", Content: "mine\n"}},
			Commands: []string{`python3 -c "import tabulate; print('tabulate', tabulate.__version__)"`},
			Env:      map[string]string{"DEMO": "1"},
		}
	}
	t.Run("recipe", func(t *testing.T) {
		j := newJob(catalog.SourceRecipe)
		j.Recipe = recipe()
		log := &buildLog{t: t}
		t0 := time.Now()
		res, err := b.Build(ctx, j, log)
		if err != nil {
			t.Fatalf("build: %v", err)
		}
		t.Logf("recipe build (cold): %s, digest %s, disk %d MiB, %d MiB allocated", time.Since(t0).Round(time.Millisecond), res.Digest, res.MinDiskMiB, res.SizeBytes>>20)
		if !log.has("stdout: tabulate 0.9.0") {
			t.Error("the log lacks the command's output")
		}
		boot(t, nil) // for its time, beside the image's
		_, g := boot(t, &res)
		if got := run(t, g, `python3 -c "import tabulate; print(tabulate.__version__)"`); got != "0.9.0" {
			t.Errorf("tabulate in the image: %q", got)
		}
		if got := run(t, g, "cat /opt/demo/hello.txt; stat -c %U /workspace/notes.txt; whoami"); got != "hello from the recipe\nuser\nuser" {
			t.Errorf("files in the image: %q", got)
		}

		// The same recipe again: all from the cache.
		j2 := newJob(catalog.SourceRecipe)
		j2.Recipe = recipe()
		log2 := &buildLog{t: t}
		t0 = time.Now()
		res2, err := b.Build(ctx, j2, log2)
		if err != nil {
			t.Fatalf("second build: %v", err)
		}
		t.Logf("recipe build (cached): %s", time.Since(t0).Round(time.Millisecond))
		if res2.Digest != res.Digest || !log2.has("step 3/3 RUN python3") || !log2.has(": cached") || log2.has("build sandbox") {
			t.Errorf("second build: digest %s vs %s; it should have run nothing", res2.Digest, res.Digest)
		}
	})

	t.Run("failing step", func(t *testing.T) {
		j := newJob(catalog.SourceRecipe)
		j.Recipe = &catalog.Recipe{Commands: []string{"echo fine", "echo no-such-package >&2; pip install --no-index emberbox-no-such-package-xyz"}}
		log := &buildLog{t: t}
		_, err := b.Build(ctx, j, log)
		if err == nil || !strings.Contains(err.Error(), "step 2/2 RUN echo no-such-package") || !strings.Contains(err.Error(), "exit code 1") {
			t.Fatalf("build: %v, want step 2/2 failing", err)
		}
		if !log.has("stderr: no-such-package") || !log.has("stderr: ERROR: Could not find") {
			t.Error("the log lacks the failing step's output")
		}
	})

	t.Run("dockerfile", func(t *testing.T) {
		j := newJob(catalog.SourceDockerfile)
		j.Dockerfile = `ARG FLAVOR=plain
FROM default AS builder
ARG FLAVOR
WORKDIR /build
COPY src/ ./
RUN python3 make.py "$FLAVOR" > /build/out.txt

FROM default
ARG FLAVOR
COPY --from=builder /build/out.txt /opt/app/out.txt
COPY config.json /opt/app/
RUN echo "flavor=$FLAVOR" > /opt/app/flavor && chmod 0644 /opt/app/flavor
COPY --chown=user config.json /workspace/mine.json
USER user
RUN whoami > /workspace/who && touch /workspace/by-user
USER root
ENV APP_HOME=/opt/app
WORKDIR /opt/app
CMD ["python3", "-m", "http.server", "8000"]
`
		j.ContextDir = packContext(t, map[string]string{
			"src/make.py":  "import sys\nprint('made with', sys.argv[1])\n",
			"config.json":  `{"ok": true}`,
			"unused/x.txt": "not copied",
		})
		j.BuildArgs = map[string]string{"FLAVOR": "spicy"}
		log := &buildLog{t: t}
		t0 := time.Now()
		res, err := b.Build(ctx, j, log)
		if err != nil {
			t.Fatalf("build: %v", err)
		}
		t.Logf("Dockerfile build (cold): %s", time.Since(t0).Round(time.Millisecond))
		if res.Start == nil || res.Start.Command != "python3 -m http.server 8000" || res.Workdir != "/opt/app" || res.Env["APP_HOME"] != "/opt/app" {
			t.Errorf("result %+v", res)
		}
		_, g := boot(t, &res)
		if got := run(t, g, "cat /opt/app/out.txt /opt/app/config.json /opt/app/flavor; ls /build 2>&1 || true"); !strings.HasPrefix(got, "made with spicy\n{\"ok\": true}flavor=spicy\n") || !strings.Contains(got, "No such file") {
			t.Errorf("the image holds %q", got)
		}
		if got := run(t, g, "stat -c %U:%G /workspace/mine.json /workspace/by-user /opt/app/config.json; cat /workspace/who"); got != "user:user\nuser:user\nroot:root\nuser" {
			t.Errorf("owners and USER: %q", got)
		}
	})
}

// packContext makes a build context (context.tar.gz) of files.
func packContext(t *testing.T, files map[string]string) string {
	t.Helper()
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	tw := tar.NewWriter(zw)
	for name, body := range files {
		if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(body)), Typeflag: tar.TypeReg, ModTime: time.Unix(1700000000, 0)}); err != nil {
			t.Fatal(err)
		}
		tw.Write([]byte(body))
	}
	tw.Close()
	zw.Close()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "context.tar.gz"), buf.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	return dir
}
