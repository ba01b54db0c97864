package sandbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/emberbox/emberbox/internal/errdefs"
)

// MaxForkCount bounds the copies one fork makes.
const MaxForkCount = 10

// ForkSpec is a validated fork request.
type ForkSpec struct {
	Count  int // 1..MaxForkCount
	Name   string
	Labels map[string]string
	// KeepSnapshot keeps the memory snapshot the copies were made from;
	// otherwise it is deleted (its files stay while a copy exists).
	KeepSnapshot bool
}

// Fork implements api.Manager.Fork: a memory snapshot of the sandbox, then
// Count copies of it, answered once they all run. Copies are admitted as
// creates are; if one is refused, the copies made so far are deleted and
// the refusal answered.
func (m *Manager) Fork(ctx context.Context, owner, id string, spec ForkSpec) (_ []*Sandbox, err error) {
	defer func() { m.outcomes.op("fork", err) }()
	if spec.Count < 1 || spec.Count > MaxForkCount {
		return nil, errdefs.New(errdefs.ErrInvalidArgument, "invalid_request", "count must be from 1 to %d", MaxForkCount)
	}
	src, err := m.Get(ctx, owner, id)
	if err != nil {
		return nil, err
	}
	sn, err := m.Snapshots.Snapshot(ctx, owner, id, SnapshotSpec{Mode: SnapshotModeMemory,
		Labels: map[string]string{"emberbox.fork": id}, RetentionDays: 1})
	if err != nil {
		return nil, err
	}
	// The snapshot goes once the copies are made, or failed, unless it is
	// kept (its files stay while a copy uses them).
	defer m.Snapshots.dropForkSnapshot(ctx, sn.ID, spec.KeepSnapshot)
	if sn.State != SnapshotReady {
		e := errdefs.New(errdefs.ErrConflict, "snapshot_failed", "the fork's snapshot of %s failed", id)
		e.Details = map[string]any{"snapshotId": sn.ID}
		return nil, e
	}
	return m.Snapshots.copies(ctx, owner, src, sn, spec)
}

// copies makes spec.Count sandboxes from memory snapshot sn of src, with
// src's settings and egress policy, and answers once they all run. Copies
// are admitted as creates are; if one is refused, the copies made so far
// are deleted and the refusal answered.
func (sp *Snapshots) copies(ctx context.Context, owner string, src *Sandbox, sn *Snapshot, spec ForkSpec) (_ []*Sandbox, err error) {
	id := src.ID
	var u undo
	defer u.run()
	var copies []*Sandbox
	for i := range spec.Count {
		name := spec.Name
		if name != "" && spec.Count > 1 {
			name = fmt.Sprintf("%s-%d", spec.Name, i+1)
		}
		cs := CreateSpec{Name: name, Labels: spec.Labels, SnapshotID: sn.ID, OnLeaseEnd: src.OnLeaseEnd,
			TimeoutSeconds: src.TimeoutSeconds, AutoWake: &src.AutoWake, IdlePauseSeconds: src.IdlePauseSeconds,
			Persistent: src.Persistent}
		if n, err := sp.records.GetNetwork(ctx, id); err == nil {
			pol := n.Policy
			cs.Network = &pol // a copy gets its own gate with its source's policy
		}
		sb, err := sp.createCopy(ctx, owner, cs, copies)
		if err != nil {
			return nil, err
		}
		if sp.copied != nil {
			sp.copied(id, sb.ID)
		}
		u.add(func() {
			if _, err := sp.host.delete(context.WithoutCancel(ctx), sb.ID, ReasonDeleted); err != nil {
				sp.log.Error("deleting a copy of a failed fork", "sandbox_id", sb.ID, "err", err)
			}
		})
		copies = append(copies, sb)
	}
	// The copies stay, and are waited for below.
	u.keep()
	wctx, cancel := context.WithTimeout(ctx, 2*sp.bootTimeout+10*time.Second)
	defer cancel()
	for i, c := range copies {
		got, err := sp.host.WaitFor(wctx, owner, c.ID, StateRunning)
		if err != nil {
			return nil, err
		}
		copies[i] = got
	}
	return copies, nil
}

// createCopy creates one copy. More copies than the server boots at once
// are made in turn: refused for boots alone, it waits for the copies made
// so far to run (or for the refusal's retry time when they all do) and
// tries again, for at most two boots' time.
func (sp *Snapshots) createCopy(ctx context.Context, owner string, cs CreateSpec, made []*Sandbox) (*Sandbox, error) {
	deadline := time.Now().Add(2*sp.bootTimeout + 10*time.Second)
	for {
		sb, err := sp.host.Create(ctx, owner, cs)
		var ce *errdefs.CodedError
		if err == nil || !errors.As(err, &ce) || !bootsFull(ce) || time.Now().After(deadline) {
			return sb, err
		}
		waited := false
		for _, c := range made {
			if got, gerr := sp.host.Get(ctx, owner, c.ID); gerr == nil && got.State == StateStarting {
				wctx, cancel := context.WithDeadline(ctx, deadline)
				_, _ = sp.host.WaitFor(wctx, owner, c.ID, StateRunning)
				cancel()
				waited = true
				break
			}
		}
		if !waited {
			select {
			case <-ctx.Done():
				return nil, ctx.Err()
			case <-time.After(max(ce.RetryAfter, 100*time.Millisecond)):
			}
		}
	}
}

// bootsFull reports whether a refusal is for boots under way alone, which
// end by themselves.
func bootsFull(ce *errdefs.CodedError) bool {
	return ce.Details["resource"] == "boots" || ce.Details["quota"] == "boots"
}

// dropForkSnapshot deletes the snapshot a fork made unless it is kept.
func (sp *Snapshots) dropForkSnapshot(ctx context.Context, id string, keep bool) {
	if keep {
		return
	}
	ctx = context.WithoutCancel(ctx)
	if err := sp.markSnapshotDeleted(ctx, id); err != nil {
		sp.log.Error("deleting a fork's snapshot", "snapshot_id", id, "err", err)
	}
	sp.RemoveUnusedSnapshots(ctx)
}
