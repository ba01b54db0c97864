package recipebuild

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/emberbox/emberbox/internal/catalog"
	"github.com/emberbox/emberbox/internal/egress"
	"github.com/emberbox/emberbox/internal/errdefs"
	"github.com/emberbox/emberbox/internal/guest"
	"github.com/emberbox/emberbox/internal/sandbox"
)

// build is one run of a plan.
type build struct {
	b    *Builder
	job  catalog.Job
	log  catalog.LogSink
	plan *plan

	bases []*catalog.Resolved // per stage with an image base
	ends  []stageEnd          // per stage, once run
	total int                 // steps of the plan
	done  int                 // steps numbered so far
	// local holds snapshots this build made that are not in the cache
	// (cache off): deleted when it ends.
	local map[string]string
	ops   []copyOp
}

type stageEnd struct {
	key, snapshot string
}

// source is what a build sandbox starts from.
type source struct {
	image    *sandbox.ImageRef // nil: the default image
	snapshot string
	minDisk  int
}

func (bd *build) caching() bool { return bd.job.Cache && bd.b.cfg.Cache != nil }

func (bd *build) cleanup() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for _, id := range bd.local {
		if err := bd.b.cfg.Snapshots.DeleteSnapshot(ctx, Owner, id); err != nil && !errdefs.IsNotFound(err) {
			bd.b.log.Warn("deleting a build snapshot", "snapshot_id", id, "err", err)
		}
	}
	removeOps(bd.ops)
}

func (bd *build) run(ctx context.Context) (catalog.Result, error) {
	bd.bases = make([]*catalog.Resolved, len(bd.plan.stages))
	for i, st := range bd.plan.stages {
		bd.total += len(st.steps)
		if st.baseStage < 0 {
			r, err := bd.resolveBase(ctx, st)
			if err != nil {
				return catalog.Result{}, err
			}
			bd.bases[i] = r
		}
	}
	bd.log.Line("build", fmt.Sprintf("%d stage(s), %d step(s)", len(bd.plan.stages), bd.total))
	for i := range bd.plan.stages {
		end, err := bd.runStage(ctx, i)
		if err != nil {
			return catalog.Result{}, err
		}
		bd.ends = append(bd.ends, end)
	}
	last := len(bd.plan.stages) - 1
	end := bd.ends[last]
	dst := filepath.Join(bd.job.WorkDir, "rootfs.img")
	bd.log.Line("build", "exporting the root disk")
	if err := bd.b.cfg.Snapshots.ExportDisk(ctx, Owner, end.snapshot, dst); err != nil {
		return catalog.Result{}, fmt.Errorf("exporting the image's disk: %w", err)
	}
	st := bd.plan.stages[last]
	base := bd.baseOf(last)
	env := map[string]string{}
	var workdir, user string
	if base != nil {
		maps.Copy(env, base.Env)
		workdir, user = base.Workdir, base.User
	}
	maps.Copy(env, st.env)
	if st.workdir != "" {
		workdir = st.workdir
	}
	if st.user != "" {
		user = st.user
	}
	return resultOf(bd.job, dst, "sha256:"+end.key, env, workdir, user, st.start, st.labels)
}

// resultOf describes a finished disk at rootfs.
func resultOf(job catalog.Job, rootfs, digest string, env map[string]string, workdir, user string, start *catalog.StartSpec, labels map[string]string) (catalog.Result, error) {
	fi, err := os.Stat(rootfs)
	if err != nil {
		return catalog.Result{}, fmt.Errorf("the image's disk: %w", err)
	}
	var alloc int64
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		alloc = st.Blocks * 512
	}
	if job.MaxImageMiB > 0 && alloc > int64(job.MaxImageMiB)<<20 {
		return catalog.Result{}, errdefs.New(errdefs.ErrInvalidArgument, "image_too_large",
			"the image takes %d MiB, over the limit of %d MiB", alloc>>20, job.MaxImageMiB)
	}
	out := map[string]string{}
	maps.Copy(out, env)
	maps.Copy(out, job.Env)
	switch {
	case job.Start != nil:
		start = job.Start
	case job.NoStart:
		start = nil
	}
	return catalog.Result{RootfsPath: rootfs, Digest: digest, SizeBytes: alloc,
		MinDiskMiB: int((fi.Size() + 1<<20 - 1) >> 20), Env: out, Workdir: workdir, User: user,
		Start: start, Labels: labels}, nil
}

