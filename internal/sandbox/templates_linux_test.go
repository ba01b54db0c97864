package sandbox_test

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/emberbox/emberbox/internal/agentproto"
	"github.com/emberbox/emberbox/internal/sandbox"
)

// TestTemplateCreate: with templates on, the default shape's template is
// built once (one boot), and creates of that shape are copies of it
// (resumes, no boots) that run commands with their own env; a shape with
// no template boots.
func TestTemplateCreate(t *testing.T) {
	e := newEnv(t)
	// The env's boot timeout is short for its tests of failing boots; a
	// machine loaded by other tests needs more for the template's boot.
	// The manager's log goes to the test's, so a failed template build
	// says why (a build is not retried for templateRetry).
	m := e.managerWith(func(c *sandbox.Config) {
		c.Templates, c.BootTimeout = true, 30*time.Second
		c.Logger = slog.New(slog.NewTextHandler(testLog{t}, &slog.HandlerOptions{Level: slog.LevelWarn}))
	})
	ctx := context.Background()
	m.Templates.Prepare()
	deadline := time.Now().Add(60 * time.Second)
	for e.drv.Starts() < 1 || !m.TemplateReady(sandbox.DefaultVCPU, sandbox.DefaultMemoryMiB, sandbox.DefaultDiskMiB) {
		if time.Now().After(deadline) {
			t.Fatalf("template not built: %d starts", e.drv.Starts())
		}
		time.Sleep(10 * time.Millisecond)
	}
	starts, resumes := e.drv.Starts(), e.drv.Resumes()
	for i := range 2 {
		sb, err := m.Create(ctx, "k", spec())
		if err != nil {
			t.Fatal(err)
		}
		waitState(t, m, "k", sb.ID, sandbox.StateRunning)
		res, err := exec(ctx, m, "k", sb.ID, agentproto.ExecRequest{Command: `echo "$GREETING"`})
		if err != nil || string(res.Stdout) != "hello\n" {
			t.Fatalf("copy %d: %v %+v", i, err, res)
		}
	}
	if e.drv.Starts() != starts || e.drv.Resumes() != resumes+2 {
		t.Errorf("creates made %d boots and %d resumes, want 0 and 2", e.drv.Starts()-starts, e.drv.Resumes()-resumes)
	}
	small := spec()
	small.VCPU, small.MemoryMiB = 1, 1024
	sb, err := m.Create(ctx, "k", small)
	if err != nil {
		t.Fatal(err)
	}
	waitState(t, m, "k", sb.ID, sandbox.StateRunning)
	if e.drv.Starts() < starts+1 {
		t.Errorf("a shape without a template did not boot")
	}
}

// testLog writes a logger's lines to the test's log.
type testLog struct{ t *testing.T }

func (w testLog) Write(p []byte) (int, error) {
	w.t.Helper()
	w.t.Logf("%s", p)
	return len(p), nil
}

