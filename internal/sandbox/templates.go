package sandbox

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/emberbox/emberbox/internal/admission"
	"github.com/emberbox/emberbox/internal/agentproto"
	"github.com/emberbox/emberbox/internal/guest"
	"github.com/emberbox/emberbox/internal/vmm"
)

// Templates make a plain create cost a restore instead of a boot. A
// template is a memory snapshot of a VM of one shape (vCPUs, memory, disk
// size: a restored guest keeps the devices it booted with) and one root
// disk, taken once its agent is up and the operator's CA installed, and
// before anything of a user or of an image's configuration ran in it
// (env, start command, workdir and user all apply per sandbox, after the
// restore, as after a boot). A create of that shape and disk copies it
// (Driver.Clone: its own memory file and a disk over the template's) and
// resumes the copy, which then gets its own randomness, clock, hostname,
// machine-id and boot id (Renew) and its env (Configure). The default
// image's template is kept warm: the driver keeps a copy of its memory
// made ahead (vmm.SpareKeeper), which a create takes instead of copying
// (some 90 ms of a create under TCG here) and which is then made again in
// the background; it takes the disk of one more copy's memory, none where
// the filesystem shares extents.
//
// The default image's template (the default shape) is made at start. A
// custom image's (its default shape: the default vCPUs and memory, and
// the image's disk size if larger than the default) is made after the
// first create of the image has booted (not beside it: on a small host
// the two boots would slow each other): lazily, since each build is a boot
// and a few hundred MiB of disk, and many images (bases, intermediate
// versions) never serve a sandbox. One template is built at a time (a
// create that asks for another meanwhile queues it); a create of another
// shape boots, as does one that comes before its template is ready.
//
// Templates live under DataDir/templates, keyed by the boot files and the
// CA bundle, so a new guest image or CA gets new templates: the default
// image's in templates/<boot key>/<shape>, a custom image's in
// templates/images/<disk key>/<boot key>/<shape>. A sandbox made from a
// template has its disk over the template's disk (snapshots are flattened
// onto the root disk, and moves take the template's disk along), so the
// manager writes the template's path into the sandbox's directory
// (templateUse) and never removes a template that a sandbox's directory
// names or a create is copying. Custom images' templates are capped
// (Config.ImageTemplates): to make room for a new one, the least recently
// used one that no sandbox uses goes. When the catalog releases an image's
// disk (no image, sandbox or snapshot uses it any longer) it removes the
// disk's templates (RemoveTemplates). The default image's templates are
// never removed by the server; removing those of an old guest image is
// left to the operator.

// shape is what a template is made for.
type shape struct{ VCPU, MemoryMiB, DiskMiB int }

func (s shape) String() string {
	return fmt.Sprintf("%dcpu-%dmib-%dmib", s.VCPU, s.MemoryMiB, s.DiskMiB)
}

func shapeOf(sb *Sandbox) shape { return shape{sb.VCPU, sb.MemoryMiB, sb.DiskMiB} }

// DefaultImageTemplates is how many custom images' templates are kept
// when Config.ImageTemplates is zero.
const DefaultImageTemplates = 8

// Templates keeps the templates of this server: it builds them, pins
// the ones creates are copying and removes the ones no longer wanted.
type Templates struct {
	cfg *Config // the manager's
	log *slog.Logger
	// What it needs of the manager: the context of its goroutines (ends
	// at Close), a goroutine it owns, and its boot helper.
	ctx   context.Context
	spawn func(f func()) bool
	boot  func(ctx context.Context, p bootPlan) (booted, error)

	rootOnce sync.Once
	root     string // templateRoot of the default image

	mu       sync.Mutex
	roots    map[string]string    // a custom image's disk: its templateRoot
	building map[string]bool      // template directories being built (one at a time)
	failed   map[string]time.Time // a failed build is not retried for a while
	pins     map[string]int       // template directories creates are copying now
	gen      map[string]int       // per custom disk, bumped when its templates are removed
	fullAt   time.Time            // when the cap last stopped a build
	pending  []pendingTemplate    // asked for while another was built; built in turn
}