// baseOf is the image a stage descends from, through stages.
func (bd *build) baseOf(i int) *catalog.Resolved {
	for bd.plan.stages[i].baseStage >= 0 {
		i = bd.plan.stages[i].baseStage
	}
	return bd.bases[i]
}

// resolveBase finds a stage's base image: ours by name or id, or an OCI
// image through the importer.
func (bd *build) resolveBase(ctx context.Context, st *stage) (*catalog.Resolved, error) {
	ref := st.base
	where := "base"
	if st.line > 0 {
		where = fmt.Sprintf("Dockerfile line %d: FROM", st.line)
	}
	if ref == "" || ref == "default" {
		if bd.job.Resolve != nil {
			if r, err := bd.job.Resolve(ctx, "default"); err == nil && r.Digest != "" {
				if r.Ref.Rootfs == "" {
					r.Ref = sandbox.ImageRef{}
				}
				return r, nil
			}
		}
		return &catalog.Resolved{Digest: bd.b.cfg.DefaultDigest}, nil
	}
	if bd.job.Resolve == nil {
		return nil, invalid("%s %s: this server resolves no images", where, ref)
	}
	r, err := bd.job.Resolve(ctx, ref)
	if err == nil {
		return r, nil
	}
	if !errdefs.IsNotFound(err) {
		return nil, fmt.Errorf("%s %s: %w", where, ref, err)
	}
	if bd.b.cfg.Import == nil {
		return nil, invalid("%s %s: no image of ours has that name, and OCI images arrive with the import, which this server does not have yet", where, ref)
	}
	bd.log.Line("build", "importing "+ref)
	res, err := bd.b.cfg.Import.Import(ctx, bd.job, ref, bd.log)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", where, ref, err)
	}
	// No catalog image: build sandboxes record the disk alone.
	return &catalog.Resolved{Ref: sandbox.ImageRef{Rootfs: res.RootfsPath, MinDiskMiB: res.MinDiskMiB},
		Digest: res.Digest, Env: res.Env, Workdir: res.Workdir, User: res.User}, nil
}

func (bd *build) runStage(ctx context.Context, i int) (stageEnd, error) {
	st := bd.plan.stages[i]
	startKey, from := bd.stageStart(i)
	if err := bd.materialize(st); err != nil {
		return stageEnd{}, err
	}
	keys := stepKeys(st, startKey)
	first := bd.done
	bd.done += len(st.steps)
	hit, hitSnap := bd.cachedSteps(ctx, st, keys, first)
	if hit >= 0 {
		from.snapshot = hitSnap
	}
	end, done := bd.cachedEnd(ctx, st, startKey, keys, hit, &from)
	if done {
		return end, nil
	}
	sb, g, err := bd.sandbox(ctx, from, st)
	if err != nil {
		return stageEnd{}, err
	}
	defer bd.deleteSandbox(sb.ID)
	env := map[string]string{}
	if base := bd.baseOf(i); base != nil {
		maps.Copy(env, base.Env)
	}
	for j := hit + 1; j < len(st.steps); j++ {
		s := st.steps[j]
		n := first + j + 1
		bd.log.Line("build", fmt.Sprintf("step %d/%d %s", n, bd.total, s.text))
		t0 := time.Now()
		if err := bd.runStep(ctx, g, s, env); err != nil {
			return stageEnd{}, fmt.Errorf("step %d/%d %s: %w", n, bd.total, s.text, err)
		}
		last := j == len(st.steps)-1
		if bd.caching() || last {
			id, err := bd.capture(ctx, g, sb.ID, keys[j])
			if err != nil {
				return stageEnd{}, fmt.Errorf("step %d/%d %s: %w", n, bd.total, s.text, err)
			}
			end.snapshot = id
		}
		bd.log.Line("build", fmt.Sprintf("step %d/%d done in %s", n, bd.total, time.Since(t0).Round(time.Millisecond)))
	}
	if end.snapshot == "" {
		id, err := bd.capture(ctx, g, sb.ID, end.key)
		if err != nil {
			return stageEnd{}, err
		}
		end.snapshot = id
	}
	if err := bd.export(ctx, g, st); err != nil {
		return stageEnd{}, err
	}
	return end, nil
}

