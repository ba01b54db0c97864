package sandbox

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"sort"
	"time"

	"github.com/emberbox/emberbox/internal/egress"
	"github.com/emberbox/emberbox/internal/errdefs"
	"github.com/emberbox/emberbox/internal/faultpoint"
)

// Create implements api.Manager.Create.
func (m *Manager) Create(ctx context.Context, owner string, spec CreateSpec) (_ *Sandbox, err error) {
	defer func() { m.outcomes.op("create", err) }()
	var source *Snapshot
	if spec.SnapshotID != "" {
		var err error
		if source, err = m.Snapshots.copySource(ctx, owner, &spec); err != nil {
			return nil, err
		}
		defer m.Snapshots.unpin(source.ID) // recorded as its copy by then, or failed
	}
	sb, err := m.newRecord(owner, spec, source)
	if err != nil {
		return nil, err
	}
	pol := m.cfg.EgressDefault
	if spec.Network != nil {
		pol = *spec.Network
	}
	compiled, err := egress.Compile(pol)
	if err != nil {
		return nil, errdefs.New(errdefs.ErrInvalidArgument, "invalid_request", "network: %v", err)
	}
	if err := m.cfg.Limits.check(spec); err != nil {
		return nil, err
	}
	steps := newTimeline()
	var u undo
	defer u.run()
	// Held from here until the record says stopped or deleted (account).
	if err := m.cfg.Admission.Reserve(claim(sb)); err != nil {
		return nil, err
	}
	u.add(func() { m.cfg.Admission.Release(sb.ID) })
	steps.mark("admit")
	if len(spec.Volumes) > 0 {
		if m.cfg.Volumes == nil {
			return nil, errdefs.New(errdefs.ErrUnavailable, "volumes_unavailable", "this server does not offer volumes")
		}
		if err := m.cfg.Volumes.Claim(ctx, sb, spec.Volumes); err != nil {
			return nil, err
		}
	}
	u.add(func() { m.volumes.release(sb.ID) })
	created := &TrailEntry{Type: "created", Message: "sandbox created", Data: map[string]any{"vcpu": sb.VCPU, "memoryMiB": sb.MemoryMiB}}
	if err := m.cfg.Store.InsertSandbox(ctx, sb, spec.IdempotencyKey, created); err != nil {
		return nil, err
	}
	// The record holds the claim and the volumes now: recording it
	// stopped gives them back (account, markStopped). Never leave a
	// record that looks like it is starting.
	u.keep()
	u.add(func() { m.finish(newInstance(m.ctx, sb.ID), ReasonStartFailed) })
	if err := m.cfg.Store.PutNetwork(ctx, sb.ID, &Network{Policy: compiled.Policy, Version: 1, UpdatedAt: sb.CreatedAt}); err != nil {
		return nil, err
	}
	u.keep()
	steps.mark("record")
	in := newInstance(m.ctx, sb.ID)
	in.steps = steps
	in.gate = m.gates.open(sb.ID, compiled, 1)
	m.mu.Lock()
	m.live[sb.ID] = in
	m.mu.Unlock()
	m.envs.remember(sb.ID, spec.Env)
	faultpoint.Hit("create.recorded")
	if !m.spawn(m.bootPath(in, sb, source, spec)) {
		// Shutting down: the record stays starting with no VM, and the
		// next start records it stopped (lost_on_restart).
		close(in.bootDone)
	}
	return sb, nil
}

func newID() string {
	var b [10]byte
	_, _ = rand.Read(b[:])
	return "sbx_" + hex.EncodeToString(b[:])
}

// check refuses a spec beyond the operator's limits of one sandbox,
// naming each field and its limit.
func (lim Limits) check(spec CreateSpec) error {
	var issues []map[string]string
	over := func(field string, v, max int, unit string) {
		if max > 0 && v > max {
			issues = append(issues, map[string]string{"path": field, "message": fmt.Sprintf("must be at most %d%s on this server", max, unit)})
		}
	}
	over("diskMiB", spec.DiskMiB, lim.MaxDiskMiB, "")
	over("memoryMiB", spec.MemoryMiB, lim.MaxMemoryMiB, "")
	over("timeoutSeconds", spec.TimeoutSeconds, int(lim.MaxLifetime/time.Second), " (the maximum lifetime of a sandbox)")
	over("vcpu", spec.VCPU, lim.MaxVCPU, "")
	if len(issues) == 0 {
		return nil
	}
	msg := "The request is not valid."
	if len(issues) == 1 {
		msg = issues[0]["path"] + ": " + issues[0]["message"]
	}
	e := errdefs.New(errdefs.ErrInvalidArgument, "invalid_request", "%s", msg).
		WithHint("Ask for a sandbox within the limits in details.issues.")
	e.Details = map[string]any{"issues": issues}
	return e
}

// newRecord is the record of a sandbox spec asks for, made from the
// snapshot source if not nil, checked against its image.
func (m *Manager) newRecord(owner string, spec CreateSpec, source *Snapshot) (*Sandbox, error) {
	names := make([]string, 0, len(spec.Env))
	for k := range spec.Env {
		names = append(names, k)
	}
	sort.Strings(names)
	sb := &Sandbox{
		ID: newID(), OwnerKeyID: owner, Name: spec.Name, Labels: spec.Labels, EnvNames: names,
		VCPU: spec.VCPU, MemoryMiB: spec.MemoryMiB, DiskMiB: spec.DiskMiB,
		TimeoutSeconds: spec.TimeoutSeconds, OnLeaseEnd: spec.OnLeaseEnd,
		State: StateStarting, Accel: m.cfg.Driver.Accel(), Driver: m.cfg.Driver.Name(),
		CreatedAt: m.now(), AutoWake: spec.AutoWake == nil || *spec.AutoWake,
		IdlePauseSeconds: spec.IdlePauseSeconds, Persistent: spec.Persistent, SnapshotID: spec.SnapshotID,
	}
	switch {
	case source != nil:
		sb.ImageID, sb.Rootfs = source.ImageID, source.Rootfs
	case spec.Image != nil:
		if spec.Image.Rootfs == "" {
			return nil, fmt.Errorf("create: image %s has no root disk", spec.Image.ID)
		}
		if spec.DiskMiB < spec.Image.MinDiskMiB {
			return nil, errdefs.New(errdefs.ErrInvalidArgument, "invalid_request",
				"diskMiB: image %s needs a disk of at least %d MiB", spec.Image.ID, spec.Image.MinDiskMiB).
				WithHint("ask for a larger diskMiB, or leave it out")
		}
		sb.ImageID, sb.Rootfs = spec.Image.ID, spec.Image.Rootfs
	}
	return sb, nil
}

// bootPath is how a new sandbox comes up: as a copy of its snapshot, as
// a copy of its image's template if one is built, else by a boot.
func (m *Manager) bootPath(in *instance, sb *Sandbox, source *Snapshot, spec CreateSpec) func() {
	if source != nil {
		return func() { m.bootCopy(in.ctx, in, sb, source, spec.Env) }
	}
	minDisk := 0
	if spec.Image != nil {
		minDisk = spec.Image.MinDiskMiB
	}
	if dir, ok := m.Templates.pin(sb.Rootfs, shapeOf(sb), minDisk); ok {
		return func() { m.bootTemplate(in.ctx, in, sb, dir, spec.Env) }
	}
	// The template is built once this boot is done, not beside it.
	return func() {
		m.boot(in.ctx, in, sb, spec.Env, false)
		m.Templates.want(sb.Rootfs, shapeOf(sb), minDisk)
	}
}
