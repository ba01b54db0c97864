package cluster

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/emberbox/emberbox/internal/errdefs"
	"github.com/emberbox/emberbox/internal/sandbox"
)

// Store is what the cluster needs of the shared store, by role; the
// store's one value (store.Store) fills both.
type Store struct {
	Nodes
	Sandboxes
}

// Nodes keeps the cluster's members and settings.
type Nodes interface {
	RegisterNode(ctx context.Context, n *Node) (int64, error)
	SetNode(id string, epoch int64)
	Heartbeat(ctx context.Context, id string, epoch int64) error
	ListNodes(ctx context.Context) ([]*Node, error)
	GetNode(ctx context.Context, id string) (*Node, error)
	Place(ctx context.Context, p Placement) ([]*Node, error)
	StaleNodes(ctx context.Context, cutoff time.Time) ([]string, error)
	DeclareLost(ctx context.Context, id string, cutoff time.Time, by string) ([]string, error)
	SetNodeDraining(ctx context.Context, id string, draining bool) (*Node, error)
	ClusterSetting(ctx context.Context, name string, put func() (string, error)) (string, error)
}

// Sandboxes is the shared record of sandboxes: where each is and what it is.
type Sandboxes interface {
	MoveSandbox(ctx context.Context, id, from, to string, checkpoints []string) error
	OwnerNode(ctx context.Context, table, id string) (string, error)
	GetSandbox(ctx context.Context, id string) (*sandbox.Sandbox, error)
	ListSandboxes(ctx context.Context, opts sandbox.ListOptions) ([]*sandbox.Sandbox, string, error)
}

// Mover is what the cluster needs of the manager to hand sandboxes
// between nodes (sandbox.Moves): paused ones as they are, running ones
// paused for the move and woken where they arrive, each with its
// checkpoints.
type Mover interface {
	MoveOut(ctx context.Context, id string, send func(ctx context.Context, out *sandbox.Outgoing) error) error
	MoveIn(ctx context.Context, in sandbox.Incoming) error
	StageCheckpoint(ctx context.Context, id, cid string, receive func(ctx context.Context, dir string) error) error
	OutgoingCheckpoints(ctx context.Context, id string) []sandbox.OutgoingCheckpoint
	PauseForMove(ctx context.Context, id string) error
	WakeMoved(ctx context.Context, id string) error
	BeginMove(id string)
	EndMove(id string)
}

// Config configures this node of a cluster.
type Config struct {
	Store Store
	// Self describes this node; ID, Address and the capacity are required.
	Self Node
	// CA signs the node-to-node channel's certificates.
	CA *CA
	// Heartbeat is how often this node says it is alive and looks for
	// silent nodes; Timeout how long a node may be silent before it is
	// declared lost.
	Heartbeat, Timeout time.Duration
	// Fenced is called once if the store refuses this node's heartbeat:
	// the cluster declared it lost, and its sandboxes were stopped; the
	// server must end its VMs and stop serving.
	Fenced func(error)
	Logger *slog.Logger
}

// Cluster is this node's membership of a cluster.
type Cluster struct {
	cfg    Config
	log    *slog.Logger
	epoch  int64
	tls    *NodeTLS
	client *http.Client
	fenced sync.Once
	mover  atomic.Pointer[Mover] // set by RunDrain
	admit  atomic.Pointer[Admit] // set by SetAdmit
	// snapshots serves this node's snapshots to nodes that copy them
	// (snapshots.go); set by SetSnapshots.
	snapshots atomic.Pointer[SnapshotSource]
	// lastBeat is when this node's heartbeat last reached the store
	// (unix nanoseconds; 0: not yet).
	lastBeat atomic.Int64
	suspect  suspects // silent nodes that answered a probe: liveness.go
	// stopping: the node drains to stop, moving its running sandboxes
	// only (paused ones outlive the process).
	stopping atomic.Bool
}

// SetStopping makes this node's drain move its running sandboxes only:
// it drains to stop, and its paused sandboxes' files stay with the host.
func (c *Cluster) SetStopping() { c.stopping.Store(true) }

