package volumes

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/emberbox/emberbox/internal/errdefs"
)

// Backups are copies of a volume's file kept on this server under
// <data>/volume-backups/<id>/disk.raw: a copy-on-write clone (FICLONE) where
// the data dir's filesystem has them (btrfs, XFS), else a sparse copy of the
// data extents (ext4). An attached volume's filesystem is frozen in the
// guest (FIFREEZE, which flushes it first) for the copy, so a backup is
// always a clean filesystem. A restore is a new volume copied the same way.

// How a backup's bytes were copied (Backup.Method).
const (
	MethodClone      = "clone"
	MethodSparseCopy = "sparse-copy"
)

// Bounds of backups.
const (
	DefaultBackupRetentionDays = 7
	MaxBackupRetentionDays     = 365
	// backupSweepEvery is how often expired backups are removed.
	backupSweepEvery = 10 * time.Minute
)

func (s *Service) backupDir(id string) string {
	return filepath.Join(s.cfg.DataDir, "volume-backups", id)
}

func (s *Service) backupFile(id string) string { return filepath.Join(s.backupDir(id), "disk.raw") }

func (s *Service) backups() (BackupStore, error) {
	if s.cfg.Backups == nil {
		return nil, errdefs.New(errdefs.ErrUnavailable, "volume_backups_unavailable", "this server keeps no volume backups")
	}
	return s.cfg.Backups, nil
}

// lock serializes what changes one volume's holder or reads its whole file
// (attach, detach, backup, resize, delete), and, by "backups:<key>", the
// start of one key's backups.
func (s *Service) lock(id string) func() {
	m, _ := s.locks.LoadOrStore(id, &sync.Mutex{})
	mu := m.(*sync.Mutex)
	mu.Lock()
	return mu.Unlock
}

// Backup copies owner's volume now and answers once the copy is ready.
func (s *Service) Backup(ctx context.Context, owner, id, name string, retentionDays int) (*Backup, error) {
	bs, err := s.backups()
	if err != nil {
		return nil, err
	}
	if retentionDays == 0 {
		retentionDays = DefaultBackupRetentionDays
	}
	if retentionDays < 1 || retentionDays > MaxBackupRetentionDays {
		return nil, errdefs.New(errdefs.ErrInvalidArgument, "invalid_request", "retentionDays must be from 1 to %d", MaxBackupRetentionDays)
	}
	defer s.lock(id)()
	v, err := s.Get(ctx, owner, id)
	if err != nil {
		return nil, err
	}
	if v.State == StateDeleted {
		return nil, errdefs.New(errdefs.ErrNotFound, "volume_not_found", "no volume %s", id)
	}
	if err := s.checkRoomToCopy(s.file(id)); err != nil {
		return nil, err
	}
	b, err := s.beginBackup(ctx, bs, v, name, retentionDays)
	if err != nil {
		return nil, err
	}
	if v.State == StateAttached {
		thaw, err := s.freeze(ctx, owner, v)
		if err != nil {
			return s.failBackup(b, fmt.Errorf("freezing the guest's filesystem: %w", err))
		}
		defer thaw()
		b.Consistent = "frozen"
	}
	method, err := s.copyInto(s.backupDir(b.ID), s.backupFile(b.ID), s.file(id), int64(v.SizeMiB)<<20)
	if err != nil {
		return s.failBackup(b, err)
	}
	ready := time.Now().UTC()
	b.State, b.Method, b.ReadyAt = BackupReady, method, &ready
	if err := bs.PutBackup(context.Background(), b); err != nil {
		return nil, err
	}
	return b, nil
}

// beginBackup records a backup of v (creating) if v's key is within its
// backup quotas. One key's checks and records are serialized, so two
// backups at once cannot both take the last place.
func (s *Service) beginBackup(ctx context.Context, bs BackupStore, v *Volume, name string, retentionDays int) (*Backup, error) {
	defer s.lock("backups:" + v.OwnerKeyID)()
	if err := s.checkBackupQuota(ctx, bs, v); err != nil {
		return nil, err
	}
	now := time.Now().UTC()
	b := &Backup{ID: newID("vbk_"), VolumeID: v.ID, OwnerKeyID: v.OwnerKeyID, Name: name, SizeMiB: v.SizeMiB, State: BackupCreating,
		Consistent: "detached", CreatedAt: now, ExpiresAt: now.Add(time.Duration(retentionDays) * 24 * time.Hour)}
	if err := bs.PutBackup(ctx, b); err != nil {
		return nil, err
	}
	return b, nil
}

