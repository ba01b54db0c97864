package volumes_test

import (
	"context"
	"errors"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/emberbox/emberbox/internal/admission"
	"github.com/emberbox/emberbox/internal/errdefs"
	"github.com/emberbox/emberbox/internal/store"
	"github.com/emberbox/emberbox/internal/volumes"
)

// server is one run of the server's volume side: a ledger (memory only)
// and a service over a store that outlives it.
type server struct {
	ledger *admission.Ledger
	vols   *volumes.Service
}

// env is a data dir and its SQLite store, kept across restarts.
type env struct {
	t       *testing.T
	dir     string
	st      *store.Store
	lcfg    admission.Config
	quota   volumes.BackupQuota
	freeMiB atomic.Int64
}

func newEnv(t *testing.T, lcfg admission.Config, quota volumes.BackupQuota) *env {
	t.Helper()
	dir := t.TempDir()
	st, err := store.Open(context.Background(), filepath.Join(dir, "emberbox.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	e := &env{t: t, dir: dir, st: st, lcfg: lcfg, quota: quota}
	e.freeMiB.Store(1 << 30)
	return e
}

// start is a server start: a new ledger and service, rebuilt from the store.
func (e *env) start() *server {
	e.t.Helper()
	l := admission.New(e.lcfg)
	v := volumes.New(volumes.Config{Store: e.st, Backups: e.st, DataDir: e.dir, Mkfs: "true",
		Admission: l, BackupQuota: e.quota, DiskReserveMiB: 2048,
		DiskFreeMiB: func() (int64, error) { return e.freeMiB.Load(), nil }})
	if err := v.Recover(context.Background()); err != nil {
		e.t.Fatal(err)
	}
	return &server{ledger: l, vols: v}
}

// refused checks that err is a coded conflict with code, naming what in
// details (quota or resource), with a wait.
func refused(t *testing.T, err error, code, what string) {
	t.Helper()
	var ce *errdefs.CodedError
	if !errors.As(err, &ce) || ce.Code != code || !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("got %v, want %s", err, code)
	}
	key := "quota"
	if code == admission.CodeNoCapacity {
		key = "resource"
	}
	if ce.Details[key] != what || ce.RetryAfter <= 0 || ce.Hint == "" {
		t.Errorf("%s: details %v, retry %v, hint %q; want %s = %s, a wait and a hint", code, ce.Details, ce.RetryAfter, ce.Hint, key, what)
	}
}

func create(t *testing.T, s *server, owner string, mib int) *volumes.Volume {
	t.Helper()
	v, err := s.vols.Create(context.Background(), owner, volumes.CreateSpec{SizeMiB: mib})
	if err != nil {
		t.Fatalf("create %d MiB for %s: %v", mib, owner, err)
	}
	return v
}

// TestVolumeQuotas: a key's volumes are bounded in count and size (and by
// its disk quota), a delete gives the room back, a grow is admitted like a
// create, and another key is not touched.
func TestVolumeQuotas(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, admission.Config{Quota: admission.Quota{Volumes: 3, VolumeMiB: 1000, DiskMiB: 5000}}, volumes.BackupQuota{})
	s := e.start()
	a := create(t, s, "key_a", 400)
	create(t, s, "key_a", 400)
	_, err := s.vols.Create(ctx, "key_a", volumes.CreateSpec{SizeMiB: 201})
	refused(t, err, admission.CodeQuotaExceeded, "volumeMiB")
	create(t, s, "key_a", 200)
	_, err = s.vols.Create(ctx, "key_a", volumes.CreateSpec{SizeMiB: 64})
	refused(t, err, admission.CodeQuotaExceeded, "volumes")
	if n, _, _ := e.st.ListVolumes(ctx, volumes.ListOptions{OwnerKeyID: "key_a"}); len(n) != 3 {
		t.Errorf("key_a keeps %d volumes after refusals, want 3", len(n))
	}
	create(t, s, "key_b", 1000) // another key has its own quota

	_, err = s.vols.Resize(ctx, "key_a", a.ID, 401)
	refused(t, err, admission.CodeQuotaExceeded, "volumeMiB")
	if got, _ := e.st.GetVolume(ctx, a.ID); got.SizeMiB != 400 {
		t.Errorf("a refused grow left the record at %d MiB", got.SizeMiB)
	}
	if _, err := s.vols.Delete(ctx, "key_a", a.ID); err != nil {
		t.Fatal(err)
	}
	if u := s.ledger.Owner("key_a"); u.Volumes != 2 || u.VolumeMiB != 600 || u.DiskMiB != 600 {
		t.Errorf("after a delete key_a holds %+v", u)
	}
	b := create(t, s, "key_a", 300)
	if _, err := s.vols.Resize(ctx, "key_a", b.ID, 400); err != nil {
		t.Fatalf("a grow within the quota: %v", err)
	}
	if u := s.ledger.Owner("key_a"); u.VolumeMiB != 1000 {
		t.Errorf("after a grow key_a holds %d MiB, want 1000", u.VolumeMiB)
	}
}