func newTemplates(ctx context.Context, cfg *Config, log *slog.Logger, spawn func(func()) bool,
	boot func(context.Context, bootPlan) (booted, error)) *Templates {
	return &Templates{cfg: cfg, log: log, ctx: ctx, spawn: spawn, boot: boot}
}

// pendingTemplate is a template a create asked for while another was
// being built.
type pendingTemplate struct {
	rootfs string
	s      shape
	dir    string
}

// maxPendingTemplates bounds the templates waiting for their build; a
// create that finds the queue full boots, and a later one asks again.
const maxPendingTemplates = 8

// templateRetry is how long a template that failed to build is not tried
// again: its creates boot cold meanwhile.
const templateRetry = 10 * time.Minute

// templateFullRetry is how long after the cap stopped a build (every kept
// template in use) the next create looks again for one to remove.
const templateFullRetry = time.Minute

// templateWork bounds a template's making once its guest has booted:
// configuring, warming up, detaching and saving it.
const templateWork = 2 * time.Minute

// templateMarker is written into a template's directory last. Its
// modification time is the template's last use (custom images').
const templateMarker = "template.ok"

// templateUse, in a sandbox's directory, names the template directory its
// disk was copied from: that template must stay while the file does.
const templateUse = "template.use"

// imageRootfsFile, in a custom image's templates directory, names the
// image's disk, so that templates of a disk gone are found.
const imageRootfsFile = "rootfs"

func (t *Templates) imageBase() string {
	return filepath.Join(t.cfg.DataDir, "templates", "images")
}

// imageDir is the directory of every template of a custom image's
// disk, whatever the boot files.
func (t *Templates) imageDir(rootfs string) string {
	h := sha256.Sum256([]byte(rootfs))
	return filepath.Join(t.imageBase(), hex.EncodeToString(h[:])[:16])
}

