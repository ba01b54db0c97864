package sandbox

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/emberbox/emberbox/internal/admission"
	"github.com/emberbox/emberbox/internal/agentproto"
	"github.com/emberbox/emberbox/internal/guest"
	"github.com/emberbox/emberbox/internal/vmm"
)

// Templates make a plain create cost a restore instead of a boot. A
// template is a memory snapshot of a VM of one shape (vCPUs, memory, disk
// size: a restored guest keeps the devices it booted with), taken once its
// agent is up and the operator's CA installed, and before anything of a
// user ran in it. A create of that shape copies it (Driver.Clone: its own
// memory file and a disk over the template's) and resumes the copy, which
// then gets its own randomness, clock, hostname, machine-id and boot id
// (Renew) and its env (Configure). Templates are made for the default
// shape, at start; a create of another shape boots, as does one that
// comes before the template is ready.
//
// Templates live under DataDir/templates, keyed by the boot files and the
// CA bundle, so a new image or CA gets new templates. Copies' disks are
// overlays of a template's disk, so templates are never removed by the
// server (each takes a few hundred MiB); removing the templates of an old
// image is left to the operator.

// shape is what a template is made for.
type shape struct{ VCPU, MemoryMiB, DiskMiB int }

func (s shape) String() string {
	return fmt.Sprintf("%dcpu-%dmib-%dmib", s.VCPU, s.MemoryMiB, s.DiskMiB)
}

func shapeOf(sb *Sandbox) shape { return shape{sb.VCPU, sb.MemoryMiB, sb.DiskMiB} }

// templateSet tracks the templates of this server.
type templateSet struct {
	rootOnce sync.Once
	root     string // templateRoot

	mu       sync.Mutex
	building map[shape]bool
	failed   map[shape]time.Time // a failed build is not retried for a while
}

// templateRetry is how long a shape whose template failed to build boots
// cold before another build is tried.
const templateRetry = 10 * time.Minute

// templateWork bounds a template's making once its guest has booted:
// configuring, warming up, detaching and saving it.
const templateWork = 2 * time.Minute

// templateMarker is written into a template's directory last.
const templateMarker = "template.ok"

// templateRoot is the directory of this server's templates for its current
// boot files and CA bundle. Those do not change while the server runs, so
// it is worked out once, not at every create.
func (m *Manager) templateRoot() string {
	m.templates.rootOnce.Do(func() { m.templates.root = m.hashTemplateRoot() })
	return m.templates.root
}

func (m *Manager) hashTemplateRoot() string {
	h := sha256.New()
	for _, f := range []string{m.cfg.Boot.Kernel, m.cfg.Boot.Initrd, m.cfg.Boot.Rootfs} {
		st, err := os.Stat(f)
		if err == nil {
			fmt.Fprintf(h, "%s:%d:%d\n", f, st.Size(), st.ModTime().UnixNano())
		}
	}
	fmt.Fprintf(h, "%s\n%s\n", m.cfg.Driver.Name(), m.cfg.ExtraCAs)
	return filepath.Join(m.cfg.DataDir, "templates", hex.EncodeToString(h.Sum(nil))[:16])
}

func (m *Manager) templateDir(s shape) string { return filepath.Join(m.templateRoot(), s.String()) }

// defaultShape is the shape templates are made for: a create of another
// shape boots. Building one for every shape asked for would spend a boot
// and a few hundred MiB of disk on shapes that may never come again.
var defaultShape = shape{DefaultVCPU, DefaultMemoryMiB, DefaultDiskMiB}

// template returns the directory of the template of s if it is built, and
// otherwise starts building it (unless templates are off or s has none)
// and reports false.
func (m *Manager) template(s shape) (string, bool) {
	if !m.cfg.Templates || s != defaultShape {
		return "", false
	}
	dir := m.templateDir(s)
	if _, err := os.Stat(filepath.Join(dir, templateMarker)); err == nil {
		return dir, true
	}
	m.buildTemplateAsync(s)
	return "", false
}

// PrepareTemplate builds the template of the default shape in the
// background, so that the first creates need not boot.
func (m *Manager) PrepareTemplate() {
	if m.cfg.Templates {
		m.template(defaultShape)
	}
}

func (m *Manager) buildTemplateAsync(s shape) {
	t := &m.templates
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.building == nil {
		t.building, t.failed = map[shape]bool{}, map[shape]time.Time{}
	}
	if t.building[s] || time.Since(t.failed[s]) < templateRetry {
		return
	}
	if len(t.building) > 0 {
		return // one build at a time: each is a boot
	}
	t.building[s] = true
	if !m.spawn(func() {
		start := time.Now()
		err := m.buildTemplate(m.ctx, s)
		t.mu.Lock()
		delete(t.building, s)
		if err != nil {
			t.failed[s] = time.Now()
		}
		t.mu.Unlock()
		if err != nil {
			if m.ctx.Err() == nil {
				m.log.Warn("building a template failed; creates of its shape boot", "shape", s, "err", err)
			}
			return
		}
		m.log.Info("template ready", "shape", s, "took", time.Since(start).Round(time.Millisecond))
	}) {
		delete(t.building, s)
	}
}

