// Package volumestest is an in-memory volumes.Store for tests, with the
// same rules of who holds a volume as the SQLite one.
package volumestest

import (
	"context"
	"sort"
	"sync"
	"time"

	"github.com/emberbox/emberbox/internal/errdefs"
	"github.com/emberbox/emberbox/internal/volumes"
)

// Store is an in-memory volumes.Store.
type Store struct {
	mu   sync.Mutex
	vols map[string]*volumes.Volume
	atts map[string]*volumes.Attachment
}

// New returns an empty Store.
func New() *Store {
	return &Store{vols: map[string]*volumes.Volume{}, atts: map[string]*volumes.Attachment{}}
}

var _ volumes.Store = (*Store)(nil)

func notFound(id string) error {
	return errdefs.New(errdefs.ErrNotFound, "volume_not_found", "no volume %s", id)
}

func (s *Store) InsertVolume(_ context.Context, v *volumes.Volume) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := *v
	s.vols[v.ID] = &c
	return nil
}

func (s *Store) GetVolume(_ context.Context, id string) (*volumes.Volume, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	v, ok := s.vols[id]
	if !ok {
		return nil, notFound(id)
	}
	c := *v
	return &c, nil
}

func (s *Store) ListVolumes(_ context.Context, o volumes.ListOptions) ([]*volumes.Volume, string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []*volumes.Volume
	for _, v := range s.vols {
		if v.OwnerKeyID != o.OwnerKeyID || (o.State == "" && v.State == volumes.StateDeleted) ||
			(o.State != "" && v.State != o.State) || (o.Name != "" && v.Name != o.Name) || (o.Cursor != "" && v.ID >= o.Cursor) {
			continue
		}
		c := *v
		out = append(out, &c)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID > out[j].ID })
	limit := o.Limit
	if limit <= 0 || limit > 100 {
		limit = 50
	}
	if len(out) > limit {
		return out[:limit], out[limit-1].ID, nil
	}
	return out, "", nil
}

func (s *Store) LiveVolumes(_ context.Context) ([]*volumes.Volume, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []*volumes.Volume
	for _, v := range s.vols {
		if v.State != volumes.StateDeleted {
			c := *v
			out = append(out, &c)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, nil
}

func (s *Store) UpdateVolume(_ context.Context, id, from string, sizeMiB int, state string) (*volumes.Volume, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	v, ok := s.vols[id]
	if !ok || v.State == volumes.StateDeleted {
		return nil, notFound(id)
	}
	if v.State != from {
		return nil, errdefs.New(errdefs.ErrConflict, "volume_attached", "volume %s is attached to sandbox %s", id, v.SandboxID)
	}
	v.SizeMiB, v.State, v.UpdatedAt = sizeMiB, state, time.Now()
	c := *v
	return &c, nil
}

func (s *Store) BeginAttach(_ context.Context, a *volumes.Attachment) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	v, ok := s.vols[a.VolumeID]
	if !ok || v.OwnerKeyID != a.OwnerKeyID || v.State == volumes.StateDeleted {
		return notFound(a.VolumeID)
	}
	if v.State != volumes.StateReady {
		return errdefs.New(errdefs.ErrConflict, "volume_attached", "volume %s is attached to sandbox %s", v.ID, v.SandboxID)
	}
	v.State, v.SandboxID, v.AttachmentID = volumes.StateAttached, a.SandboxID, a.ID
	c := *a
	s.atts[a.ID] = &c
	return nil
}

func (s *Store) SetAttachment(_ context.Context, id, state, errText string) (*volumes.Attachment, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	a, ok := s.atts[id]
	if !ok {
		return nil, errdefs.New(errdefs.ErrNotFound, "attachment_not_found", "no attachment %s", id)
	}
	if a.State != volumes.AttachDetached {
		now := time.Now()
		a.State, a.Error = state, errText
		switch state {
		case volumes.AttachAttached:
			a.AttachedAt = &now
		case volumes.AttachDetached:
			a.DetachedAt = &now
			if v := s.vols[a.VolumeID]; v != nil && v.AttachmentID == a.ID {
				v.State, v.SandboxID, v.AttachmentID = volumes.StateReady, "", ""
			}
		}
	}
	c := *a
	return &c, nil
}

func (s *Store) GetAttachment(_ context.Context, id string) (*volumes.Attachment, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	a, ok := s.atts[id]
	if !ok {
		return nil, errdefs.New(errdefs.ErrNotFound, "attachment_not_found", "no attachment %s", id)
	}
	c := *a
	return &c, nil
}

func (s *Store) HeldAttachments(_ context.Context, sandboxID string) ([]*volumes.Attachment, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []*volumes.Attachment
	for _, a := range s.atts {
		if a.SandboxID == sandboxID && a.State != volumes.AttachDetached {
			c := *a
			out = append(out, &c)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, nil
}

// Backups is an in-memory volumes.BackupStore.
type Backups struct {
	mu sync.Mutex
	m  map[string]*volumes.Backup
}

// NewBackups returns an empty Backups.
func NewBackups() *Backups { return &Backups{m: map[string]*volumes.Backup{}} }

var _ volumes.BackupStore = (*Backups)(nil)

func (s *Backups) PutBackup(_ context.Context, b *volumes.Backup) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := *b
	s.m[b.ID] = &c
	return nil
}

func (s *Backups) GetBackup(_ context.Context, id string) (*volumes.Backup, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	b, ok := s.m[id]
	if !ok {
		return nil, errdefs.New(errdefs.ErrNotFound, "backup_not_found", "no backup %s", id)
	}
	c := *b
	return &c, nil
}

func (s *Backups) ListBackups(_ context.Context, o volumes.BackupListOptions) ([]*volumes.Backup, string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []*volumes.Backup
	for _, b := range s.m {
		if b.OwnerKeyID != o.OwnerKeyID || (o.State == "" && b.State == volumes.BackupDeleted) ||
			(o.State != "" && b.State != o.State) || (o.VolumeID != "" && b.VolumeID != o.VolumeID) {
			continue
		}
		c := *b
		out = append(out, &c)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID > out[j].ID })
	return out, "", nil
}

func (s *Backups) ExpiredBackups(_ context.Context, t time.Time) ([]*volumes.Backup, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []*volumes.Backup
	for _, b := range s.m {
		if b.State != volumes.BackupDeleted && b.ExpiresAt.Before(t) {
			c := *b
			out = append(out, &c)
		}
	}
	return out, nil
}

func (s *Backups) BackupUsage(_ context.Context, owner, volumeID string) (volumes.BackupUsage, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var u volumes.BackupUsage
	for _, b := range s.m {
		if b.OwnerKeyID == owner && (volumeID == "" || b.VolumeID == volumeID) &&
			(b.State == volumes.BackupCreating || b.State == volumes.BackupReady) {
			u.Count++
			u.SizeMiB += int64(b.SizeMiB)
		}
	}
	return u, nil
}
