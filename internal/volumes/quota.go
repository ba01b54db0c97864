package volumes

import (
	"context"
	"fmt"
	"os"
	"syscall"

	"github.com/emberbox/emberbox/internal/admission"
	"github.com/emberbox/emberbox/internal/errdefs"
)

// Every byte a tenant makes this package keep has a bound: a volume's size
// is a claim in the admission ledger (the host's disk beside the
// sandboxes', the key's disk and volume quotas) from its create to its
// delete, since its sparse file grows to that size as guests write; a
// backup counts against its key's backup quotas, and every copy (backup,
// restore) must leave the data dir's free-space reserve.

// Admission is the ledger volumes are admitted by; *admission.Ledger
// implements it.
type Admission interface {
	Reserve(c admission.Claim) error
	Replace(c admission.Claim) error
	Restore(c admission.Claim)
	Release(id string) bool
}

var _ Admission = (*admission.Ledger)(nil)

// BackupQuota bounds one key's backups (creating or ready). A zero field
// is no limit.
type BackupQuota struct {
	Count     int   // backups per key
	MiB       int64 // their volumes' sizes per key
	PerVolume int   // backups of one volume
}

// Default backup quotas (the flags of `emberbox serve`).
const (
	DefaultBackupCount     = 50
	DefaultBackupMiB       = 128 << 10
	DefaultBackupPerVolume = 10
)

func volumeClaim(v *Volume) admission.Claim {
	return admission.Claim{ID: v.ID, Owner: v.OwnerKeyID, Volume: true, Resources: admission.Resources{DiskMiB: int64(v.SizeMiB)}}
}

// Recover holds every live volume's size in the ledger again, unchecked,
// as sandboxes are at a start: the ledger is memory only.
func (s *Service) Recover(ctx context.Context) error {
	if s.cfg.Admission == nil {
		return nil
	}
	live, err := s.cfg.Store.LiveVolumes(ctx)
	if err != nil {
		return fmt.Errorf("listing volumes for admission: %w", err)
	}
	for _, v := range live {
		s.cfg.Admission.Restore(volumeClaim(v))
	}
	s.log.Info("volumes held in admission", "count", len(live))
	return nil
}

// admit holds v's size in the ledger, or refuses it (409 no_capacity,
// 429 quota_exceeded). Without a ledger, a key keeps at most MaxPerOwner
// volumes.
func (s *Service) admit(ctx context.Context, v *Volume) error {
	if s.cfg.Admission != nil {
		return s.cfg.Admission.Reserve(volumeClaim(v))
	}
	if _, next, err := s.cfg.Store.ListVolumes(ctx, ListOptions{OwnerKeyID: v.OwnerKeyID, Limit: MaxPerOwner}); err != nil {
		return err
	} else if next != "" {
		return errdefs.New(errdefs.ErrConflict, admission.CodeQuotaExceeded, "a key keeps at most %d volumes", MaxPerOwner)
	}
	return nil
}

// release gives back volume id's size.
func (s *Service) release(id string) {
	if s.cfg.Admission != nil {
		s.cfg.Admission.Release(id)
	}
}

// regrow holds v at its new size in place of its old one, or refuses it
// leaving the old size held.
func (s *Service) regrow(v *Volume, sizeMiB int) error {
	if s.cfg.Admission == nil {
		return nil
	}
	grown := *v
	grown.SizeMiB = sizeMiB
	return s.cfg.Admission.Replace(volumeClaim(&grown))
}

// unregrow puts v's old size back after a grow that failed on the host.
func (s *Service) unregrow(v *Volume) {
	if s.cfg.Admission != nil {
		s.cfg.Admission.Restore(volumeClaim(v))
	}
}

// checkBackupQuota refuses a new backup of volume v when its key, or v,
// is at a backup quota (429 quota_exceeded naming the quota and its flag).
func (s *Service) checkBackupQuota(ctx context.Context, bs BackupStore, v *Volume) error {
	q := s.cfg.BackupQuota
	if q == (BackupQuota{}) {
		return nil
	}
	key, err := bs.BackupUsage(ctx, v.OwnerKeyID, "")
	if err != nil {
		return err
	}
	if err := overBackups("volumeBackups", int64(key.Count), 1, int64(q.Count)); err != nil {
		return err
	}
	if err := overBackups("volumeBackupMiB", key.SizeMiB, int64(v.SizeMiB), q.MiB); err != nil {
		return err
	}
	if q.PerVolume <= 0 {
		return nil
	}
	one, err := bs.BackupUsage(ctx, v.OwnerKeyID, v.ID)
	if err != nil {
		return err
	}
	return overBackups("backupsPerVolume", int64(one.Count), 1, int64(q.PerVolume))
}

var backupQuotaNames = map[string]struct{ noun, flag string }{
	"volumeBackups":    {"%d volume backups", "--quota-volume-backups"},
	"volumeBackupMiB":  {"%d MiB of volume backups", "--quota-volume-backup-mib"},
	"backupsPerVolume": {"%d backups of one volume", "--quota-backups-per-volume"},
}

func overBackups(what string, used, asked, limit int64) error {
	if limit <= 0 || used+asked <= limit {
		return nil
	}
	n := backupQuotaNames[what]
	e := errdefs.New(errdefs.ErrConflict, admission.CodeQuotaExceeded, "this key's quota of "+n.noun+" is reached (%d in use, %d asked)",
		limit, used, asked).
		WithHint("Delete backups of this key (or let them expire), or ask the operator to raise " + n.flag + ".")
	e.Details = map[string]any{"quota": what, "limit": limit, "used": used, "requested": asked}
	e.RetryAfter = admission.ResourceRetryAfter
	return e
}

// checkRoomToCopy refuses a copy of src (a backup or a restore) that would
// leave less than the reserve free on the data dir's filesystem: the copy
// writes at most src's allocated blocks (a clone writes none).
func (s *Service) checkRoomToCopy(src string) error {
	if s.cfg.DiskFreeMiB == nil {
		return nil
	}
	fi, err := os.Stat(src)
	if err != nil {
		return fmt.Errorf("sizing the copy: %w", err)
	}
	need := fi.Size()
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		need = min(need, st.Blocks*512)
	}
	free, err := s.cfg.DiskFreeMiB()
	if err != nil {
		return fmt.Errorf("reading the data dir's free space: %w", err)
	}
	if free-(need+1<<20-1)>>20 >= s.cfg.DiskReserveMiB {
		return nil
	}
	e := errdefs.New(errdefs.ErrConflict, admission.CodeNoCapacity, "the server has no room to copy this volume now (disk space)").
		WithHint("Delete backups or volumes you no longer need, or retry later.")
	e.Details = map[string]any{"resource": "diskMiB"}
	e.RetryAfter = admission.ResourceRetryAfter
	return e
}
