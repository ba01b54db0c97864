package api

import (
	"net/http"

	"github.com/emberbox/emberbox/internal/sandbox"
)

// snapshotJSON is the wire form of a snapshot, with the fields
// withruntime and its compatibility layers read.
type snapshotJSON struct {
	ID              string            `json:"id"`
	Kind            string            `json:"kind"`
	Name            *string           `json:"name"`
	Labels          map[string]string `json:"labels"`
	State           string            `json:"state"`
	Mode            string            `json:"mode"`
	SourceSandboxID string            `json:"sourceSandboxId"`
	Shape           shapeJSON         `json:"shape"`
	SizeBytes       int64             `json:"sizeBytes"`
	StoredBytes     int64             `json:"storedBytes"`
	MeteredBytes    int64             `json:"meteredBytes"`
	RetentionDays   int               `json:"retentionDays"`
	CreatedAt       *jsonTime         `json:"createdAt"`
	ReadyAt         *jsonTime         `json:"readyAt"`
	ExpiresAt       *jsonTime         `json:"expiresAt"`
	Error           *string           `json:"error"`
}

type shapeJSON struct {
	VCPU      int `json:"vcpu"`
	MemoryMiB int `json:"memoryMiB"`
	DiskMiB   int `json:"diskMiB"`
}

func toSnapshotJSON(sn *sandbox.Snapshot) snapshotJSON {
	labels := sn.Labels
	if labels == nil {
		labels = map[string]string{}
	}
	return snapshotJSON{ID: sn.ID, Kind: "snapshot", Name: optString(sn.Name), Labels: labels, State: sn.State,
		Mode: sn.Mode, SourceSandboxID: sn.SourceSandboxID,
		Shape:     shapeJSON{VCPU: sn.VCPU, MemoryMiB: sn.MemoryMiB, DiskMiB: sn.DiskMiB},
		SizeBytes: sn.SizeBytes, StoredBytes: sn.SizeBytes, MeteredBytes: sn.SizeBytes,
		RetentionDays: sn.RetentionDays, CreatedAt: optTime(&sn.CreatedAt), ReadyAt: optTime(sn.ReadyAt),
		ExpiresAt: optTime(sn.ExpiresAt), Error: optString(sn.Error)}
}

type snapshotRequest struct {
	Name          string            `json:"name"`
	Labels        map[string]string `json:"labels"`
	RetentionDays *int              `json:"retentionDays"`
	Mode          string            `json:"mode"`
}

func retentionIssues(issues []issue, v *int) []issue {
	return intIn(issues, "retentionDays", v, 1, sandbox.MaxSnapshotRetentionDays)
}

// capture answers POST /v1/sandboxes/{id}:snapshot once the
// capture is over (state ready or failed).
func (s snapshots) capture(w http.ResponseWriter, r *http.Request, c *call) error {
	var req snapshotRequest
	if err := decode(c, &req); err != nil {
		return err
	}
	issues := nameIssues(req.Name)
	issues = append(issues, labelIssues(req.Labels)...)
	issues = retentionIssues(issues, req.RetentionDays)
	if req.Mode != "" && req.Mode != sandbox.SnapshotModeMemory && req.Mode != sandbox.SnapshotModeDisk {
		issues = append(issues, issue{Path: "mode", Message: `must be "memory" or "disk"`})
	}
	if len(issues) > 0 {
		return invalid(sortIssues(issues))
	}
	sn, err := s.mgr.Snapshot(r.Context(), c.owner, r.PathValue("id"), sandbox.SnapshotSpec{
		Name: req.Name, Labels: req.Labels, RetentionDays: orDefault(req.RetentionDays, 0), Mode: req.Mode})
	return reply(w, sn, err, toSnapshotJSON)
}

type forkRequest struct {
	Count        *int              `json:"count"`
	Name         string            `json:"name"`
	Labels       map[string]string `json:"labels"`
	KeepSnapshot bool              `json:"keepSnapshot"`
	// Accepted and ignored: no billing, no egress secrets here.
	Funding string   `json:"funding"`
	Secrets []string `json:"secrets"`
}

// fork answers POST /v1/sandboxes/{id}:fork with
// {"sandboxes": [...]} once every copy runs.
func (s snapshots) fork(w http.ResponseWriter, r *http.Request, c *call) error {
	var req forkRequest
	if err := decode(c, &req); err != nil {
		return err
	}
	if err := copiesValid(req.Name, req.Labels, req.Count); err != nil {
		return err
	}
	copies, err := s.mgr.Fork(r.Context(), c.owner, r.PathValue("id"), sandbox.ForkSpec{
		Count: orDefault(req.Count, 1), Name: req.Name, Labels: req.Labels, KeepSnapshot: req.KeepSnapshot})
	return s.writeCopies(w, copies, err)
}

