package vmmtest

import (
	"context"
	"errors"

	"github.com/emberbox/emberbox/internal/vmm"
)

var errTODO = errors.New("vmmtest: pause and snapshots are being built")

func (d *Driver) Resume(ctx context.Context, spec vmm.Spec) (vmm.Machine, error) { return nil, errTODO }
func (d *Driver) Saved(spec vmm.Spec) bool                                       { return false }
func (d *Driver) Clone(ctx context.Context, snapDir string, spec vmm.Spec) error {
	return errTODO
}
func (m *Machine) Pause(ctx context.Context) error { return errTODO }
func (m *Machine) Snapshot(ctx context.Context, dir string, memory bool) (vmm.SnapshotInfo, error) {
	return vmm.SnapshotInfo{}, errTODO
}
func (m *Machine) Continue(ctx context.Context) error { return errTODO }
