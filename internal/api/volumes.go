package api

import (
	"encoding/json"
	"fmt"
	"net/http"

	"github.com/emberbox/emberbox/internal/sandbox"
	"github.com/emberbox/emberbox/internal/volumes"
)

// Volumes: disks that outlive sandboxes (internal/volumes), and their
// backups. Backup policies (schedules) are not built: that path answers 501
// (unavailable.go).

type volumeJSON struct {
	ID           string            `json:"id"`
	Kind         string            `json:"kind"`
	Name         *string           `json:"name"`
	Labels       map[string]string `json:"labels"`
	SizeMiB      int               `json:"sizeMiB"`
	State        string            `json:"state"`
	Region       string            `json:"region"`
	SandboxID    *string           `json:"sandboxId"`
	AttachmentID *string           `json:"attachmentId"`
	CreatedAt    *jsonTime         `json:"createdAt"`
	UpdatedAt    *jsonTime         `json:"updatedAt"`
}

func toVolumeJSON(v *volumes.Volume) volumeJSON {
	labels := v.Labels
	if labels == nil {
		labels = map[string]string{}
	}
	return volumeJSON{ID: v.ID, Kind: "volume", Name: optString(v.Name), Labels: labels, SizeMiB: v.SizeMiB,
		State: v.State, Region: "local", SandboxID: optString(v.SandboxID), AttachmentID: optString(v.AttachmentID),
		CreatedAt: optTime(&v.CreatedAt), UpdatedAt: optTime(&v.UpdatedAt)}
}

type attachmentJSON struct {
	ID         string    `json:"id"`
	Kind       string    `json:"kind"`
	VolumeID   string    `json:"volumeId"`
	SandboxID  string    `json:"sandboxId"`
	Path       string    `json:"path"`
	Mode       string    `json:"mode"`
	State      string    `json:"state"`
	Error      *string   `json:"error"`
	CreatedAt  *jsonTime `json:"createdAt"`
	AttachedAt *jsonTime `json:"attachedAt"`
	DetachedAt *jsonTime `json:"detachedAt"`
}

func toAttachmentJSON(a *volumes.Attachment) attachmentJSON {
	return attachmentJSON{ID: a.ID, Kind: "volume_attachment", VolumeID: a.VolumeID, SandboxID: a.SandboxID, Path: a.Path,
		Mode: a.Mode, State: a.State, Error: optString(a.Error), CreatedAt: optTime(&a.CreatedAt),
		AttachedAt: optTime(a.AttachedAt), DetachedAt: optTime(a.DetachedAt)}
}

type createVolumeRequest struct {
	SizeMiB *int              `json:"sizeMiB"`
	Name    string            `json:"name"`
	Labels  map[string]string `json:"labels"`
	Region  string            `json:"region"`
	// Known to the wire format, not available here.
	FromBackup string `json:"fromBackup"`
	Shared     *bool  `json:"shared"`
}

type resizeVolumeRequest struct {
	SizeMiB *int `json:"sizeMiB"`
}

type attachVolumeRequest struct {
	SandboxID string `json:"sandboxId"`
	Path      string `json:"path"`
	Mode      string `json:"mode"`
}

func (s volumesAPI) volumesOff() error {
	if s.vols == nil {
		return newError(http.StatusNotImplemented, "volumes_unavailable", "This server does not offer volumes.")
	}
	return nil
}

func (s volumesAPI) create(w http.ResponseWriter, r *http.Request, c *call) error {
	if err := s.volumesOff(); err != nil {
		return err
	}
	var req createVolumeRequest
	if err := decode(c, &req); err != nil {
		return err
	}
	issues := nameIssues(req.Name)
	issues = append(issues, labelIssues(req.Labels)...)
	issues = intIn(issues, "sizeMiB", req.SizeMiB, volumes.MinSizeMiB, volumes.MaxSizeMiB)
	if req.Region != "" && req.Region != "local" {
		issues = append(issues, issue{Path: "region", Message: `must be "local" (the only region of this server)`})
	}
	if req.FromBackup != "" && req.SizeMiB != nil {
		issues = append(issues, issue{Path: "sizeMiB", Message: "a restore has its backup's size; leave it out"})
	}
	if req.Shared != nil && *req.Shared {
		issues = append(issues, issue{Path: "shared", Message: "shared volumes are not available on this server"})
	}
	if len(issues) > 0 {
		return invalid(sortIssues(issues))
	}
	v, err := s.vols.Create(r.Context(), c.owner, volumes.CreateSpec{Name: req.Name, Labels: req.Labels,
		SizeMiB: orDefault(req.SizeMiB, 0), FromBackup: req.FromBackup})
	return reply(w, v, err, toVolumeJSON)
}

