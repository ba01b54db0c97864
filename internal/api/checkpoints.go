package api

import (
	"net/http"
	"unicode"
	"unicode/utf8"

	"github.com/emberbox/emberbox/internal/errdefs"
	"github.com/emberbox/emberbox/internal/sandbox"
)

// checkpointJSON is the wire form of a checkpoint.
type checkpointJSON struct {
	ID        string    `json:"id"`
	Kind      string    `json:"kind"`
	SandboxID string    `json:"sandboxId"`
	Label     *string   `json:"label"`
	State     string    `json:"state"`
	Shape     shapeJSON `json:"shape"`
	SizeBytes int64     `json:"sizeBytes"`
	// BaseID: its memory is stored as what differs from that checkpoint's
	// (whose files stay while it exists); null when it is whole.
	BaseID    *string   `json:"baseId"`
	CreatedAt *jsonTime `json:"createdAt"`
	ReadyAt   *jsonTime `json:"readyAt"`
	Error     *string   `json:"error"`
}

func toCheckpointJSON(sn *sandbox.Snapshot) checkpointJSON {
	return checkpointJSON{ID: sn.ID, Kind: "checkpoint", SandboxID: sn.CheckpointOf, Label: optString(sn.Name),
		State: sn.State, Shape: shapeJSON{VCPU: sn.VCPU, MemoryMiB: sn.MemoryMiB, DiskMiB: sn.DiskMiB},
		SizeBytes: sn.SizeBytes, BaseID: optString(sn.BaseID), CreatedAt: optTime(&sn.CreatedAt), ReadyAt: optTime(sn.ReadyAt), Error: optString(sn.Error)}
}

// checkpointManager is the manager's checkpoints, or checkpoints_unavailable.
func (s *server) checkpointManager() (CheckpointManager, error) {
	cm := s.mgr.Checkpoints
	if cm == nil {
		cm, _ = s.mgr.Sandboxes.(CheckpointManager)
	}
	if cm == nil {
		return nil, errdefs.New(errdefs.ErrUnavailable, "checkpoints_unavailable", "this server keeps no checkpoints")
	}
	return cm, nil
}

type checkpointRequest struct {
	Label string `json:"label"`
	// Wait (the default) answers once the capture is over; false answers
	// at once (202, state capturing) while it goes on.
	Wait *bool `json:"wait"`
}

// labelTextIssues checks a checkpoint's label: short, valid UTF-8, no
// control characters (it is shown in listings and the console).
func labelTextIssues(label string) []issue {
	if len(label) > sandbox.MaxCheckpointLabelLen || !utf8.ValidString(label) {
		return []issue{{Path: "label", Message: "must be at most 63 bytes of UTF-8"}}
	}
	for _, r := range label {
		if unicode.IsControl(r) {
			return []issue{{Path: "label", Message: "must not contain control characters"}}
		}
	}
	return nil
}

// create answers POST /v1/sandboxes/{id}/checkpoints once the capture is
// over (state ready or failed).
func (s checkpointsAPI) create(w http.ResponseWriter, r *http.Request, c *call) error {
	var req checkpointRequest
	if err := decode(c, &req); err != nil {
		return err
	}
	if issues := labelTextIssues(req.Label); len(issues) > 0 {
		return invalid(issues)
	}
	cm, err := s.checkpointManager()
	if err != nil {
		return err
	}
	wait := req.Wait == nil || *req.Wait
	sn, err := cm.Checkpoint(r.Context(), c.owner, r.PathValue("id"), req.Label, wait)
	if err != nil {
		return err
	}
	status := http.StatusOK
	if !wait {
		status = http.StatusAccepted
	}
	writeJSON(w, status, toCheckpointJSON(sn))
	return nil
}

func (s checkpointsAPI) list(w http.ResponseWriter, r *http.Request, c *call) error {
	cm, err := s.checkpointManager()
	if err != nil {
		return err
	}
	list, err := cm.ListCheckpoints(r.Context(), c.owner, r.PathValue("id"))
	if err != nil {
		return err
	}
	out := struct {
		Checkpoints []checkpointJSON `json:"checkpoints"`
	}{Checkpoints: make([]checkpointJSON, 0, len(list))}
	for _, sn := range list {
		out.Checkpoints = append(out.Checkpoints, toCheckpointJSON(sn))
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

func (s checkpointsAPI) get(w http.ResponseWriter, r *http.Request, c *call) error {
	cm, err := s.checkpointManager()
	if err != nil {
		return err
	}
	sn, err := cm.GetCheckpoint(r.Context(), c.owner, r.PathValue("id"), r.PathValue("cid"))
	return reply(w, sn, err, toCheckpointJSON)
}

func (s checkpointsAPI) delete(w http.ResponseWriter, r *http.Request, c *call) error {
	cm, err := s.checkpointManager()
	if err != nil {
		return err
	}
	cid := r.PathValue("cid")
	if err := cm.DeleteCheckpoint(r.Context(), c.owner, r.PathValue("id"), cid); err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, map[string]any{"id": cid, "state": sandbox.SnapshotDeleted})
	return nil
}

type restoreRequest struct {
	// Keep checkpoints the sandbox as it is before the restore.
	Keep bool `json:"keep"`
}

// restore answers POST /v1/sandboxes/{id}/checkpoints/{cid}:restore with
// the sandbox once it runs again.
func (s checkpointsAPI) restore(w http.ResponseWriter, r *http.Request, c *call) error {
	var req restoreRequest
	if err := decode(c, &req); err != nil {
		return err
	}
	cm, err := s.checkpointManager()
	if err != nil {
		return err
	}
	sb, err := cm.RestoreCheckpoint(r.Context(), c.owner, r.PathValue("id"), r.PathValue("cid"), req.Keep)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, s.sandboxJSON(sb))
	return nil
}

type branchRequest struct {
	Count  *int              `json:"count"`
	Name   string            `json:"name"`
	Labels map[string]string `json:"labels"`
}

// branch answers POST /v1/sandboxes/{id}/checkpoints/{cid}:branch with
// {"sandboxes": [...]} once every new sandbox runs.
func (s checkpointsAPI) branch(w http.ResponseWriter, r *http.Request, c *call) error {
	var req branchRequest
	if err := decode(c, &req); err != nil {
		return err
	}
	if err := copiesValid(req.Name, req.Labels, req.Count); err != nil {
		return err
	}
	cm, err := s.checkpointManager()
	if err != nil {
		return err
	}
	copies, err := cm.BranchCheckpoint(r.Context(), c.owner, r.PathValue("id"), r.PathValue("cid"),
		sandbox.ForkSpec{Count: orDefault(req.Count, 1), Name: req.Name, Labels: req.Labels})
	return s.writeCopies(w, copies, err)
}