// TestVolumeHostDisk: volumes are admitted against the data dir's free
// space beside sandboxes' disks, so sparse volumes cannot promise more
// than the host has (409 no_capacity).
func TestVolumeHostDisk(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, admission.Config{DiskFreeMiB: func() (int64, error) { return 10000, nil }, DiskReserveMiB: 2000}, volumes.BackupQuota{})
	s := e.start()
	_, err := s.vols.Create(ctx, "key_a", volumes.CreateSpec{SizeMiB: volumes.MaxSizeMiB})
	refused(t, err, admission.CodeNoCapacity, "diskMiB")
	// A sandbox's disk is in the same ledger.
	if err := s.ledger.Reserve(admission.Claim{ID: "sbx_1", Owner: "key_b", Resources: admission.Resources{VCPU: 1, MemoryMiB: 1, DiskMiB: 4000}}); err != nil {
		t.Fatal(err)
	}
	create(t, s, "key_a", 4000)
	_, err = s.vols.Create(ctx, "key_c", volumes.CreateSpec{SizeMiB: 64})
	refused(t, err, admission.CodeNoCapacity, "diskMiB")
	if entries, _ := filepath.Glob(filepath.Join(e.dir, "volumes", "*")); len(entries) != 1 {
		t.Errorf("refused creates left files: %v", entries)
	}
}

// TestVolumeQuotasAfterRestart: a new ledger rebuilt from the store holds
// what the last one did; a delete after the restart gives its room back.
func TestVolumeQuotasAfterRestart(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, admission.Config{Quota: admission.Quota{Volumes: 2, VolumeMiB: 1000}}, volumes.BackupQuota{})
	s := e.start()
	a := create(t, s, "key_a", 600)
	create(t, s, "key_a", 64)
	gone := create(t, s, "key_b", 64)
	if _, err := s.vols.Delete(ctx, "key_b", gone.ID); err != nil {
		t.Fatal(err)
	}
	before := s.ledger.Owner("key_a")

	s = e.start()
	if got := s.ledger.Owner("key_a"); got != before {
		t.Errorf("after a restart key_a holds %+v, want %+v", got, before)
	}
	if got := s.ledger.Owner("key_b"); got != (admission.Usage{}) {
		t.Errorf("after a restart key_b holds %+v, want nothing (its volume was deleted)", got)
	}
	_, err := s.vols.Create(ctx, "key_a", volumes.CreateSpec{SizeMiB: 64})
	refused(t, err, admission.CodeQuotaExceeded, "volumes")
	if _, err := s.vols.Delete(ctx, "key_a", a.ID); err != nil {
		t.Fatal(err)
	}
	create(t, s, "key_a", 936)
}

