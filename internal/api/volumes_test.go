package api

import (
	"context"
	"net/http"
	"strings"
	"testing"

	"github.com/emberbox/emberbox/internal/errdefs"
	"github.com/emberbox/emberbox/internal/guest"
	"github.com/emberbox/emberbox/internal/sandbox"
	"github.com/emberbox/emberbox/internal/volumes"
	"github.com/emberbox/emberbox/internal/volumes/volumestest"
)

func (g fakeGuest) AttachVolume(ctx context.Context, req guest.VolumeRequest) error {
	g.m.mu.Lock()
	defer g.m.mu.Unlock()
	g.m.mounts[req.AttachmentID] = g.id + "\x00" + req.Path
	return nil
}

func (g fakeGuest) DetachVolume(ctx context.Context, attachmentID string) error {
	g.m.mu.Lock()
	defer g.m.mu.Unlock()
	if g.m.volumeBusy {
		return &errdefs.CodedError{Class: errdefs.ErrConflict, Code: guest.CodeVolumeBusy, Message: "/data is in use"}
	}
	delete(g.m.mounts, attachmentID)
	return nil
}

func (g fakeGuest) FreezeVolume(ctx context.Context, attachmentID string, freeze bool) error {
	g.m.mu.Lock()
	defer g.m.mu.Unlock()
	if _, ok := g.m.mounts[attachmentID]; !ok {
		return &errdefs.CodedError{Class: errdefs.ErrNotFound, Code: "file_not_found", Message: "no such attachment"}
	}
	g.m.freezes++
	return nil
}

var _ guest.VolumeAttacher = fakeGuest{}

// newVolumeEnv is newEnv with a volume service on an in-memory store
// (mkfs replaced by true: the file is not formatted).
func newVolumeEnv(t *testing.T) (*testEnv, *volumes.Service) {
	t.Helper()
	m, idem := newFakeManager(), newFakeIdem()
	vols := volumes.New(volumes.Config{Store: volumestest.New(), Backups: volumestest.NewBackups(), DataDir: t.TempDir(), Mkfs: "true"})
	vols.SetGuests(m)
	s := newServer(Config{Manager: rolesOf(m), Keys: fakeKeys{}, Idempotency: idem, Version: "test",
		Accel: func() string { return "tcg" }, Uploads: newTestUploads(t), Volumes: vols})
	return &testEnv{t: t, m: m, idem: idem, s: s}, vols
}

// volumeT and attachmentT read the answers (the fields tested).
type volumeT struct {
	ID, Kind, State         string
	Name                    *string
	Labels                  map[string]string
	SizeMiB                 int
	SandboxID, AttachmentID *string
}

type attachmentT struct {
	ID, VolumeID, SandboxID, Path, Mode, State string
}