func (s volumesAPI) get(w http.ResponseWriter, r *http.Request, c *call) error {
	if err := s.volumesOff(); err != nil {
		return err
	}
	v, err := s.vols.Get(r.Context(), c.owner, r.PathValue("id"))
	return reply(w, v, err, toVolumeJSON)
}

func (s volumesAPI) list(w http.ResponseWriter, r *http.Request, c *call) error {
	if err := s.volumesOff(); err != nil {
		return err
	}
	q := r.URL.Query()
	opts := volumes.ListOptions{OwnerKeyID: c.owner, Name: q.Get("name"), State: q.Get("state"), Cursor: q.Get("cursor")}
	var issues []issue
	switch opts.State {
	case "", volumes.StateReady, volumes.StateAttached, volumes.StateDeleted:
	default:
		issues = append(issues, issue{Path: "state", Message: "must be ready, attached or deleted"})
	}
	opts.Limit = limitParam(q.Get("limit"), 50, &issues)
	if len(issues) > 0 {
		return invalid(issues)
	}
	list, next, err := s.vols.List(r.Context(), opts)
	return replyPage(w, list, next, err, toVolumeJSON)
}

func (s volumesAPI) resize(w http.ResponseWriter, r *http.Request, c *call) error {
	if err := s.volumesOff(); err != nil {
		return err
	}
	var req resizeVolumeRequest
	if err := decode(c, &req); err != nil {
		return err
	}
	if req.SizeMiB == nil {
		return invalid([]issue{{Path: "sizeMiB", Message: "is required"}})
	}
	v, err := s.vols.Resize(r.Context(), c.owner, r.PathValue("id"), *req.SizeMiB)
	return reply(w, v, err, toVolumeJSON)
}

func (s volumesAPI) delete(w http.ResponseWriter, r *http.Request, c *call) error {
	if err := s.volumesOff(); err != nil {
		return err
	}
	v, err := s.vols.Delete(r.Context(), c.owner, r.PathValue("id"))
	return reply(w, v, err, toVolumeJSON)
}

func (s volumesAPI) attach(w http.ResponseWriter, r *http.Request, c *call) error {
	if err := s.volumesOff(); err != nil {
		return err
	}
	var req attachVolumeRequest
	if err := decode(c, &req); err != nil {
		return err
	}
	var issues []issue
	if req.SandboxID == "" {
		issues = append(issues, issue{Path: "sandboxId", Message: "is required"})
	}
	if req.Path == "" {
		issues = append(issues, issue{Path: "path", Message: "is required"})
	}
	if req.Mode != "" && req.Mode != volumes.ModeRW {
		issues = append(issues, issue{Path: "mode", Message: `only "rw" is offered here`})
	}
	if len(issues) > 0 {
		return invalid(issues)
	}
	a, err := s.vols.Attach(r.Context(), c.owner, r.PathValue("id"), req.SandboxID, req.Path)
	return reply(w, a, err, toAttachmentJSON)
}

func (s volumesAPI) detach(w http.ResponseWriter, r *http.Request, c *call) error {
	if err := s.volumesOff(); err != nil {
		return err
	}
	if err := decode(c, &struct{}{}); err != nil {
		return err
	}
	a, err := s.vols.Detach(r.Context(), c.owner, r.PathValue("id"), r.PathValue("aid"))
	return reply(w, a, err, toAttachmentJSON)
}

func (s volumesAPI) getAttachment(w http.ResponseWriter, r *http.Request, c *call) error {
	if err := s.volumesOff(); err != nil {
		return err
	}
	a, err := s.vols.Attachment(r.Context(), c.owner, r.PathValue("id"), r.PathValue("aid"))
	return reply(w, a, err, toAttachmentJSON)
}

// volumeMountJSON is one entry of a create's volumes.
type volumeMountJSON struct {
	VolumeID string `json:"volumeId"`
	ID       string `json:"id"` // accepted for volumeId
	Path     string `json:"path"`
	Mode     string `json:"mode"`
}

