package api

import (
	"context"
	"fmt"
	"time"

	"github.com/emberbox/emberbox/internal/errdefs"
	"github.com/emberbox/emberbox/internal/sandbox"
)

// The fake manager's checkpoints: kept per sandbox in memory, so that the
// checkpoint routes' decoders and answers are tested and fuzzed like the
// rest (a real VM's are internal/integration's TestCheckpoints).

func checkpointNotFound(id string) error {
	return errdefs.New(errdefs.ErrNotFound, "checkpoint_not_found", "no checkpoint %q", id)
}

func (m *fakeManager) Checkpoint(ctx context.Context, owner, id, label string, wait bool) (*sandbox.Snapshot, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	sb, err := m.getLocked(owner, id)
	if err != nil {
		return nil, err
	}
	if m.checkpoints == nil {
		m.checkpoints = map[string]*sandbox.Snapshot{}
	}
	now := time.Now()
	cp := &sandbox.Snapshot{ID: fmt.Sprintf("ckpt_%020d", len(m.checkpoints)+1), OwnerKeyID: owner, Name: label,
		SourceSandboxID: id, CheckpointOf: id, Mode: sandbox.SnapshotModeMemory, State: sandbox.SnapshotReady,
		VCPU: sb.VCPU, MemoryMiB: sb.MemoryMiB, DiskMiB: sb.DiskMiB, SizeBytes: 1 << 20, CreatedAt: now, ReadyAt: &now}
	if !wait {
		cp.State, cp.ReadyAt = sandbox.SnapshotCapturing, nil
	}
	m.checkpoints[cp.ID] = cp
	c := *cp
	return &c, nil
}

func (m *fakeManager) checkpointLocked(owner, id, cid string) (*sandbox.Snapshot, error) {
	if _, err := m.getLocked(owner, id); err != nil {
		return nil, err
	}
	cp := m.checkpoints[cid]
	if cp == nil || cp.CheckpointOf != id {
		return nil, checkpointNotFound(cid)
	}
	return cp, nil
}

func (m *fakeManager) ListCheckpoints(ctx context.Context, owner, id string) ([]*sandbox.Snapshot, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, err := m.getLocked(owner, id); err != nil {
		return nil, err
	}
	var out []*sandbox.Snapshot
	for _, cp := range m.checkpoints {
		if cp.CheckpointOf == id {
			c := *cp
			out = append(out, &c)
		}
	}
	return out, nil
}

func (m *fakeManager) GetCheckpoint(ctx context.Context, owner, id, cid string) (*sandbox.Snapshot, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	cp, err := m.checkpointLocked(owner, id, cid)
	if err != nil {
		return nil, err
	}
	c := *cp
	return &c, nil
}

func (m *fakeManager) DeleteCheckpoint(ctx context.Context, owner, id, cid string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, err := m.checkpointLocked(owner, id, cid); err != nil {
		return err
	}
	delete(m.checkpoints, cid)
	return nil
}

func (m *fakeManager) RestoreCheckpoint(ctx context.Context, owner, id, cid string, keep bool) (*sandbox.Sandbox, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, err := m.checkpointLocked(owner, id, cid); err != nil {
		return nil, err
	}
	sb, _ := m.getLocked(owner, id)
	m.lastRestore = cid
	return clone(sb), nil
}

func (m *fakeManager) BranchCheckpoint(ctx context.Context, owner, id, cid string, spec sandbox.ForkSpec) ([]*sandbox.Sandbox, error) {
	m.mu.Lock()
	cp, err := m.checkpointLocked(owner, id, cid)
	m.mu.Unlock()
	if err != nil {
		return nil, err
	}
	copies, err := m.Fork(ctx, owner, id, spec)
	for _, c := range copies {
		c.SnapshotID = cp.ID
	}
	return copies, err
}