// rootOf is the directory of the templates of a root disk ("": the
// default image's) for this server's boot files and CA bundle. Those do
// not change while the server runs, nor does a custom image's disk (its
// path names its content), so it is worked out once per disk, not at
// every create.
func (t *Templates) rootOf(rootfs string) string {
	if rootfs == "" {
		t.rootOnce.Do(func() {
			t.root = filepath.Join(t.cfg.DataDir, "templates", t.key(t.cfg.Boot.Rootfs))
		})
		return t.root
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.rootOfLocked(rootfs)
}

func (t *Templates) rootOfLocked(rootfs string) string {
	if r, ok := t.roots[rootfs]; ok {
		return r
	}
	if t.roots == nil {
		t.roots = map[string]string{}
	}
	r := filepath.Join(t.imageDir(rootfs), t.key(rootfs))
	t.roots[rootfs] = r
	return r
}

func (t *Templates) key(rootfs string) string {
	h := sha256.New()
	for _, f := range []string{t.cfg.Boot.Kernel, t.cfg.Boot.Initrd, rootfs} {
		st, err := os.Stat(f)
		if err == nil {
			fmt.Fprintf(h, "%s:%d:%d\n", f, st.Size(), st.ModTime().UnixNano())
		}
	}
	fmt.Fprintf(h, "%s\n%s\n", t.cfg.Driver.Name(), t.cfg.ExtraCAs)
	return hex.EncodeToString(h.Sum(nil))[:16]
}

func (t *Templates) dir(rootfs string, s shape) string {
	return filepath.Join(t.rootOf(rootfs), s.String())
}

// defaultShape is the shape templates are made for: a create of another
// shape boots. Building one for every shape asked for would spend a boot
// and a few hundred MiB of disk on shapes that may never come again.
var defaultShape = shape{DefaultVCPU, DefaultMemoryMiB, DefaultDiskMiB}

// templateShape is the shape of the template of a root disk ("": the
// default image's) whose sandboxes need at least minDiskMiB: what a create
// of that image that asks for nothing gets.
func templateShape(rootfs string, minDiskMiB int) shape {
	s := defaultShape
	if rootfs != "" {
		s.DiskMiB = max(s.DiskMiB, minDiskMiB)
	}
	return s
}

func (t *Templates) imageCap() int {
	if t.cfg.ImageTemplates == 0 {
		return DefaultImageTemplates
	}
	return max(t.cfg.ImageTemplates, 0)
}

// serves reports whether a create of root disk rootfs ("": the
// default image's, whose sandboxes need minDiskMiB) and shape s is served
// by a template.
func (t *Templates) serves(rootfs string, s shape, minDiskMiB int) bool {
	return t.cfg.Templates && s == templateShape(rootfs, minDiskMiB) && (rootfs == "" || t.imageCap() > 0)
}

// pin returns the directory of the template of root disk rootfs ("":
// the default image's) and shape s if it is built, pinned until unpin;
// minDiskMiB is the image's disk.
func (t *Templates) pin(rootfs string, s shape, minDiskMiB int) (string, bool) {
	if !t.serves(rootfs, s, minDiskMiB) {
		return "", false
	}
	dir := t.dir(rootfs, s)
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, err := os.Stat(filepath.Join(dir, templateMarker)); err == nil {
		if t.pins == nil {
			t.pins = map[string]int{}
		}
		t.pins[dir]++
		if rootfs != "" {
			now := time.Now()
			_ = os.Chtimes(filepath.Join(dir, templateMarker), now, now) // its last use, for the cap
		}
		return dir, true
	}
	return "", false
}

// want starts building (or queues) the template of rootfs and s
// if a create of them would use one and it is not built.
func (t *Templates) want(rootfs string, s shape, minDiskMiB int) {
	if !t.serves(rootfs, s, minDiskMiB) {
		return
	}
	dir := t.dir(rootfs, s)
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, err := os.Stat(filepath.Join(dir, templateMarker)); err != nil {
		t.buildLocked(rootfs, s, dir)
	}
}

func (t *Templates) unpin(dir string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.pins[dir]--; t.pins[dir] <= 0 {
		delete(t.pins, dir)
	}
}

// Prepare builds the template of the default image and shape in the
// background, so that the first creates need not boot, and removes the
// templates of custom images' disks that are gone (a crash between the
// catalog's removal of a disk and of its templates).
func (t *Templates) Prepare() {
	if !t.cfg.Templates {
		return
	}
	t.sweep()
	t.want("", defaultShape, 0)
	dir := t.dir("", defaultShape)
	if _, err := os.Stat(filepath.Join(dir, templateMarker)); err == nil {
		t.keepSpare("", dir)
	}
}

// keepSpare has the driver keep a copy of the template in dir ready for
// the next create, if it can: for the default image's templates only, which
// the server never removes (a spare takes the disk of one more copy's
// memory, none where the filesystem shares extents).
func (t *Templates) keepSpare(rootfs, dir string) {
	if k, ok := t.cfg.Driver.(vmm.SpareKeeper); ok && rootfs == "" {
		k.KeepSpare(dir)
	}
}

func (t *Templates) buildLocked(rootfs string, s shape, dir string) {
	if t.building == nil {
		t.building, t.failed = map[string]bool{}, map[string]time.Time{}
	}
	if t.building[dir] || time.Since(t.failed[dir]) < templateRetry {
		return
	}
	if len(t.building) > 0 {
		// One build at a time, as each is a boot: this one comes after.
		if len(t.pending) < maxPendingTemplates && !slices.ContainsFunc(t.pending, func(p pendingTemplate) bool { return p.dir == dir }) {
			t.pending = append(t.pending, pendingTemplate{rootfs, s, dir})
		}
		return
	}
	if rootfs != "" && !t.makeRoomLocked() {
		return
	}
	t.building[dir] = true
	gen := t.gen[rootfs]
	if !t.spawn(func() {
		start := time.Now()
		err := t.build(t.ctx, rootfs, s, dir, gen)
		t.mu.Lock()
		delete(t.building, dir)
		if err != nil {
			t.failed[dir] = time.Now()
		}
		t.nextLocked()
		t.mu.Unlock()
		log := t.log.With("shape", s)
		if rootfs != "" {
			log = log.With("image_rootfs", rootfs)
		}
		if err != nil {
			if t.ctx.Err() == nil {
				log.Warn("building a template failed; creates of its image and shape boot", "err", err)
			}
			return
		}
		log.Info("template ready", "took", time.Since(start).Round(time.Millisecond))
	}) {
		delete(t.building, dir)
	}
}

// nextLocked starts the build of the next template asked for
// while another was built, if any is still missing. The caller holds
// t.mu.
func (t *Templates) nextLocked() {
	for len(t.pending) > 0 && len(t.building) == 0 {
		p := t.pending[0]
		t.pending = t.pending[1:]
		if _, err := os.Stat(filepath.Join(p.dir, templateMarker)); err == nil {
			continue
		}
		t.buildLocked(p.rootfs, p.s, p.dir)
	}
}

// errTemplateDropped is a build whose disk's templates were removed
// while it ran (the image was deleted): its result is dropped.
var errTemplateDropped = errors.New("the image's templates were removed while it was built")

// build boots a VM of shape s from root disk rootfs ("": the
// default), waits for its agent, installs the CA bundle, detaches,
// snapshots its memory and disk into the template's directory final and
// ends the VM. gen is the disk's removal count when the build began: if
// its templates were removed since, the result is dropped.
func (t *Templates) build(ctx context.Context, rootfs string, s shape, final string, gen int) error {
	work := final + ".build"
	// A build a crash of the server cut short may have left its VM.
	t.killStrays(ctx)
	_ = os.RemoveAll(work)
	if err := os.MkdirAll(work, 0o755); err != nil {
		return err
	}
	defer os.RemoveAll(work)
	base := t.cfg.Boot.Rootfs
	if rootfs != "" {
		base = rootfs
		// Names the disk, for the sweep of templates of disks gone.
		if err := os.WriteFile(filepath.Join(t.imageDir(rootfs), imageRootfsFile), []byte(rootfs+"\n"), 0o644); err != nil {
			return err
		}
	}
	var id [6]byte
	_, _ = rand.Read(id[:])
	spec := vmm.Spec{
		ID: "tpl_" + hex.EncodeToString(id[:]), Dir: filepath.Join(work, "vm"),
		VCPU: s.VCPU, MemoryMiB: s.MemoryMiB, DiskMiB: s.DiskMiB,
		Kernel: t.cfg.Boot.Kernel, Initrd: t.cfg.Boot.Initrd, Rootfs: base, Layer: t.cfg.Boot.Layer,
	}
	if err := os.WriteFile(filepath.Join(work, "id"), []byte(spec.ID), 0o600); err != nil {
		return err
	}
	// The build VM is promised its resources like a sandbox, and waits for
	// a later create when there is no room; it takes no boot slot, which
	// are the creates' own.
	if err := t.cfg.Admission.Reserve(admission.Claim{ID: spec.ID,
		Resources: admission.Resources{VCPU: s.VCPU, MemoryMiB: int64(s.MemoryMiB), DiskMiB: int64(s.DiskMiB)}}); err != nil {
		return fmt.Errorf("no room to build a template: %w", err)
	}
	defer t.cfg.Admission.Release(spec.ID)
	bctx, cancel := context.WithTimeout(ctx, t.cfg.BootTimeout)
	defer cancel()
	snap := filepath.Join(work, "snap")
	b, err := t.boot(bctx, bootPlan{
		start: func(ctx context.Context) (vmm.Machine, error) { return t.cfg.Driver.Start(ctx, spec) },
		ready: func(_ context.Context, mach vmm.Machine, c *guest.Client) error {
			// Booted: what follows is bounded on its own, not by the
			// boot's time.
			wctx, cancel := context.WithTimeout(ctx, templateWork)
			defer cancel()
			return t.save(wctx, mach, c, snap)
		},
	})
	if b.mach != nil {
		defer func() {
			sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 15*time.Second)
			defer cancel()
			_ = b.mach.Stop(sctx)
		}()
	}
	if err != nil {
		return err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.gen[rootfs] != gen {
		return errTemplateDropped
	}
	_ = os.RemoveAll(final)
	if err := os.MkdirAll(filepath.Dir(final), 0o755); err != nil {
		return err
	}
	if err := os.Rename(snap, final); err != nil {
		return err
	}
	t.keepSpare(rootfs, final)
	return nil
}

// save readies the guest of a template's build VM (the CA bundle, a warm
// page cache), detaches it and snapshots the VM's memory and disk into
// snap, marked as a template.
func (t *Templates) save(ctx context.Context, mach vmm.Machine, c *guest.Client, snap string) error {
	if err := c.Configure(ctx, agentproto.ConfigureRequest{CACerts: t.cfg.ExtraCAs}); err != nil {
		return fmt.Errorf("template guest: %w", err)
	}
	// The first command of every copy pays for what the template never
	// ran (its files read from disk, under TCG slowly): run the path of a
	// first command once, so that copies find it in their page cache.
	for _, cmd := range []string{"true", "echo warm"} {
		if _, err := c.Exec(ctx, agentproto.ExecRequest{Command: cmd, Stream: true, TimeoutMs: 60000}, func(agentproto.Event) error { return nil }); err != nil {
			return fmt.Errorf("template guest: warming up: %w", err)
		}
	}
	if err := c.Detach(ctx); err != nil {
		return fmt.Errorf("template guest: detaching: %w", err)
	}
	if _, err := vmm.Snapshot(ctx, mach, snap, true); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(snap, templateMarker), nil, 0o644)
}