// parseVolumeMounts reads a create's volumes field.
func parseVolumeMounts(raw json.RawMessage) ([]sandbox.VolumeMount, []issue) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	var raws []json.RawMessage
	if err := json.Unmarshal(raw, &raws); err != nil {
		return nil, []issue{{Path: "volumes", Message: "must be a list of {volumeId, path, mode}"}}
	}
	list := make([]volumeMountJSON, len(raws))
	for i, r := range raws {
		for _, is := range decodeStrict(r, &list[i]) {
			if is.Path == "" {
				is.Message = "must be an object {volumeId, path, mode}"
			}
			return nil, []issue{{Path: fmt.Sprintf("volumes[%d]%s", i, prefixDot(is.Path)), Message: is.Message}}
		}
	}
	var issues []issue
	if len(list) > sandbox.MaxCreateVolumes {
		issues = append(issues, issue{Path: "volumes", Message: fmt.Sprintf("at most %d", sandbox.MaxCreateVolumes)})
	}
	out := make([]sandbox.VolumeMount, 0, len(list))
	for i, m := range list {
		id := m.VolumeID
		if id == "" {
			id = m.ID
		}
		p := fmt.Sprintf("volumes[%d]", i)
		if id == "" {
			issues = append(issues, issue{Path: p + ".volumeId", Message: "is required"})
		}
		if m.Path == "" {
			issues = append(issues, issue{Path: p + ".path", Message: "is required"})
		}
		if m.Mode != "" && m.Mode != volumes.ModeRW {
			issues = append(issues, issue{Path: p + ".mode", Message: `only "rw" is offered here (no "snapshot" mode)`})
		}
		out = append(out, sandbox.VolumeMount{VolumeID: id, Path: m.Path, Mode: volumes.ModeRW})
	}
	return out, issues
}

func prefixDot(p string) string {
	if p == "" || p[0] == '[' {
		return p
	}
	return "." + p
}

type backupJSON struct {
	ID         string            `json:"id"`
	Kind       string            `json:"kind"`
	VolumeID   string            `json:"volumeId"`
	Name       *string           `json:"name"`
	SizeMiB    int               `json:"sizeMiB"`
	State      string            `json:"state"`
	Method     string            `json:"method"`
	Consistent string            `json:"consistent"`
	Region     string            `json:"region"`
	Error      *string           `json:"error"`
	CreatedAt  *jsonTime         `json:"createdAt"`
	ReadyAt    *jsonTime         `json:"readyAt"`
	ExpiresAt  *jsonTime         `json:"expiresAt"`
	Labels     map[string]string `json:"labels"`
}

func toBackupJSON(b *volumes.Backup) backupJSON {
	return backupJSON{ID: b.ID, Kind: "volume_backup", VolumeID: b.VolumeID, Name: optString(b.Name), SizeMiB: b.SizeMiB,
		State: b.State, Method: b.Method, Consistent: b.Consistent, Region: "local", Error: optString(b.Error),
		CreatedAt: optTime(&b.CreatedAt), ReadyAt: optTime(b.ReadyAt), ExpiresAt: optTime(&b.ExpiresAt),
		Labels: map[string]string{}}
}

type backupVolumeRequest struct {
	RetentionDays *int   `json:"retentionDays"`
	Name          string `json:"name"`
}

func (s volumesAPI) backup(w http.ResponseWriter, r *http.Request, c *call) error {
	if err := s.volumesOff(); err != nil {
		return err
	}
	var req backupVolumeRequest
	if err := decode(c, &req); err != nil {
		return err
	}
	issues := nameIssues(req.Name)
	issues = intIn(issues, "retentionDays", req.RetentionDays, 1, volumes.MaxBackupRetentionDays)
	if len(issues) > 0 {
		return invalid(sortIssues(issues))
	}
	b, err := s.vols.Backup(r.Context(), c.owner, r.PathValue("id"), req.Name, orDefault(req.RetentionDays, 0))
	return reply(w, b, err, toBackupJSON)
}

func (s volumesAPI) listBackups(w http.ResponseWriter, r *http.Request, c *call) error {
	if err := s.volumesOff(); err != nil {
		return err
	}
	q := r.URL.Query()
	opts := volumes.BackupListOptions{OwnerKeyID: c.owner, VolumeID: q.Get("volumeId"), State: q.Get("state"), Cursor: q.Get("cursor")}
	var issues []issue
	switch opts.State {
	case "", volumes.BackupCreating, volumes.BackupReady, volumes.BackupFailed, volumes.BackupDeleted:
	default:
		issues = append(issues, issue{Path: "state", Message: "must be creating, ready, failed or deleted"})
	}
	opts.Limit = limitParam(q.Get("limit"), 50, &issues)
	if len(issues) > 0 {
		return invalid(issues)
	}
	list, next, err := s.vols.ListBackups(r.Context(), opts)
	return replyPage(w, list, next, err, toBackupJSON)
}

func (s volumesAPI) getBackup(w http.ResponseWriter, r *http.Request, c *call) error {
	if err := s.volumesOff(); err != nil {
		return err
	}
	b, err := s.vols.GetBackup(r.Context(), c.owner, r.PathValue("id"))
	return reply(w, b, err, toBackupJSON)
}

func (s volumesAPI) deleteBackup(w http.ResponseWriter, r *http.Request, c *call) error {
	if err := s.volumesOff(); err != nil {
		return err
	}
	b, err := s.vols.DeleteBackup(r.Context(), c.owner, r.PathValue("id"))
	return reply(w, b, err, toBackupJSON)
}
