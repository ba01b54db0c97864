package store

import (
	"context"
	"testing"
	"time"

	"github.com/emberbox/emberbox/internal/errdefs"
	"github.com/emberbox/emberbox/internal/volumes"
)

func TestVolumesHolders(t *testing.T) {
	s, _ := openTest(t)
	ctx := context.Background()
	now := time.Now().UTC().Truncate(time.Millisecond)
	for _, v := range []*volumes.Volume{
		{ID: "vol_1", OwnerKeyID: "key_a", Name: "one", Labels: map[string]string{"k": "v"}, SizeMiB: 64, State: volumes.StateReady, CreatedAt: now, UpdatedAt: now},
		{ID: "vol_2", OwnerKeyID: "key_a", SizeMiB: 64, State: volumes.StateReady, CreatedAt: now, UpdatedAt: now},
		{ID: "vol_3", OwnerKeyID: "key_b", SizeMiB: 64, State: volumes.StateReady, CreatedAt: now, UpdatedAt: now},
	} {
		if err := s.InsertVolume(ctx, v); err != nil {
			t.Fatal(err)
		}
	}
	got, err := s.GetVolume(ctx, "vol_1")
	if err != nil || got.Labels["k"] != "v" || got.Name != "one" || !got.CreatedAt.Equal(now) {
		t.Fatalf("GetVolume: %+v, %v", got, err)
	}
	if _, err := s.GetVolume(ctx, "vol_9"); !errdefs.IsNotFound(err) {
		t.Errorf("missing volume: %v", err)
	}
	page, next, err := s.ListVolumes(ctx, volumes.ListOptions{OwnerKeyID: "key_a", Limit: 1})
	if err != nil || len(page) != 1 || page[0].ID != "vol_2" || next != "vol_2" {
		t.Fatalf("first page: %v %q %v", page, next, err)
	}
	page, next, _ = s.ListVolumes(ctx, volumes.ListOptions{OwnerKeyID: "key_a", Limit: 1, Cursor: next})
	if len(page) != 1 || page[0].ID != "vol_1" {
		t.Fatalf("second page: %v %q", page, next)
	}

	a := &volumes.Attachment{ID: "att_1", VolumeID: "vol_1", SandboxID: "sbx_1", OwnerKeyID: "key_a", Path: "/data",
		Mode: "rw", State: volumes.AttachAttaching, CreatedAt: now}
	if err := s.BeginAttach(ctx, a); err != nil {
		t.Fatal(err)
	}
	// Another key cannot; a second holder cannot.
	if err := s.BeginAttach(ctx, &volumes.Attachment{ID: "att_x", VolumeID: "vol_1", SandboxID: "sbx_9", OwnerKeyID: "key_b", CreatedAt: now}); !errdefs.IsNotFound(err) {
		t.Errorf("another key's attach: %v", err)
	}
	err = s.BeginAttach(ctx, &volumes.Attachment{ID: "att_2", VolumeID: "vol_1", SandboxID: "sbx_2", OwnerKeyID: "key_a", CreatedAt: now})
	if errdefs.Code(err) != "volume_attached" {
		t.Errorf("second attach: %v", err)
	}
	if _, err := s.UpdateVolume(ctx, "vol_1", volumes.StateReady, 64, volumes.StateDeleted); errdefs.Code(err) != "volume_attached" {
		t.Errorf("delete of a held volume: %v", err)
	}
	if _, err := s.SetAttachment(ctx, "att_1", volumes.AttachAttached, ""); err != nil {
		t.Fatal(err)
	}
	if v, _ := s.GetVolume(ctx, "vol_1"); v.State != volumes.StateAttached || v.SandboxID != "sbx_1" || v.AttachmentID != "att_1" {
		t.Errorf("held volume: %+v", v)
	}
	if held, _ := s.HeldAttachments(ctx, "sbx_1"); len(held) != 1 || held[0].AttachedAt == nil {
		t.Errorf("held: %+v", held)
	}
	if _, err := s.SetAttachment(ctx, "att_1", volumes.AttachDetached, ""); err != nil {
		t.Fatal(err)
	}
	// Detached is final.
	if at, _ := s.SetAttachment(ctx, "att_1", volumes.AttachAttached, ""); at.State != volumes.AttachDetached || at.DetachedAt == nil {
		t.Errorf("after detached: %+v", at)
	}
	if v, _ := s.GetVolume(ctx, "vol_1"); v.State != volumes.StateReady || v.SandboxID != "" {
		t.Errorf("freed volume: %+v", v)
	}
	if held, _ := s.HeldAttachments(ctx, "sbx_1"); len(held) != 0 {
		t.Errorf("held after detach: %+v", held)
	}
	if v, err := s.UpdateVolume(ctx, "vol_1", volumes.StateReady, 64, volumes.StateDeleted); err != nil || v.State != volumes.StateDeleted {
		t.Errorf("delete: %+v %v", v, err)
	}
	if page, _, _ := s.ListVolumes(ctx, volumes.ListOptions{OwnerKeyID: "key_a"}); len(page) != 1 {
		t.Errorf("deleted volumes listed: %v", page)
	}
}