// buildTemplate boots a VM of shape s, waits for its agent, installs the
// CA bundle, detaches, snapshots its memory and disk into the template's
// directory and ends the VM.
func (m *Manager) buildTemplate(ctx context.Context, s shape) error {
	final := m.templateDir(s)
	work := final + ".build"
	// A build a crash of the server cut short may have left its VM.
	m.killTemplateStrays(ctx)
	_ = os.RemoveAll(work)
	if err := os.MkdirAll(work, 0o755); err != nil {
		return err
	}
	defer os.RemoveAll(work)
	var id [6]byte
	_, _ = rand.Read(id[:])
	spec := vmm.Spec{
		ID: "tpl_" + hex.EncodeToString(id[:]), Dir: filepath.Join(work, "vm"),
		VCPU: s.VCPU, MemoryMiB: s.MemoryMiB, DiskMiB: s.DiskMiB,
		Kernel: m.cfg.Boot.Kernel, Initrd: m.cfg.Boot.Initrd, Rootfs: m.cfg.Boot.Rootfs,
	}
	if err := os.WriteFile(filepath.Join(work, "id"), []byte(spec.ID), 0o600); err != nil {
		return err
	}
	// The build VM is promised its resources like a sandbox, and waits for
	// a later create when there is no room; it takes no boot slot, which
	// are the creates' own.
	if err := m.cfg.Admission.Reserve(admission.Claim{ID: spec.ID,
		Resources: admission.Resources{VCPU: s.VCPU, MemoryMiB: int64(s.MemoryMiB), DiskMiB: int64(s.DiskMiB)}}); err != nil {
		return fmt.Errorf("no room to build a template: %w", err)
	}
	defer m.cfg.Admission.Release(spec.ID)
	bctx, cancel := context.WithTimeout(ctx, m.cfg.BootTimeout)
	defer cancel()
	mach, err := m.cfg.Driver.Start(bctx, spec)
	if err != nil {
		return err
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 15*time.Second)
		defer cancel()
		_ = mach.Stop(sctx)
	}()
	conn, err := mach.DialGuest(bctx)
	if err != nil {
		return err
	}
	c, err := guest.Handshake(bctx, conn)
	if err != nil {
		conn.Close()
		return fmt.Errorf("template guest: %w", err)
	}
	// Booted: what follows is bounded on its own, not by the boot's time.
	wctx, wcancel := context.WithTimeout(ctx, templateWork)
	defer wcancel()
	if err := c.Configure(wctx, agentproto.ConfigureRequest{CACerts: m.cfg.ExtraCAs}); err != nil {
		c.Close()
		return fmt.Errorf("template guest: %w", err)
	}
	// The first command of every copy pays for what the template never
	// ran (its files read from disk, under TCG slowly): run the path of a
	// first command once, so that copies find it in their page cache.
	for _, cmd := range []string{"true", "echo warm"} {
		if _, err := c.Exec(wctx, agentproto.ExecRequest{Command: cmd, Stream: true, TimeoutMs: 60000}, func(agentproto.Event) error { return nil }); err != nil {
			c.Close()
			return fmt.Errorf("template guest: warming up: %w", err)
		}
	}
	if err := c.Detach(wctx); err != nil {
		return fmt.Errorf("template guest: detaching: %w", err)
	}
	snap := filepath.Join(work, "snap")
	if _, err := mach.Snapshot(wctx, snap, true); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(snap, templateMarker), nil, 0o644); err != nil {
		return err
	}
	_ = os.RemoveAll(final)
	if err := os.MkdirAll(filepath.Dir(final), 0o755); err != nil {
		return err
	}
	return os.Rename(snap, final)
}

// killTemplateStrays ends the VMs of template builds that a crash of the
// server left running: the build VMs are disposable, and only one build
// runs at a time, so none of them is in use when a build starts.
func (m *Manager) killTemplateStrays(ctx context.Context) {
	k, ok := m.cfg.Driver.(vmm.StrayKiller)
	if !ok {
		return
	}
	root := filepath.Join(m.cfg.DataDir, "templates")
	builds, _ := filepath.Glob(filepath.Join(root, "*", "*.build"))
	for _, b := range builds {
		if id, err := os.ReadFile(filepath.Join(b, "id")); err == nil {
			if n, err := k.KillStray(ctx, vmm.Spec{ID: string(id), Dir: filepath.Join(b, "vm")}); err == nil && n > 0 {
				m.log.Info("ended a template build's vm left by a crash", "count", n)
			}
		}
		_ = os.RemoveAll(b)
	}
}

// bootTemplate starts a sandbox as a copy of the template in dir, and
// boots it if that fails: a template is an optimisation, never a reason
// for a create to fail.
func (m *Manager) bootTemplate(ctx context.Context, in *instance, sb *Sandbox, dir string, env map[string]string) {
	start := time.Now()
	spec := m.vmSpec(sb)
	cctx, cancel := context.WithTimeout(ctx, m.cfg.BootTimeout)
	err := m.cfg.Driver.Clone(cctx, dir, spec)
	cancel()
	if err == nil {
		if err = m.resumeCopy(ctx, in, sb, env); err == nil {
			m.prepareReady(ctx, in, sb, map[string]any{"template": true, "resumeMs": time.Since(start).Milliseconds()})
			close(in.bootDone)
			return
		}
	}
	if ctx.Err() != nil || m.closing.Load() {
		close(in.bootDone)
		return // stopped, deleted or shutting down: that path records the end
	}
	m.log.Warn("restoring a template failed; booting instead", "sandbox_id", sb.ID, "err", err)
	m.event(sb.ID, "template_failed", err.Error(), nil)
	m.boot(ctx, in, sb, env, false)
}