// killStrays ends the VMs of template builds that a crash of the
// server left running: the build VMs are disposable, and only one build
// runs at a time, so none of them is in use when a build starts.
func (t *Templates) killStrays(ctx context.Context) {
	k, ok := t.cfg.Driver.(vmm.StrayKiller)
	if !ok {
		return
	}
	root := filepath.Join(t.cfg.DataDir, "templates")
	builds, _ := filepath.Glob(filepath.Join(root, "*", "*.build"))
	images, _ := filepath.Glob(filepath.Join(t.imageBase(), "*", "*", "*.build"))
	for _, b := range append(builds, images...) {
		if id, err := os.ReadFile(filepath.Join(b, "id")); err == nil {
			if n, err := k.KillStray(ctx, vmm.Spec{ID: string(id), Dir: filepath.Join(b, "vm")}); err == nil && n > 0 {
				t.log.Info("ended a template build's vm left by a crash", "count", n)
			}
		}
		_ = os.RemoveAll(b)
	}
}

// inUseLocked is the set of template directories that a create
// is copying or a sandbox's directory names (templateUse): a sandbox's
// disk is over its template's disk until the sandbox's files go (delete,
// or the stopped-disk retention). The caller holds t.mu, under
// which pins are taken before a sandbox's file is written.
func (t *Templates) inUseLocked() map[string]bool {
	used := map[string]bool{}
	for dir := range t.pins {
		used[dir] = true
	}
	files, _ := filepath.Glob(filepath.Join(t.cfg.DataDir, "sandboxes", "*", templateUse))
	// A switch of image keeps the old VM's directory aside until the new
	// VM runs, and puts it back if the switch is undone.
	aside, _ := filepath.Glob(filepath.Join(t.cfg.DataDir, "sandboxes", "*.switch", switchOldDir, templateUse))
	for _, f := range append(files, aside...) {
		if b, err := os.ReadFile(f); err == nil {
			used[filepath.Clean(strings.TrimSpace(string(b)))] = true
		}
	}
	return used
}