// stageStart is the cache key stage i starts from and the disk it boots:
// its base stage's end, or its base image.
func (bd *build) stageStart(i int) (string, source) {
	st := bd.plan.stages[i]
	var from source
	if st.baseStage >= 0 {
		e := bd.ends[st.baseStage]
		return e.key, source{snapshot: e.snapshot}
	}
	r := bd.bases[i]
	if r.Ref.Rootfs != "" {
		ref := r.Ref
		from.image, from.minDisk = &ref, ref.MinDiskMiB
	}
	return baseKey(r.Digest), from
}

// stepKeys chains the cache keys of st's steps from startKey: each step's
// key names everything before it.
func stepKeys(st *stage, startKey string) []string {
	keys := make([]string, len(st.steps))
	prev := startKey
	for j, s := range st.steps {
		keys[j] = s.key(prev)
		prev = keys[j]
	}
	return keys
}

// cachedSteps finds the last step whose snapshot the cache holds, and logs
// the steps up to it as cached; hit is -1 when there is none. first is the
// build's count of steps before this stage.
func (bd *build) cachedSteps(ctx context.Context, st *stage, keys []string, first int) (hit int, snapshot string) {
	hit = -1
	for j := len(keys) - 1; j >= 0; j-- {
		if id := bd.lookup(ctx, keys[j]); id != "" {
			hit, snapshot = j, id
			break
		}
	}
	for j := 0; j <= hit; j++ {
		bd.log.Line("build", fmt.Sprintf("step %d/%d %s: cached", first+j+1, bd.total, st.steps[j].text))
	}
	return hit, snapshot
}

// cachedEnd is where the stage ends as far as the cache knows, and done
// when that is all it needs: every step cached (or none, on a cached
// image disk) and nothing to copy out. It points from at a cached disk.
func (bd *build) cachedEnd(ctx context.Context, st *stage, startKey string, keys []string, hit int, from *source) (end stageEnd, done bool) {
	end = stageEnd{key: startKey, snapshot: from.snapshot}
	if len(keys) > 0 {
		end.key = keys[len(keys)-1]
	}
	if hit == len(keys)-1 && end.snapshot != "" && len(st.exports) == 0 {
		return end, true // nothing to run, nothing to copy out
	}
	if len(keys) == 0 && end.snapshot == "" {
		// A stage of no steps on an image: its disk is that image's.
		if id := bd.lookup(ctx, startKey); id != "" {
			end.snapshot, from.snapshot = id, id
			if len(st.exports) == 0 {
				return end, true
			}
		}
	}
	return end, false
}

// materialize makes the archives of a stage's copies from the context and
// of a recipe's files; copies from stages got theirs when those ended.
func (bd *build) materialize(st *stage) error {
	for _, s := range st.steps {
		c := s.copy
		if c == nil || c.fromStage >= 0 {
			continue
		}
		var ops []copyOp
		var err error
		switch {
		case c.files != nil:
			ops, err = fileOps(bd.job.WorkDir, c)
		case bd.job.ContextDir == "":
			err = invalid("Dockerfile line %d: %s: the build has no context", s.line, s.text)
		default:
			ops, err = contextOps(filepath.Join(bd.job.ContextDir, "context.tar.gz"), bd.job.WorkDir, c)
			if err != nil && errdefs.Code(err) == "invalid_request" {
				err = invalid("Dockerfile line %d: %s: %v", s.line, s.text, err)
			}
		}
		if err != nil {
			return err
		}
		bd.ops = append(bd.ops, ops...)
		c.ops = ops
	}
	return nil
}