// TestVolumeAccounting: LiveVolumes lists every owner's volumes not
// deleted; BackupUsage sums the backups that hold bytes, per key and per
// volume.
func TestVolumeAccounting(t *testing.T) {
	s, _ := openTest(t)
	ctx := context.Background()
	now := time.Now().UTC().Truncate(time.Millisecond)
	for _, v := range []*volumes.Volume{
		{ID: "vol_1", OwnerKeyID: "key_a", SizeMiB: 64, State: volumes.StateReady, CreatedAt: now, UpdatedAt: now},
		{ID: "vol_2", OwnerKeyID: "key_b", SizeMiB: 128, State: volumes.StateReady, CreatedAt: now, UpdatedAt: now},
		{ID: "vol_3", OwnerKeyID: "key_b", SizeMiB: 256, State: volumes.StateDeleted, CreatedAt: now, UpdatedAt: now},
	} {
		if err := s.InsertVolume(ctx, v); err != nil {
			t.Fatal(err)
		}
	}
	live, err := s.LiveVolumes(ctx)
	if err != nil || len(live) != 2 || live[0].ID != "vol_1" || live[1].ID != "vol_2" || live[1].SizeMiB != 128 {
		t.Fatalf("LiveVolumes: %+v, %v", live, err)
	}
	for _, b := range []*volumes.Backup{
		{ID: "vbk_1", VolumeID: "vol_1", OwnerKeyID: "key_a", SizeMiB: 64, State: volumes.BackupReady},
		{ID: "vbk_2", VolumeID: "vol_1", OwnerKeyID: "key_a", SizeMiB: 64, State: volumes.BackupCreating},
		{ID: "vbk_3", VolumeID: "vol_9", OwnerKeyID: "key_a", SizeMiB: 100, State: volumes.BackupReady},
		{ID: "vbk_4", VolumeID: "vol_1", OwnerKeyID: "key_a", SizeMiB: 64, State: volumes.BackupFailed},
		{ID: "vbk_5", VolumeID: "vol_1", OwnerKeyID: "key_a", SizeMiB: 64, State: volumes.BackupDeleted},
		{ID: "vbk_6", VolumeID: "vol_2", OwnerKeyID: "key_b", SizeMiB: 128, State: volumes.BackupReady},
	} {
		b.CreatedAt, b.ExpiresAt = now, now.Add(time.Hour)
		if err := s.PutBackup(ctx, b); err != nil {
			t.Fatal(err)
		}
	}
	if u, err := s.BackupUsage(ctx, "key_a", ""); err != nil || u != (volumes.BackupUsage{Count: 3, SizeMiB: 228}) {
		t.Errorf("key_a's backups: %+v, %v", u, err)
	}
	if u, err := s.BackupUsage(ctx, "key_a", "vol_1"); err != nil || u != (volumes.BackupUsage{Count: 2, SizeMiB: 128}) {
		t.Errorf("vol_1's backups: %+v, %v", u, err)
	}
	if u, err := s.BackupUsage(ctx, "key_c", ""); err != nil || u != (volumes.BackupUsage{}) {
		t.Errorf("a key without backups: %+v, %v", u, err)
	}
}