// TestImageTemplates: a custom image's first create boots and then starts
// its template's build; later creates of it are copies of that template (the
// image's disk under them), each with its own env. The cap keeps a
// template a sandbox uses and gives the least recently used unused one up
// for a new image's; RemoveTemplates removes a disk's templates.
func TestImageTemplates(t *testing.T) {
	e := newEnv(t)
	m := e.managerWith(func(c *sandbox.Config) {
		c.Templates, c.BootTimeout, c.ImageTemplates = true, 30*time.Second, 1
		c.Boot.Rootfs = "/images/default.img"
		c.Logger = slog.New(slog.NewTextHandler(testLog{t}, &slog.HandlerOptions{Level: slog.LevelInfo}))
	})
	ctx := context.Background()
	app := &sandbox.ImageRef{ID: "img-app", Rootfs: "/images/app.img", MinDiskMiB: 3000}
	web := &sandbox.ImageRef{ID: "img-web", Rootfs: "/images/web.img", MinDiskMiB: 5000}
	of := func(img *sandbox.ImageRef) sandbox.CreateSpec {
		s := spec()
		s.Image, s.DiskMiB = img, max(s.DiskMiB, img.MinDiskMiB)
		return s
	}
	waitReady := func(img *sandbox.ImageRef, disk int) {
		t.Helper()
		deadline := time.Now().Add(60 * time.Second)
		for !m.ImageTemplateReady(img.Rootfs, 2, 4096, disk) {
			if time.Now().After(deadline) {
				t.Fatalf("the template of %s was not built", img.ID)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	// The fake's guests share one agent, so a template build configuring
	// its guest beside a create can clear that create's env: creates that
	// start a build (greeting "") do not check it.
	create := func(img *sandbox.ImageRef, greeting string) *sandbox.Sandbox {
		t.Helper()
		s := of(img)
		s.Env = map[string]string{"GREETING": greeting + "-env"}
		sb, err := m.Create(ctx, "k", s)
		if err != nil {
			t.Fatal(err)
		}
		sb = waitState(t, m, "k", sb.ID, sandbox.StateRunning)
		if greeting != "" {
			res, err := exec(ctx, m, "k", sb.ID, agentproto.ExecRequest{Command: `echo "$GREETING"`})
			if err != nil || string(res.Stdout) != greeting+"-env\n" {
				t.Fatalf("%s: %v %+v", sb.ID, err, res)
			}
		}
		if got := e.drv.Machine(sb.ID).Spec().Rootfs; got != img.Rootfs {
			t.Fatalf("%s runs over %q, want the image's disk %q", sb.ID, got, img.Rootfs)
		}
		return sb
	}

	// No default template is asked for here (Templates.Prepare is not
	// called): every start and resume below is the image's.
	starts, resumes := e.drv.Starts(), e.drv.Resumes()
	first := create(app, "")
	if e.drv.Resumes() != resumes {
		t.Fatalf("the first create of an image resumed a template it cannot have")
	}
	waitReady(app, 4096) // the image's disk is under the default size
	if n := e.drv.Starts() - starts; n != 2 {
		t.Errorf("%d boots, want 2: the first create's and its template's", n)
	}
	starts, resumes = e.drv.Starts(), e.drv.Resumes()
	copies := []*sandbox.Sandbox{create(app, "two"), create(app, "three")}
	if e.drv.Starts() != starts || e.drv.Resumes() != resumes+2 {
		t.Errorf("creates after the template made %d boots and %d resumes, want 0 and 2", e.drv.Starts()-starts, e.drv.Resumes()-resumes)
	}
	appTpl := m.TemplateDir(app.Rootfs, 2, 4096, 4096)
	if b, err := os.ReadFile(filepath.Join(e.dir, "sandboxes", copies[0].ID, "template.use")); err != nil || strings.TrimSpace(string(b)) != appTpl {
		t.Errorf("the copy's directory names its template as %q (%v), want %s", b, err, appTpl)
	}
	if _, err := os.Stat(filepath.Join(e.dir, "sandboxes", first.ID, "template.use")); err == nil {
		t.Errorf("a booted sandbox's directory names a template")
	}

	// Another image, of a larger disk, while the copies run: the cap (1)
	// has no room, as the only template kept is in use, so the create
	// boots and nothing is removed.
	create(web, "web")
	eventually(t, "the cap to stop the build", m.TemplatesFull)
	if !m.ImageTemplateReady(app.Rootfs, 2, 4096, 4096) {
		t.Fatal("the cap removed a template that sandboxes use")
	}
	for _, sb := range copies {
		if _, err := m.Delete(ctx, "k", sb.ID); err != nil {
			t.Fatal(err)
		}
	}
	m.RetryFullTemplates()
	create(web, "") // boots, and then app's template gives way
	eventually(t, "the least recently used unused template to go", func() bool { return !m.ImageTemplateReady(app.Rootfs, 2, 4096, 4096) })
	waitReady(web, 5000)
	resumes = e.drv.Resumes()
	create(web, "web3")
	if e.drv.Resumes() != resumes+1 {
		t.Error("a create of the second image did not copy its template")
	}

	if err := m.Templates.RemoveTemplates(web.Rootfs); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(m.ImageTemplatesDir(web.Rootfs)); !os.IsNotExist(err) {
		t.Errorf("the image's templates are still there: %v", err)
	}
}

// TestImageTemplateQueued: an image's first create while another template
// is being built queues the image's template, which is built once that
// build ends (here: fails, its guest never answering).
func TestImageTemplateQueued(t *testing.T) {
	e := newEnv(t)
	m := e.managerWith(func(c *sandbox.Config) {
		c.Templates, c.BootTimeout = true, 3*time.Second
		c.Logger = slog.New(slog.NewTextHandler(testLog{t}, &slog.HandlerOptions{Level: slog.LevelInfo}))
	})
	ctx := context.Background()
	e.drv.HangStarts(1)
	m.Templates.Prepare() // the default template's build, whose guest hangs
	for e.drv.Starts() < 1 {
		time.Sleep(5 * time.Millisecond)
	}
	app := &sandbox.ImageRef{ID: "img-app", Rootfs: "/images/app.img", MinDiskMiB: 3000}
	s := spec()
	s.Image = app
	sb, err := m.Create(ctx, "k", s)
	if err != nil {
		t.Fatal(err)
	}
	waitState(t, m, "k", sb.ID, sandbox.StateRunning)
	if m.TemplateReady(2, 4096, 4096) {
		t.Fatal("the default template was built by a hung guest")
	}
	deadline := time.Now().Add(60 * time.Second)
	for !m.ImageTemplateReady(app.Rootfs, 2, 4096, 4096) {
		if time.Now().After(deadline) {
			t.Fatal("the image's template, asked for during another build, was never built")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// eventually waits up to a minute for cond, failing t if it never holds.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("waited a minute for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// A template named by a sandbox's files is in use, including while a
// switch of image keeps the old VM's directory aside (an undone switch
// puts it back, and its disk is still over the template's).
func TestTemplatesInUseDuringSwitch(t *testing.T) {
	e := newEnv(t)
	m := e.managerWith(func(*sandbox.Config) {})
	dir := t.TempDir()
	write := func(p, tpl string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(tpl+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(filepath.Join(e.dir, "sandboxes", "sbx_a", "template.use"), "/t/one")
	write(filepath.Join(e.dir, "sandboxes", "sbx_b.switch", "old", "template.use"), "/t/two")
	write(filepath.Join(dir, "elsewhere", "template.use"), "/t/three")
	got := m.TemplatesInUse()
	if !got["/t/one"] || !got["/t/two"] || got["/t/three"] || len(got) != 2 {
		t.Errorf("in use: %v; want /t/one (a sandbox) and /t/two (aside during a switch)", got)
	}
}