// lookup finds the snapshot of a key: this build's own, or the cache's
// when it is still there.
func (bd *build) lookup(ctx context.Context, key string) string {
	if id, ok := bd.local[key]; ok {
		return id
	}
	if !bd.caching() {
		return ""
	}
	c := bd.b.cfg.Cache
	id, err := c.GetBuildCache(ctx, key, time.Now())
	if err != nil {
		if !errdefs.IsNotFound(err) {
			bd.b.log.Warn("reading the build cache", "err", err)
		}
		return ""
	}
	sn, err := bd.b.cfg.Snapshots.GetSnapshot(ctx, Owner, id)
	if err != nil || sn.State != sandbox.SnapshotReady {
		// Expired or failed: forget it.
		_ = c.DeleteBuildCache(ctx, key)
		return ""
	}
	return id
}

// sandbox starts a build sandbox from src and waits until it runs.
func (bd *build) sandbox(ctx context.Context, src source, st *stage) (*sandbox.Sandbox, guest.Handle, error) {
	cfg := bd.b.cfg
	lim := bd.job.Limits
	spec := sandbox.CreateSpec{
		Name:       "image-build",
		Labels:     map[string]string{"emberbox.build/image": bd.job.ImageID, sandbox.LabelQuotaKey: bd.job.Owner},
		VCPU:       orInt(lim.VCPU, cfg.VCPU),
		MemoryMiB:  orInt(lim.MemoryMiB, cfg.MemoryMiB),
		DiskMiB:    max(orInt(lim.DiskMiB, cfg.DiskMiB), src.minDisk),
		OnLeaseEnd: sandbox.LeaseEndDelete,
		AutoWake:   new(bool),
		Network:    &egress.Policy{Internet: true},
		Image:      src.image,
		SnapshotID: src.snapshot,
	}
	if dl, ok := ctx.Deadline(); ok {
		spec.TimeoutSeconds = int(time.Until(dl).Seconds()) + 300
	}
	if src.snapshot != "" {
		spec.Image = nil // the copy takes its image from the snapshot
	}
	sb, err := cfg.Manager.Create(ctx, Owner, spec)
	if err != nil {
		return nil, guest.Handle{}, fmt.Errorf("starting a build sandbox: %w", err)
	}
	got, err := cfg.Manager.WaitFor(ctx, Owner, sb.ID, sandbox.StateRunning, sandbox.StateStopped, sandbox.StateDeleted)
	if err == nil && got.State != sandbox.StateRunning {
		err = fmt.Errorf("it is %s (%s)", got.State, got.StopReason)
	}
	if err == nil {
		_, g, gerr := cfg.Manager.Guest(ctx, Owner, sb.ID)
		if gerr == nil {
			bd.log.Line("build", "build sandbox "+sb.ID+" running")
			return got, g, nil
		}
		err = gerr
	}
	bd.deleteSandbox(sb.ID)
	return nil, guest.Handle{}, fmt.Errorf("starting a build sandbox: %w", err)
}

func orInt(v, def int) int {
	if v > 0 {
		return v
	}
	return def
}

func (bd *build) deleteSandbox(id string) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if _, err := bd.b.cfg.Manager.Delete(ctx, Owner, id); err != nil && !errdefs.IsNotFound(err) {
		bd.b.log.Warn("deleting a build sandbox", "sandbox_id", id, "err", err)
	}
}