// Join registers this node (its epoch one more than before), scopes the
// store to it, and makes its TLS identity. Call it before the manager
// recovers its sandboxes: what it recovers is this node's.
func Join(ctx context.Context, cfg Config) (*Cluster, error) {
	if cfg.Heartbeat <= 0 {
		cfg.Heartbeat = 2 * time.Second
	}
	if cfg.Timeout < 3*cfg.Heartbeat {
		return nil, fmt.Errorf("the node timeout (%s) must be at least three heartbeats (%s)", cfg.Timeout, 3*cfg.Heartbeat)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	host, _, err := net.SplitHostPort(cfg.Self.Address)
	if err != nil {
		return nil, fmt.Errorf("node address %q: %w", cfg.Self.Address, err)
	}
	nt, err := cfg.CA.Issue(cfg.Self.ID, host)
	if err != nil {
		return nil, err
	}
	epoch, err := cfg.Store.RegisterNode(ctx, &cfg.Self)
	if err != nil {
		return nil, err
	}
	cfg.Store.SetNode(cfg.Self.ID, epoch)
	c := &Cluster{cfg: cfg, log: cfg.Logger.With("node", cfg.Self.ID), epoch: epoch, tls: nt}
	c.client = &http.Client{Transport: c.transport()}
	c.log.Info("joined the cluster", "epoch", epoch, "address", cfg.Self.Address)
	return c, nil
}

// transport dials peers over the mutual-TLS channel, HTTP/1.1 (so that
// upgrades to WebSocket pass through the proxy).
func (c *Cluster) transport() *http.Transport {
	return &http.Transport{
		TLSClientConfig:     c.tls.Client.Clone(),
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		TLSHandshakeTimeout: 5 * time.Second,
		MaxIdleConnsPerHost: 32,
		IdleConnTimeout:     90 * time.Second,
	}
}

// ID is this node's id.
func (c *Cluster) ID() string { return c.cfg.Self.ID }

// Run beats the heart and declares silent nodes lost, until ctx ends or
// the store fences this node. The two run apart: probing a silent node
// takes time that must not delay this node's own heartbeat.
func (c *Cluster) Run(ctx context.Context) {
	ctx, cancel := context.WithCancel(ctx)
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		c.watch(ctx)
	}()
	defer func() { cancel(); <-watched }()
	t := time.NewTicker(c.cfg.Heartbeat)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if err := c.cfg.Store.Heartbeat(ctx, c.ID(), c.epoch); err != nil {
			if errdefs.IsConflict(err) {
				c.standDown(err)
				return
			}
			c.log.Warn("heartbeat", "err", err)
			continue
		}
		c.lastBeat.Store(time.Now().UnixNano())
	}
}

// watch looks for silent nodes every heartbeat, once this node's own
// heartbeat is stored (a node that cannot reach the store judges no one).
func (c *Cluster) watch(ctx context.Context) {
	t := time.NewTicker(c.cfg.Heartbeat)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if last := c.lastBeat.Load(); last == 0 || time.Since(time.Unix(0, last)) > c.cfg.Timeout {
			continue
		}
		c.declareSilent(ctx)
	}
}

// standDown ends this node's membership once the store refused its
// heartbeat: the cluster declared it lost (or another process took its
// id), its sandboxes are stopped in the store and belong to nobody here.
// It keeps the fence (it writes for none of them again) and says why.
func (c *Cluster) standDown(err error) {
	c.fenced.Do(func() {
		ago := "never"
		if t := c.lastBeat.Load(); t != 0 {
			ago = time.Since(time.Unix(0, t)).Round(time.Millisecond).String()
		}
		c.log.Error("this node was declared lost by the cluster while it ran; standing down and ending its VMs. "+
			"Its heartbeats did not reach the store in time and no node could reach it over the channel: "+
			"check the store's latency and the channel's reachability, or raise --node-timeout",
			"err", err, "last_heartbeat_stored_ago", ago, "node_timeout", c.cfg.Timeout, "heartbeat", c.cfg.Heartbeat)
		if c.cfg.Fenced != nil {
			c.cfg.Fenced(err)
		}
	})
}

// declareSilent declares lost every node silent in the store for longer
// than the timeout that no probe reaches (liveness.go); one that answers
// is suspect instead. Every node does this; the store's conditional
// update makes one of them win.
func (c *Cluster) declareSilent(ctx context.Context) {
	cutoff := time.Now().Add(-c.cfg.Timeout)
	ids, err := c.cfg.Store.StaleNodes(ctx, cutoff)
	if err != nil {
		c.log.Warn("looking for silent nodes", "err", err)
		return
	}
	var nodes []*Node
	if len(ids) > 0 {
		if nodes, err = c.cfg.Store.ListNodes(ctx); err != nil {
			c.log.Warn("looking for silent nodes", "err", err)
			return
		}
	}
	var answered []string
	for _, id := range ids {
		if id == c.ID() {
			continue // a node never declares itself; its heartbeat failing says enough
		}
		i := slices.IndexFunc(nodes, func(n *Node) bool { return n.ID == id })
		if i < 0 {
			continue
		}
		if reply, path, ok := c.reach(ctx, nodes[i], nodes, ids); ok {
			answered = append(answered, id)
			if !c.suspect.has(id) {
				c.log.Warn("a node is silent in the store but answers: suspect, not lost (no placements or moves to it)",
					"suspect", id, "answered_via", path, "its_last_heartbeat_stored_ms_ago", reply.HeartbeatAgoMs,
					"silent_for_more_than", c.cfg.Timeout)
			}
			continue
		}
		stopped, err := c.cfg.Store.DeclareLost(ctx, id, cutoff, c.ID())
		if err != nil {
			c.log.Warn("declaring a silent node lost", "lost", id, "err", err)
			continue
		}
		c.log.Warn("declared a silent node lost", "lost", id, "silent_for_more_than", c.cfg.Timeout,
			"unreachable", "directly and through the other nodes", "sandboxes_stopped", len(stopped))
	}
	c.suspect.set(answered, time.Now())
}

// alive is the heartbeat a node must have given to count as alive.
func (c *Cluster) alive() time.Time { return time.Now().Add(-c.cfg.Timeout) }

// peerURL is the base URL of node n's channel.
func peerURL(n *Node) string { return "https://" + n.Address }