func TestVolumeRoutes(t *testing.T) {
	e, _ := newVolumeEnv(t)
	e.m.add("key_a", "sbx_1", "running", 0)
	e.m.add("key_a", "sbx_2", "running", 0)
	e.m.add("key_b", "sbx_b", "running", 0)

	w := e.do("POST", "/v1/volumes", `{"sizeMiB": 128, "name": "data", "labels": {"team": "x"}}`)
	if w.Code != http.StatusOK {
		t.Fatalf("create: %d %s", w.Code, w.Body)
	}
	v := decodeBody[volumeT](t, w)
	if !strings.HasPrefix(v.ID, "vol_") || v.State != "ready" || v.SizeMiB != 128 || *v.Name != "data" || v.Labels["team"] != "x" {
		t.Fatalf("created: %+v", v)
	}
	// Bounds and fields not offered.
	for body, path := range map[string]string{
		`{"sizeMiB": 1}`:                          "sizeMiB",
		`{"sizeMiB": 99999999}`:                   "sizeMiB",
		`{"fromBackup": "vbk_1", "sizeMiB": 128}`: "sizeMiB",
		`{"shared": true}`:                        "shared",
		`{"region": "mars"}`:                      "region",
		`{"sizeMiB": 128, "bogus": true}`:         "bogus",
	} {
		w := e.do("POST", "/v1/volumes", body)
		if w.Code != http.StatusBadRequest || !strings.Contains(w.Body.String(), `"`+path+`"`) {
			t.Errorf("create %s: %d %s", body, w.Code, w.Body)
		}
	}
	// Key B sees nothing.
	if w := e.do("GET", "/v1/volumes/"+v.ID, "", "Authorization", "Bearer secret-b"); w.Code != http.StatusNotFound || errorOf(t, w).Code != "volume_not_found" {
		t.Errorf("key B get: %d %s", w.Code, w.Body)
	}
	if w := e.do("GET", "/v1/volumes", "", "Authorization", "Bearer secret-b"); w.Code != http.StatusOK || strings.Contains(w.Body.String(), v.ID) {
		t.Errorf("key B list: %d %s", w.Code, w.Body)
	}
	if w := e.do("POST", "/v1/volumes/"+v.ID+":attach", `{"sandboxId": "sbx_b", "path": "/data"}`, "Authorization", "Bearer secret-b"); w.Code != http.StatusNotFound {
		t.Errorf("key B attach: %d %s", w.Code, w.Body)
	}
	// Key A cannot attach to key B's sandbox.
	if w := e.do("POST", "/v1/volumes/"+v.ID+":attach", `{"sandboxId": "sbx_b", "path": "/data"}`); w.Code != http.StatusNotFound {
		t.Errorf("attach to another key's sandbox: %d %s", w.Code, w.Body)
	}
	for body, want := range map[string]string{
		`{"sandboxId": "sbx_1", "path": "data"}`:                      "path",
		`{"sandboxId": "sbx_1", "path": "/proc/x"}`:                   "path",
		`{"sandboxId": "sbx_1", "path": "/a/../etc"}`:                 "path",
		`{"sandboxId": "sbx_1", "path": "/data", "mode": "snapshot"}`: "mode",
		`{"path": "/data"}`:                                           "sandboxId",
	} {
		w := e.do("POST", "/v1/volumes/"+v.ID+":attach", body)
		if w.Code != http.StatusBadRequest || !strings.Contains(w.Body.String(), want) {
			t.Errorf("attach %s: %d %s", body, w.Code, w.Body)
		}
	}

	w = e.do("POST", "/v1/volumes/"+v.ID+":attach", `{"sandboxId": "sbx_1", "path": "/data"}`)
	if w.Code != http.StatusOK {
		t.Fatalf("attach: %d %s", w.Code, w.Body)
	}
	a := decodeBody[attachmentT](t, w)
	if a.State != "attached" || a.SandboxID != "sbx_1" || a.Path != "/data" || e.m.mounts[a.ID] != "sbx_1\x00/data" {
		t.Fatalf("attachment: %+v, mounts %v", a, e.m.mounts)
	}
	// One holder at a time; held: no delete, no resize.
	w = e.do("POST", "/v1/volumes/"+v.ID+":attach", `{"sandboxId": "sbx_2", "path": "/data"}`)
	if w.Code != http.StatusConflict || errorOf(t, w).Code != "volume_attached" || !strings.Contains(w.Body.String(), "sbx_1") {
		t.Errorf("second attach: %d %s", w.Code, w.Body)
	}
	if w := e.do("POST", "/v1/volumes/"+v.ID+":delete", `{}`); w.Code != http.StatusConflict {
		t.Errorf("delete while attached: %d %s", w.Code, w.Body)
	}
	if w := e.do("POST", "/v1/volumes/"+v.ID+":resize", `{"sizeMiB": 256}`); w.Code != http.StatusConflict {
		t.Errorf("resize while attached: %d %s", w.Code, w.Body)
	}
	got := decodeBody[volumeT](t, e.do("GET", "/v1/volumes/"+v.ID, ""))
	if got.State != "attached" || got.SandboxID == nil || *got.SandboxID != "sbx_1" || *got.AttachmentID != a.ID {
		t.Errorf("held volume: %+v", got)
	}
	if w := e.do("GET", "/v1/volumes/"+v.ID+"/attachments/"+a.ID, ""); w.Code != http.StatusOK {
		t.Errorf("get attachment: %d %s", w.Code, w.Body)
	}
	// A busy mount stays attached.
	e.m.volumeBusy = true
	w = e.do("POST", "/v1/volumes/"+v.ID+"/attachments/"+a.ID+":detach", `{}`)
	if w.Code != http.StatusConflict || errorOf(t, w).Code != "volume_busy" {
		t.Errorf("busy detach: %d %s", w.Code, w.Body)
	}
	e.m.volumeBusy = false
	w = e.do("POST", "/v1/volumes/"+v.ID+"/attachments/"+a.ID+":detach", `{}`)
	if w.Code != http.StatusOK || decodeBody[attachmentT](t, w).State != "detached" || len(e.m.mounts) != 0 {
		t.Fatalf("detach: %d %s", w.Code, w.Body)
	}
	// Grow only.
	if w := e.do("POST", "/v1/volumes/"+v.ID+":resize", `{"sizeMiB": 64}`); w.Code != http.StatusBadRequest {
		t.Errorf("shrink: %d %s", w.Code, w.Body)
	}
	if w := e.do("POST", "/v1/volumes/"+v.ID+":resize", `{"sizeMiB": 256}`); w.Code != http.StatusOK || decodeBody[volumeT](t, w).SizeMiB != 256 {
		t.Errorf("grow: %d %s", w.Code, w.Body)
	}
	// Backup policies are not built: 501.
	if w := e.do("POST", "/v1/volumes/"+v.ID+":backup-policy", `{}`); w.Code != http.StatusNotImplemented {
		t.Errorf("backup policy: %d %s", w.Code, w.Body)
	}
	if w := e.do("POST", "/v1/volumes/"+v.ID+":delete", `{}`); w.Code != http.StatusOK || decodeBody[volumeT](t, w).State != "deleted" {
		t.Errorf("delete: %d %s", w.Code, w.Body)
	}
	if w := e.do("GET", "/v1/volumes", ""); strings.Contains(w.Body.String(), v.ID) {
		t.Errorf("a deleted volume is listed: %s", w.Body)
	}
}