// capture snapshots the sandbox's disk under key: into the cache, or kept
// for this build alone.
func (bd *build) capture(ctx context.Context, g guest.Handle, id, key string) (string, error) {
	// What the guest wrote reaches the disk before the copy.
	if _, err := g.Exec(ctx, guest.ExecRequest{Argv: []string{"sync"}, User: "root"}, nil); err != nil {
		return "", fmt.Errorf("syncing the disk: %w", err)
	}
	// A cached step lives until evicted; a build's own snapshot (cache
	// off) only as long as the build, and a day if a crash forgets it.
	days := 1
	if bd.caching() {
		days = sandbox.MaxSnapshotRetentionDays
	}
	sn, err := bd.b.cfg.Snapshots.Snapshot(ctx, Owner, id, sandbox.SnapshotSpec{Name: "build-" + key[:16], Mode: sandbox.SnapshotModeDisk,
		RetentionDays: days, Labels: map[string]string{"emberbox.build/key": key[:32]}})
	if err != nil {
		return "", fmt.Errorf("capturing the disk: %w", err)
	}
	if sn.State != sandbox.SnapshotReady {
		return "", fmt.Errorf("capturing the disk: snapshot %s is %s: %s", sn.ID, sn.State, sn.Error)
	}
	if !bd.caching() {
		bd.local[key] = sn.ID
		return sn.ID, nil
	}
	c := bd.b.cfg.Cache
	old, err := c.PutBuildCache(ctx, key, sn.ID, time.Now())
	if err != nil {
		bd.local[key] = sn.ID // still this build's to use, and delete
		bd.b.log.Warn("recording a build step", "err", err)
		return sn.ID, nil
	}
	drop := []string{}
	if old != "" {
		drop = append(drop, old)
	}
	// Never below this build's own steps: a later stage may start from
	// an earlier one's end.
	if ev, err := c.EvictBuildCache(ctx, max(bd.b.cfg.CacheEntries, bd.total+len(bd.plan.stages))); err == nil {
		drop = append(drop, ev...)
	}
	for _, s := range drop {
		if err := bd.b.cfg.Snapshots.DeleteSnapshot(ctx, Owner, s); err != nil && !errdefs.IsNotFound(err) {
			bd.b.log.Warn("deleting a cached build step", "snapshot_id", s, "err", err)
		}
	}
	return sn.ID, nil
}

// runStep runs one step in the guest.
func (bd *build) runStep(ctx context.Context, g guest.Handle, s *step, baseEnv map[string]string) error {
	switch {
	case s.run != nil:
		env := map[string]string{}
		maps.Copy(env, baseEnv)
		maps.Copy(env, s.run.env)
		argv, user := asUser(s.run.user, s.run.argv)
		return bd.execAs(ctx, g, argv, s.run.cwd, env, user)
	case s.mkdir != "":
		return bd.exec(ctx, g, []string{"mkdir", "-p", "--", s.mkdir}, "/", nil)
	case s.copy != nil:
		return bd.copyIn(ctx, g, s.copy)
	}
	return nil
}

// asUser runs argv as a Dockerfile USER: root and the sandbox user through
// the agent, any other through runuser or setpriv (as root).
func asUser(user string, argv []string) ([]string, string) {
	name, group, _ := strings.Cut(user, ":")
	switch {
	case (name == "" || name == "root" || name == "0") && (group == "" || group == "root" || group == "0"):
		return argv, "root"
	case (name == "user" || name == "1000") && (group == "" || group == "user" || group == "1000"):
		return argv, "user"
	}
	if _, err := strconv.Atoi(name); err == nil {
		if group == "" {
			group = name
		}
		return append([]string{"setpriv", "--reuid", name, "--regid", group, "--clear-groups", "--"}, argv...), "root"
	}
	pre := []string{"runuser", "-u", name}
	if group != "" {
		pre = append(pre, "-g", group)
	}
	return append(append(pre, "--"), argv...), "root"
}

// exec runs argv as root, its output streamed to the log line by line.
func (bd *build) exec(ctx context.Context, g guest.Handle, argv []string, cwd string, env map[string]string) error {
	return bd.execAs(ctx, g, argv, cwd, env, "root")
}

// execAs runs argv as user ("root" or "user").
func (bd *build) execAs(ctx context.Context, g guest.Handle, argv []string, cwd string, env map[string]string, user string) error {
	out := map[string]*lineBuf{guest.EventStdout: {stream: "stdout", log: bd.log}, guest.EventStderr: {stream: "stderr", log: bd.log}}
	req := guest.ExecRequest{Argv: argv, Cwd: cwd, Env: env, User: user, Stream: true}
	if dl, ok := ctx.Deadline(); ok {
		req.TimeoutMs = max(time.Until(dl).Milliseconds(), 1)
	}
	res, err := g.Exec(ctx, req, func(ev guest.Event) error {
		if lb := out[ev.Type]; lb != nil {
			lb.write(ev.Data)
		}
		return nil
	})
	for _, lb := range out {
		lb.flush()
	}
	if err != nil {
		return err
	}
	switch {
	case res.TimedOut:
		return errors.New("timed out")
	case res.ExitCode == nil:
		return errors.New("killed")
	case *res.ExitCode != 0:
		return fmt.Errorf("exit code %d", *res.ExitCode)
	}
	return nil
}

