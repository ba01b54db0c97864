package api

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"

	"github.com/emberbox/emberbox/internal/cluster"
	"github.com/emberbox/emberbox/internal/errdefs"
)

// Nodes is the cluster's node registry, as the admin routes see it
// (store.Store on a node of a cluster).
type Nodes interface {
	ListNodes(ctx context.Context) ([]*cluster.Node, error)
	SetNodeDraining(ctx context.Context, id string, draining bool) (*cluster.Node, error)
}

type nodeJSON struct {
	ID           string    `json:"id"`
	Address      string    `json:"address"`
	State        string    `json:"state"`
	Epoch        int64     `json:"epoch"`
	MemoryMiB    int64     `json:"memoryMiB"`
	CommittedMiB int64     `json:"committedMiB"`
	FreeMiB      int64     `json:"freeMiB"`
	VCPUs        int       `json:"vcpus"`
	Running      int       `json:"running"`
	Accel        string    `json:"accel"`
	Version      string    `json:"version"`
	StartedAt    jsonTime  `json:"startedAt"`
	HeartbeatAt  jsonTime  `json:"heartbeatAt"`
	DownAt       *jsonTime `json:"downAt"`
	Images       []string  `json:"images"`
	// SuspectSince: the node answering found this one's heartbeat stale
	// while it still answers probes, since then (null: not suspect).
	SuspectSince *jsonTime `json:"suspectSince"`
}

func toNodeJSON(n *cluster.Node) nodeJSON {
	return nodeJSON{ID: n.ID, Address: n.Address, State: n.State, Epoch: n.Epoch, MemoryMiB: n.MemoryMiB,
		CommittedMiB: n.CommittedMiB, FreeMiB: n.FreeMiB(), VCPUs: n.VCPUs, Running: n.Running, Accel: n.Accel,
		Version: n.Version, StartedAt: jsonTime(n.StartedAt), HeartbeatAt: jsonTime(n.HeartbeatAt),
		DownAt: optTime(n.DownAt), Images: n.Images, SuspectSince: optTime(n.SuspectSince)}
}

func errNotClustered() error {
	return errdefs.New(errdefs.ErrConflict, "not_clustered",
		"this server is not a node of a cluster").WithHint("run emberbox serve with --store postgres://… to make one")
}

func (s nodesAPI) adminNodes(c *call) error {
	if s.nodes == nil {
		return errNotClustered()
	}
	if c.role != RoleAdmin {
		return newError(http.StatusForbidden, "admin_only", "only an admin key may see or drain nodes.")
	}
	return nil
}

func (s nodesAPI) list(w http.ResponseWriter, r *http.Request, c *call) error {
	if err := s.adminNodes(c); err != nil {
		return err
	}
	list, err := s.nodes.ListNodes(r.Context())
	if err != nil {
		return err
	}
	out := listJSON[nodeJSON]{Data: []nodeJSON{}}
	for _, n := range list {
		out.Data = append(out.Data, toNodeJSON(n))
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

func (s nodesAPI) drain(w http.ResponseWriter, r *http.Request, c *call) error {
	return s.setDraining(w, r, c, true)
}

func (s nodesAPI) undrain(w http.ResponseWriter, r *http.Request, c *call) error {
	return s.setDraining(w, r, c, false)
}

func (s nodesAPI) setDraining(w http.ResponseWriter, r *http.Request, c *call, draining bool) error {
	if err := s.adminNodes(c); err != nil {
		return err
	}
	n, err := s.nodes.SetNodeDraining(r.Context(), r.PathValue("id"), draining)
	return reply(w, n, err, toNodeJSON)
}

// checkSpreadFrom refuses spreadFrom ids that are not the caller's own
// sandboxes or snapshots, as one does not learn where others' run.
func (s *server) checkSpreadFrom(r *http.Request, owner string, raw json.RawMessage) error {
	if len(raw) == 0 || string(raw) == "null" {
		return nil
	}
	ids, _ := spreadIDs(raw)
	for _, id := range ids {
		var err error
		if strings.HasPrefix(id, "snap_") {
			_, err = s.mgr.GetSnapshot(r.Context(), owner, id)
		} else {
			_, err = s.mgr.Get(r.Context(), owner, id)
		}
		if err != nil {
			return invalid([]issue{{Path: "spreadFrom", Message: id + " is not a sandbox or snapshot of yours"}})
		}
	}
	return nil
}