func TestCreateVolumesField(t *testing.T) {
	e := newEnv(t)
	w := e.do("POST", "/v1/sandboxes", `{"volumes": [{"volumeId": "vol_1", "path": "/data", "mode": "rw"}, {"id": "vol_2", "path": "/more"}]}`)
	if w.Code != http.StatusOK {
		t.Fatalf("create: %d %s", w.Code, w.Body)
	}
	got := e.m.lastSpec.Volumes
	if len(got) != 2 || got[0] != (sandbox.VolumeMount{VolumeID: "vol_1", Path: "/data", Mode: "rw"}) || got[1].VolumeID != "vol_2" {
		t.Errorf("spec volumes: %+v", got)
	}
	for body, want := range map[string]string{
		`{"volumes": {"volumeId": "vol_1"}}`:                                     "volumes",
		`{"volumes": [{"path": "/data"}]}`:                                       "volumes[0].volumeId",
		`{"volumes": [{"volumeId": "vol_1"}]}`:                                   "volumes[0].path",
		`{"volumes": [{"volumeId": "vol_1", "path": "/d", "mode": "snapshot"}]}`: "volumes[0].mode",
		`{"volumes": [{"volumeId": "vol_1", "path": "/d", "size": 3}]}`:          "volumes[0].size",
		`{"volumes": [{},{},{},{},{}]}`:                                          `"volumes"`,
	} {
		w := e.do("POST", "/v1/sandboxes", body)
		if w.Code != http.StatusBadRequest || !strings.Contains(w.Body.String(), want) {
			t.Errorf("create %s: %d %s", body, w.Code, w.Body)
		}
	}
}

type backupT struct {
	ID, VolumeID, State, Method, Consistent string
	SizeMiB                                 int
}

func TestVolumeBackupRoutes(t *testing.T) {
	e, _ := newVolumeEnv(t)
	e.m.add("key_a", "sbx_1", "running", 0)
	v := decodeBody[volumeT](t, e.do("POST", "/v1/volumes", `{"sizeMiB": 64}`))
	// Detached: copied as it is.
	w := e.do("POST", "/v1/volumes/"+v.ID+":backup", `{"name": "first", "retentionDays": 3}`)
	b := decodeBody[backupT](t, w)
	if w.Code != http.StatusOK || !strings.HasPrefix(b.ID, "vbk_") || b.State != "ready" || b.Consistent != "detached" || b.SizeMiB != 64 || b.Method == "" {
		t.Fatalf("backup: %d %s", w.Code, w.Body)
	}
	if w := e.do("POST", "/v1/volumes/"+v.ID+":backup", `{"retentionDays": 9999}`); w.Code != http.StatusBadRequest {
		t.Errorf("retention out of bounds: %d %s", w.Code, w.Body)
	}
	// Attached: frozen in the guest for the copy.
	decodeBody[attachmentT](t, e.do("POST", "/v1/volumes/"+v.ID+":attach", `{"sandboxId": "sbx_1", "path": "/data"}`))
	w = e.do("POST", "/v1/volumes/"+v.ID+":backup", `{}`)
	if b2 := decodeBody[backupT](t, w); w.Code != http.StatusOK || b2.Consistent != "frozen" || e.m.freezes != 2 {
		t.Errorf("backup of an attached volume: %d %s (freezes %d, want a freeze and a thaw)", w.Code, w.Body, e.m.freezes)
	}
	if w := e.do("GET", "/v1/volume-backups?volumeId="+v.ID, ""); w.Code != http.StatusOK || strings.Count(w.Body.String(), `"vbk_`) != 2 {
		t.Errorf("list: %d %s", w.Code, w.Body)
	}
	// Key B sees none of it.
	if w := e.do("GET", "/v1/volume-backups/"+b.ID, "", "Authorization", "Bearer secret-b"); w.Code != http.StatusNotFound {
		t.Errorf("key B get: %d %s", w.Code, w.Body)
	}
	if w := e.do("POST", "/v1/volumes", `{"fromBackup": "`+b.ID+`"}`, "Authorization", "Bearer secret-b"); w.Code != http.StatusNotFound {
		t.Errorf("key B restore: %d %s", w.Code, w.Body)
	}
	// Restore: a new volume of the backup's size.
	w = e.do("POST", "/v1/volumes", `{"fromBackup": "`+b.ID+`", "name": "restored"}`)
	if r := decodeBody[volumeT](t, w); w.Code != http.StatusOK || r.SizeMiB != 64 || r.ID == v.ID || r.State != "ready" {
		t.Errorf("restore: %d %s", w.Code, w.Body)
	}
	if w := e.do("POST", "/v1/volume-backups/"+b.ID+":delete", `{}`); w.Code != http.StatusOK || decodeBody[backupT](t, w).State != "deleted" {
		t.Errorf("delete: %d %s", w.Code, w.Body)
	}
	if w := e.do("POST", "/v1/volumes", `{"fromBackup": "`+b.ID+`"}`); w.Code != http.StatusConflict {
		t.Errorf("restore of a deleted backup: %d %s", w.Code, w.Body)
	}
}
