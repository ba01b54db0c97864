package cluster

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/emberbox/emberbox/internal/errdefs"
	"github.com/emberbox/emberbox/internal/sandbox"
)

// Snapshots on every node: a copy of a snapshot is placed on the node that
// holds the snapshot when it has room, and elsewhere otherwise; a node
// that makes a copy of a snapshot it does not hold fetches the snapshot's
// files from the node that does, as an extents stream over the node
// channel (GET /cluster/v1/snapshots/{id}/files). The fetching node
// checks them (sandbox.Snapshots.ensureLocal) and keeps them while it has
// copies of the snapshot.

// SnapshotSource names the files of a ready snapshot this node holds
// (sandbox.Snapshots.SnapshotFiles).
type SnapshotSource interface {
	SnapshotFiles(ctx context.Context, id string) (map[string]string, error)
}

// SetSnapshots has the channel serve the files of this node's snapshots
// from src to nodes that make copies of them.
func (c *Cluster) SetSnapshots(src SnapshotSource) { c.snapshots.Store(&src) }

// serveSnapshotFiles answers a peer's fetch of a snapshot's files.
func (c *Cluster) serveSnapshotFiles(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	src := c.snapshots.Load()
	if src == nil {
		http.Error(w, "this node serves no snapshots yet", http.StatusServiceUnavailable)
		return
	}
	if node, err := c.cfg.Store.OwnerNode(r.Context(), "snapshots", id); err != nil || node != c.ID() {
		http.Error(w, fmt.Sprintf("snapshot %s is not on node %s", id, c.ID()), http.StatusNotFound)
		return
	}
	files, err := (*src).SnapshotFiles(r.Context(), id)
	if err != nil {
		status := http.StatusConflict
		if errdefs.IsNotFound(err) {
			status = http.StatusNotFound
		}
		http.Error(w, err.Error(), status)
		return
	}
	if len(files) > maxMoveFiles {
		http.Error(w, "too many files", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	w.WriteHeader(http.StatusOK)
	if err := writeExtents(w, files); err != nil {
		// The status is sent: the fetching node sees the stream cut.
		c.log.Warn("sending a snapshot's files to a node", "snapshot_id", id, "to", peerID(r), "err", err)
	}
}

// FetchSnapshot implements sandbox.SnapshotFetcher: it writes the files of
// snapshot sn from the node that holds it into dir.
func (c *Cluster) FetchSnapshot(ctx context.Context, sn *sandbox.Snapshot, dir string) error {
	owner, err := c.cfg.Store.OwnerNode(ctx, "snapshots", sn.ID)
	if err != nil {
		return err
	}
	if owner == "" || owner == c.ID() {
		return fmt.Errorf("snapshot %s is on no other node", sn.ID)
	}
	n, err := c.cfg.Store.GetNode(ctx, owner)
	if err != nil {
		return fmt.Errorf("the node of snapshot %s: %w", sn.ID, err)
	}
	if n.State == StateDown {
		return fmt.Errorf("node %s, which holds snapshot %s, is down", n.ID, sn.ID)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, peerURL(n)+"/cluster/v1/snapshots/"+sn.ID+"/files", nil)
	if err != nil {
		return err
	}
	resp, err := c.client.Do(req)
	if err != nil {
		return fmt.Errorf("fetching snapshot %s from node %s: %w", sn.ID, n.ID, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		return fmt.Errorf("fetching snapshot %s from node %s: %s: %s", sn.ID, n.ID, resp.Status, strings.TrimSpace(string(msg)))
	}
	if err := readExtents(resp.Body, dir); err != nil {
		return fmt.Errorf("fetching snapshot %s from node %s: %w", sn.ID, n.ID, err)
	}
	return nil
}