// makeRoomLocked removes the least recently used custom images' templates
// that no sandbox uses until there is room for one more under the cap,
// and reports whether there is. The caller holds t.mu.
func (t *Templates) makeRoomLocked() bool {
	if time.Since(t.fullAt) < templateFullRetry {
		return false
	}
	markers, _ := filepath.Glob(filepath.Join(t.imageBase(), "*", "*", "*", templateMarker))
	limit := t.imageCap()
	if len(markers) < limit {
		return true
	}
	type kept struct {
		dir  string
		used time.Time
	}
	var ts []kept
	for _, f := range markers {
		if st, err := os.Stat(f); err == nil {
			ts = append(ts, kept{filepath.Dir(f), st.ModTime()})
		}
	}
	sort.Slice(ts, func(i, j int) bool { return ts[i].used.Before(ts[j].used) })
	inUse := t.inUseLocked()
	n := len(ts)
	for _, k := range ts {
		if n < limit {
			break
		}
		if inUse[k.dir] {
			continue
		}
		if err := os.RemoveAll(k.dir); err != nil {
			t.log.Warn("removing an image's template", "dir", k.dir, "err", err)
			continue
		}
		_ = os.Remove(filepath.Dir(k.dir)) // its boot key's directory, if empty now
		t.log.Info("removed the least recently used image template", "dir", k.dir, "last_used", k.used)
		n--
	}
	if n >= limit {
		t.fullAt = time.Now()
		t.log.Info("every image template kept is in use; the image's creates boot", "cap", limit)
		return false
	}
	return true
}

