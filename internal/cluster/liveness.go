package cluster

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"slices"
	"sync"
	"time"
)

// A node silent in the store is not yet lost: the store may be slow (a
// disk busy with a drain, a long commit) while the node runs and serves.
// Before declaring it lost, a node asks it over the channel, and if that
// fails asks up to two other live nodes to try (a path of their own, as
// SWIM's indirect probe); a node that answers any of them is suspect (no
// placements, no moves to it: its heartbeat is stale) and never lost. Only silence on every path
// declares it lost, and fences it.

// maxIndirectProbes bounds the nodes asked to probe a silent one.
const maxIndirectProbes = 2

// aliveReply is what a node answers on /cluster/v1/alive.
type aliveReply struct {
	ID    string `json:"id"`
	Epoch int64  `json:"epoch"`
	// HeartbeatAgoMs is how long ago its last heartbeat reached the
	// store, as it saw it (-1: none yet).
	HeartbeatAgoMs int64 `json:"heartbeatAgoMs"`
}

// suspects are the nodes silent in the store that answered a probe.
type suspects struct {
	mu  sync.Mutex
	ids map[string]time.Time // since when
}

// set replaces the suspects by ids, keeping when each was first seen.
func (s *suspects) set(ids []string, now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	next := make(map[string]time.Time, len(ids))
	for _, id := range ids {
		since, ok := s.ids[id]
		if !ok {
			since = now
		}
		next[id] = since
	}
	s.ids = next
}

// since is when id became a suspect (false: it is none).
func (s *suspects) since(id string) (time.Time, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	t, ok := s.ids[id]
	return t, ok
}

// ListNodes lists the cluster's nodes as the store has them, each marked
// with SuspectSince if this node suspects it: the API's node listing.
func (c *Cluster) ListNodes(ctx context.Context) ([]*Node, error) {
	list, err := c.cfg.Store.ListNodes(ctx)
	if err != nil {
		return nil, err
	}
	for _, n := range list {
		if t, ok := c.suspect.since(n.ID); ok {
			n.SuspectSince = &t
		}
	}
	return list, nil
}

// SetNodeDraining starts or ends a drain of node id (Store.SetNodeDraining).
func (c *Cluster) SetNodeDraining(ctx context.Context, id string, draining bool) (*Node, error) {
	return c.cfg.Store.SetNodeDraining(ctx, id, draining)
}

func (s *suspects) has(id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.ids[id]
	return ok
}

// probeTimeout bounds one probe: a heartbeat's worth, at most 2 s.
func (c *Cluster) probeTimeout() time.Duration {
	return min(c.cfg.Heartbeat, 2*time.Second)
}

// serveAlive answers a peer's probe: this node's id, epoch and how long
// ago its heartbeat last reached the store.
func (c *Cluster) serveAlive(w http.ResponseWriter, _ *http.Request) {
	ago := int64(-1)
	if t := c.lastBeat.Load(); t != 0 {
		ago = time.Since(time.Unix(0, t)).Milliseconds()
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(aliveReply{ID: c.ID(), Epoch: c.epoch, HeartbeatAgoMs: ago})
}

// serveProbe probes node {id} for a peer that could not reach it: 200 with
// its answer if it answered, 504 if not.
func (c *Cluster) serveProbe(w http.ResponseWriter, r *http.Request) {
	n, err := c.cfg.Store.GetNode(r.Context(), r.PathValue("id"))
	if err != nil {
		http.Error(w, "no such node", http.StatusNotFound)
		return
	}
	reply, ok := c.askAlive(r.Context(), n)
	if !ok {
		http.Error(w, "no answer", http.StatusGatewayTimeout)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(reply)
}

// askAlive asks node n directly whether it is alive.
func (c *Cluster) askAlive(ctx context.Context, n *Node) (aliveReply, bool) {
	return c.getAlive(ctx, peerURL(n)+"/cluster/v1/alive", n.ID)
}

// askThrough asks via to probe node n.
func (c *Cluster) askThrough(ctx context.Context, via, n *Node) (aliveReply, bool) {
	return c.getAlive(ctx, peerURL(via)+"/cluster/v1/probe/"+n.ID, n.ID)
}

func (c *Cluster) getAlive(ctx context.Context, url, id string) (aliveReply, bool) {
	ctx, cancel := context.WithTimeout(ctx, c.probeTimeout())
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return aliveReply{}, false
	}
	resp, err := c.client.Do(req)
	if err != nil {
		return aliveReply{}, false
	}
	defer resp.Body.Close()
	var reply aliveReply
	if resp.StatusCode != http.StatusOK || json.NewDecoder(io.LimitReader(resp.Body, 4<<10)).Decode(&reply) != nil || reply.ID != id {
		return aliveReply{}, false
	}
	return reply, true
}

// reach asks silent node n, directly and then through up to
// maxIndirectProbes other live nodes, whether it is alive; it returns its
// answer and the path that got it ("direct" or the node that relayed), or
// false if none did.
func (c *Cluster) reach(ctx context.Context, n *Node, nodes []*Node, silent []string) (aliveReply, string, bool) {
	if reply, ok := c.askAlive(ctx, n); ok {
		return reply, "direct", true
	}
	asked := 0
	for _, via := range nodes {
		if asked == maxIndirectProbes {
			break
		}
		if via.ID == c.ID() || via.ID == n.ID || via.State == StateDown || slices.Contains(silent, via.ID) {
			continue
		}
		asked++
		if reply, ok := c.askThrough(ctx, via, n); ok {
			return reply, via.ID, true
		}
	}
	return aliveReply{}, "", false
}