// freeze freezes the filesystem of an attached volume in its guest and
// returns the thaw.
func (s *Service) freeze(ctx context.Context, owner string, v *Volume) (func(), error) {
	if s.guests == nil {
		return nil, errdefs.New(errdefs.ErrUnavailable, "volumes_unavailable", "volumes are not set up")
	}
	_, g, err := s.guests.Guest(ctx, owner, v.SandboxID)
	if err != nil {
		return nil, err
	}
	vg, ok := g.Volumes, g.Volumes != nil
	if !ok {
		return nil, errdefs.New(errdefs.ErrUnavailable, "volumes_unavailable", "this sandbox's agent cannot freeze volumes")
	}
	fctx, cancel := context.WithTimeout(ctx, attachTimeout)
	defer cancel()
	if err := vg.FreezeVolume(fctx, v.AttachmentID, true); err != nil {
		return nil, err
	}
	return func() {
		tctx, cancel := context.WithTimeout(context.Background(), attachTimeout)
		defer cancel()
		if err := vg.FreezeVolume(tctx, v.AttachmentID, false); err != nil {
			s.log.Warn("thawing a volume after its backup (the guest thaws it by itself later)", "volume_id", v.ID, "err", err)
		}
	}, nil
}

func (s *Service) failBackup(b *Backup, err error) (*Backup, error) {
	b.State, b.Error = BackupFailed, errText(err)
	_ = os.RemoveAll(s.backupDir(b.ID))
	if perr := s.cfg.Backups.PutBackup(context.Background(), b); perr != nil {
		s.log.Error("recording a failed backup", "backup_id", b.ID, "err", perr)
	}
	return nil, fmt.Errorf("backing up volume %s: %w", b.VolumeID, err)
}

// copyInto makes dir and copies src (size bytes) to the new file dst.
func (s *Service) copyInto(dir, dst, src string, size int64) (string, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", err
	}
	in, err := os.Open(src)
	if err != nil {
		return "", err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return "", err
	}
	method, err := copyFile(out, in, size)
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		_ = os.RemoveAll(dir)
		return "", fmt.Errorf("copying the volume: %w", err)
	}
	return method, nil
}

// GetBackup returns owner's backup.
func (s *Service) GetBackup(ctx context.Context, owner, id string) (*Backup, error) {
	bs, err := s.backups()
	if err != nil {
		return nil, err
	}
	b, err := bs.GetBackup(ctx, id)
	if err != nil {
		return nil, err
	}
	if b.OwnerKeyID != owner {
		return nil, errdefs.New(errdefs.ErrNotFound, "backup_not_found", "no backup %s", id)
	}
	return b, nil
}

// ListBackups returns a page of backups.
func (s *Service) ListBackups(ctx context.Context, opts BackupListOptions) ([]*Backup, string, error) {
	bs, err := s.backups()
	if err != nil {
		return nil, "", err
	}
	return bs.ListBackups(ctx, opts)
}

// DeleteBackup removes a backup and its file.
func (s *Service) DeleteBackup(ctx context.Context, owner, id string) (*Backup, error) {
	b, err := s.GetBackup(ctx, owner, id)
	if err != nil {
		return nil, err
	}
	return b, s.dropBackup(ctx, b)
}

func (s *Service) dropBackup(ctx context.Context, b *Backup) error {
	if b.State == BackupDeleted {
		return nil
	}
	if err := os.RemoveAll(s.backupDir(b.ID)); err != nil {
		return fmt.Errorf("removing backup %s: %w", b.ID, err)
	}
	b.State = BackupDeleted
	return s.cfg.Backups.PutBackup(ctx, b)
}

// restore fills the new volume v's file from owner's ready backup.
func (s *Service) restore(ctx context.Context, owner, backupID string, v *Volume) error {
	b, err := s.GetBackup(ctx, owner, backupID)
	if err != nil {
		return err
	}
	if b.State != BackupReady {
		return errdefs.New(errdefs.ErrConflict, "backup_not_ready", "backup %s is %s", b.ID, b.State)
	}
	if err := s.checkRoomToCopy(s.backupFile(b.ID)); err != nil {
		return err
	}
	v.SizeMiB = b.SizeMiB
	_, err = s.copyInto(s.dir(v.ID), s.file(v.ID), s.backupFile(b.ID), int64(b.SizeMiB)<<20)
	return err
}

// Run removes expired backups until ctx ends.
func (s *Service) Run(ctx context.Context) {
	if s.cfg.Backups == nil {
		return
	}
	t := time.NewTicker(backupSweepEvery)
	defer t.Stop()
	for {
		expired, err := s.cfg.Backups.ExpiredBackups(ctx, time.Now())
		if err != nil && ctx.Err() == nil {
			s.log.Warn("listing expired volume backups", "err", err)
		}
		for _, b := range expired {
			if err := s.dropBackup(ctx, b); err != nil {
				s.log.Warn("removing an expired volume backup", "backup_id", b.ID, "err", err)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