// RemoveTemplates removes the templates of a custom image's root disk.
// The image catalog calls it when it releases the disk, once no image,
// sandbox or snapshot uses it, so no sandbox's disk is over them; a
// template build of the disk under way drops its result.
func (t *Templates) RemoveTemplates(rootfs string) error {
	if rootfs == "" {
		return nil
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.gen == nil {
		t.gen = map[string]int{}
	}
	t.gen[rootfs]++
	delete(t.roots, rootfs) // a disk stored again at the path gets its templates anew
	t.pending = slices.DeleteFunc(t.pending, func(p pendingTemplate) bool { return p.rootfs == rootfs })
	dir := t.imageDir(rootfs)
	// A build under way keeps its work directory (its VM's files) and
	// removes it itself.
	builds, _ := filepath.Glob(filepath.Join(dir, "*", "*.build"))
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("removing the templates of %s: %w", rootfs, err)
	}
	for _, e := range entries {
		p := filepath.Join(dir, e.Name())
		if !e.IsDir() || len(builds) == 0 {
			if err := os.RemoveAll(p); err != nil {
				return fmt.Errorf("removing the templates of %s: %w", rootfs, err)
			}
			continue
		}
		shapes, _ := os.ReadDir(p)
		for _, sh := range shapes {
			if !strings.HasSuffix(sh.Name(), ".build") {
				if err := os.RemoveAll(filepath.Join(p, sh.Name())); err != nil {
					return fmt.Errorf("removing the templates of %s: %w", rootfs, err)
				}
			}
		}
		_ = os.Remove(p)
	}
	_ = os.Remove(dir)
	return nil
}

// sweep removes the templates of custom images' disks that
// are gone and that no sandbox uses.
func (t *Templates) sweep() {
	t.mu.Lock()
	defer t.mu.Unlock()
	files, _ := filepath.Glob(filepath.Join(t.imageBase(), "*", imageRootfsFile))
	var inUse map[string]bool
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		rootfs := strings.TrimSpace(string(b))
		if _, err := os.Stat(rootfs); !errors.Is(err, os.ErrNotExist) {
			continue
		}
		dir := filepath.Dir(f)
		if inUse == nil {
			inUse = t.inUseLocked()
		}
		used := false
		for u := range inUse {
			if strings.HasPrefix(u, dir+string(filepath.Separator)) {
				used = true
			}
		}
		if used {
			continue
		}
		if err := os.RemoveAll(dir); err != nil {
			t.log.Warn("removing the templates of an image disk gone", "dir", dir, "err", err)
			continue
		}
		t.log.Info("removed the templates of an image disk gone", "rootfs", rootfs)
	}
}