// lineBuf turns output chunks into log lines.
type lineBuf struct {
	stream string
	log    catalog.LogSink
	buf    []byte
}

func (l *lineBuf) write(p []byte) {
	l.buf = append(l.buf, p...)
	for {
		i := bytes.IndexByte(l.buf, '\n')
		if i < 0 {
			break
		}
		l.log.Line(l.stream, strings.TrimSuffix(string(l.buf[:i]), "\r"))
		l.buf = l.buf[i+1:]
	}
	if len(l.buf) > maxLogLine {
		l.flush()
	}
}

func (l *lineBuf) flush() {
	if len(l.buf) > 0 {
		l.log.Line(l.stream, string(l.buf))
		l.buf = nil
	}
}

// copyIn unpacks a copy's archives into the guest as root, then gives
// them their owner.
func (bd *build) copyIn(ctx context.Context, g guest.Handle, c *copySpec) error {
	for _, op := range c.ops {
		if err := bd.exec(ctx, g, []string{"mkdir", "-p", "--", op.dir}, "/", nil); err != nil {
			return fmt.Errorf("making %s: %w", op.dir, err)
		}
		f, err := os.Open(op.tar)
		if err != nil {
			return err
		}
		_, err = g.Unarchive(guest.WithFileUser(ctx, "root"), op.dir, "root", op.size, f)
		f.Close()
		if err != nil {
			return fmt.Errorf("copying into %s: %w", op.dir, err)
		}
		chown := c.chown
		if c.files != nil && ownedByUser(op.dir) {
			chown = "user:user"
		}
		if chown == "" {
			continue
		}
		if !strings.Contains(chown, ":") {
			// Docker's rule: a uid alone is also the gid; a name alone
			// takes its login group.
			if _, err := strconv.Atoi(chown); err == nil {
				chown += ":" + chown
			} else {
				chown += ":"
			}
		}
		for k := 0; k < len(op.names); k += 500 {
			argv := []string{"chown", "-hR", "--", chown}
			for _, n := range op.names[k:min(k+500, len(op.names))] {
				argv = append(argv, path.Join(op.dir, n))
			}
			if err := bd.exec(ctx, g, argv, "/", nil); err != nil {
				return fmt.Errorf("chown %s: %w", chown, err)
			}
		}
	}
	return nil
}

// export copies out of a finished stage what later stages COPY --from it.
func (bd *build) export(ctx context.Context, g guest.Handle, st *stage) error {
	rctx := guest.WithFileUser(ctx, "root")
	for _, c := range st.exports {
		rename := len(c.srcs) == 1 && !strings.HasSuffix(c.dest, "/")
		dest := strings.TrimSuffix(c.dest, "/")
		if dest == "" {
			dest = "/"
		}
		for _, src := range c.srcs {
			p := path.Clean("/" + src)
			fe, err := g.Stat(rctx, p)
			if err != nil {
				return invalid("COPY --from %s: %v", src, err)
			}
			var ops []copyOp
			if fe.Type == typeDirectory {
				r, err := g.Archive(rctx, p, "root", false, nil)
				if err != nil {
					return fmt.Errorf("copying %s out of its stage: %w", src, err)
				}
				ops, err = stagedTar(bd.job.WorkDir, c, dest, "", r, maxCopyBytes)
				r.Close()
				if err != nil {
					return err
				}
			} else {
				_, r, err := g.ReadFile(rctx, p)
				if err != nil {
					return fmt.Errorf("copying %s out of its stage: %w", src, err)
				}
				dir, name := dest, path.Base(p)
				if rename {
					dir, name = path.Dir(dest), path.Base(dest)
				}
				ops, err = singleFileOp(bd.job.WorkDir, c, dir, name, fe, r)
				r.Close()
				if err != nil {
					return err
				}
			}
			bd.ops = append(bd.ops, ops...)
			c.ops = append(c.ops, ops...)
		}
	}
	return nil
}