// TestBackupQuotas: a key's backups are bounded in count, in bytes and per
// volume, the bound holds across a restart (it is the store's), and a
// deleted backup gives its place back.
func TestBackupQuotas(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, admission.Config{}, volumes.BackupQuota{Count: 3, MiB: 400, PerVolume: 2})
	s := e.start()
	v1, v2, big := create(t, s, "key_a", 64), create(t, s, "key_a", 64), create(t, s, "key_a", 300)
	first, err := s.vols.Backup(ctx, "key_a", v1.ID, "", 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.vols.Backup(ctx, "key_a", v1.ID, "", 0); err != nil {
		t.Fatal(err)
	}
	_, err = s.vols.Backup(ctx, "key_a", v1.ID, "", 0)
	refused(t, err, admission.CodeQuotaExceeded, "backupsPerVolume")
	_, err = s.vols.Backup(ctx, "key_a", big.ID, "", 0)
	refused(t, err, admission.CodeQuotaExceeded, "volumeBackupMiB")
	if _, err := s.vols.Backup(ctx, "key_a", v2.ID, "", 0); err != nil {
		t.Fatal(err)
	}
	other := create(t, s, "key_b", 64)
	if _, err := s.vols.Backup(ctx, "key_b", other.ID, "", 0); err != nil {
		t.Fatalf("another key's backup: %v", err)
	}

	s = e.start()
	_, err = s.vols.Backup(ctx, "key_a", v2.ID, "", 0)
	refused(t, err, admission.CodeQuotaExceeded, "volumeBackups")
	if _, err := s.vols.DeleteBackup(ctx, "key_a", first.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := s.vols.Backup(ctx, "key_a", v2.ID, "", 0); err != nil {
		t.Fatalf("a backup after one was deleted: %v", err)
	}
	// A refused backup leaves no record behind.
	if u, _ := e.st.BackupUsage(ctx, "key_a", ""); u.Count != 3 {
		t.Errorf("key_a holds %d backups, want 3", u.Count)
	}
}

// TestBackupFreeSpace: a backup or a restore whose copy would eat into the
// data dir's reserve is refused (409 no_capacity) and leaves nothing.
func TestBackupFreeSpace(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, admission.Config{}, volumes.BackupQuota{})
	s := e.start()
	v := create(t, s, "key_a", 64)
	b, err := s.vols.Backup(ctx, "key_a", v.ID, "", 0)
	if err != nil {
		t.Fatal(err)
	}
	e.freeMiB.Store(2047)
	_, err = s.vols.Backup(ctx, "key_a", v.ID, "", 0)
	refused(t, err, admission.CodeNoCapacity, "diskMiB")
	_, err = s.vols.Create(ctx, "key_a", volumes.CreateSpec{FromBackup: b.ID})
	refused(t, err, admission.CodeNoCapacity, "diskMiB")
	if u, _ := e.st.BackupUsage(ctx, "key_a", ""); u.Count != 1 {
		t.Errorf("refused backups left %d records, want 1", u.Count)
	}
	if n, _, _ := e.st.ListVolumes(ctx, volumes.ListOptions{OwnerKeyID: "key_a"}); len(n) != 1 {
		t.Errorf("a refused restore left %d volumes, want 1", len(n))
	}
	e.freeMiB.Store(1 << 30)
	if _, err := s.vols.Create(ctx, "key_a", volumes.CreateSpec{FromBackup: b.ID}); err != nil {
		t.Fatalf("a restore with room: %v", err)
	}
}

// TestBackupQuotaConcurrent: backups begun at once cannot pass the key's
// count together.
func TestBackupQuotaConcurrent(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, admission.Config{}, volumes.BackupQuota{Count: 3})
	s := e.start()
	var vols []*volumes.Volume
	for range 16 {
		vols = append(vols, create(t, s, "key_a", 64))
	}
	var ok atomic.Int32
	var wg sync.WaitGroup
	for _, v := range vols {
		wg.Go(func() {
			_, err := s.vols.Backup(ctx, "key_a", v.ID, "", 0)
			switch {
			case err == nil:
				ok.Add(1)
			case errdefs.Code(err) != admission.CodeQuotaExceeded:
				t.Errorf("backup of %s: %v", v.ID, err)
			}
		})
	}
	wg.Wait()
	if ok.Load() != 3 {
		t.Errorf("%d of 16 backups begun at once were taken, want the quota's 3", ok.Load())
	}
}