// copiesValid checks the name, labels and count of the copies a fork or a
// branch makes.
func copiesValid(name string, labels map[string]string, count *int) error {
	issues := nameIssues(name)
	if name != "" && len(name) > maxNameLen-3 {
		issues = append(issues, issue{Path: "name", Message: "must be at most 60 characters (copies get -N)"})
	}
	issues = append(issues, labelIssues(labels)...)
	issues = intIn(issues, "count", count, 1, sandbox.MaxForkCount)
	if len(issues) > 0 {
		return invalid(sortIssues(issues))
	}
	return nil
}

// writeCopies answers the copies a fork or a branch made as
// {"sandboxes": [...]}, or err.
func (s *server) writeCopies(w http.ResponseWriter, copies []*sandbox.Sandbox, err error) error {
	if err != nil {
		return err
	}
	out := struct {
		Sandboxes []sandboxJSON `json:"sandboxes"`
	}{Sandboxes: make([]sandboxJSON, 0, len(copies))}
	for _, sb := range copies {
		out.Sandboxes = append(out.Sandboxes, s.sandboxJSON(sb))
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

func (s snapshots) list(w http.ResponseWriter, r *http.Request, c *call) error {
	q := r.URL.Query()
	opts := sandbox.SnapshotListOptions{OwnerKeyID: c.owner, SourceSandboxID: q.Get("sandboxId"), Name: q.Get("name"),
		State: q.Get("state"), Cursor: q.Get("cursor")}
	var issues []issue
	switch opts.State {
	case "", sandbox.SnapshotCapturing, sandbox.SnapshotReady, sandbox.SnapshotFailed:
	default:
		issues = append(issues, issue{Path: "state", Message: "must be capturing, ready or failed"})
	}
	opts.Limit = limitParam(q.Get("limit"), opts.Limit, &issues)
	if len(issues) > 0 {
		return invalid(issues)
	}
	list, next, err := s.mgr.ListSnapshots(r.Context(), opts)
	return replyPage(w, list, next, err, toSnapshotJSON)
}

func (s snapshots) get(w http.ResponseWriter, r *http.Request, c *call) error {
	sn, err := s.mgr.GetSnapshot(r.Context(), c.owner, r.PathValue("id"))
	return reply(w, sn, err, toSnapshotJSON)
}

// snapshotUpdateRequest: a name or labels left out stay; name null clears.
type snapshotUpdateRequest struct {
	Name     *string           `json:"name"`
	Labels   map[string]string `json:"labels"`
	IfLabels map[string]string `json:"ifLabels"`
}

func (s snapshots) update(w http.ResponseWriter, r *http.Request, c *call) error {
	var req snapshotUpdateRequest
	if err := decode(c, &req); err != nil {
		return err
	}
	// decodeStrict leaves a null unset; withruntime sends name=None to
	// clear it, so null is told apart here.
	if req.Name == nil && nullField(c.body, "name") {
		empty := ""
		req.Name = &empty
	}
	var issues []issue
	if req.Name != nil {
		issues = append(issues, nameIssues(*req.Name)...)
	}
	issues = append(issues, labelIssues(req.Labels)...)
	if len(issues) > 0 {
		return invalid(sortIssues(issues))
	}
	sn, err := s.mgr.UpdateSnapshot(r.Context(), c.owner, r.PathValue("id"),
		sandbox.SnapshotUpdate{Name: req.Name, Labels: req.Labels, IfLabels: req.IfLabels})
	return reply(w, sn, err, toSnapshotJSON)
}

func (s snapshots) delete(w http.ResponseWriter, r *http.Request, c *call) error {
	if err := decode(c, &struct{}{}); err != nil {
		return err
	}
	id := r.PathValue("id")
	if err := s.mgr.DeleteSnapshot(r.Context(), c.owner, id); err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, map[string]any{"id": id, "state": sandbox.SnapshotDeleted})
	return nil
}

type snapshotExtendRequest struct {
	RetentionDays *int `json:"retentionDays"`
}

func (s snapshots) extend(w http.ResponseWriter, r *http.Request, c *call) error {
	var req snapshotExtendRequest
	if err := decode(c, &req); err != nil {
		return err
	}
	if req.RetentionDays == nil {
		return invalid([]issue{{Path: "retentionDays", Message: "is required"}})
	}
	if issues := retentionIssues(nil, req.RetentionDays); len(issues) > 0 {
		return invalid(issues)
	}
	sn, err := s.mgr.ExtendSnapshot(r.Context(), c.owner, r.PathValue("id"), *req.RetentionDays)
	return reply(w, sn, err, toSnapshotJSON)
}
