package cluster

import (
	"cmp"
	"slices"
	"time"
)

// Node states.
const (
	StateUp       = "up"
	StateDraining = "draining" // takes no new sandboxes; moves its paused ones away
	StateDown     = "down"     // declared lost; its epoch moved on
)

// Node is one server of a cluster, as the store keeps it.
type Node struct {
	ID      string
	Address string // host:port of its node-to-node listener
	APIURL  string
	State   string
	// Epoch is the fencing token: one more at each start of the node and
	// when it is declared down. A process whose epoch is not the stored
	// one may not write.
	Epoch       int64
	MemoryMiB   int64 // what it may promise in all
	OverheadMiB int64 // what it charges each sandbox besides its memory
	VCPUs       int
	Accel       string
	Images      []string // digests of the images it boots
	Version     string
	StartedAt   time.Time
	HeartbeatAt time.Time
	DownAt      *time.Time

	// Filled in by listings: what its sandboxes with a VM hold.
	Running        int
	CommittedMiB   int64
	CommittedVCPUs int
	// SuspectSince is set by Cluster.ListNodes when the node answering
	// has found this one's heartbeat stale while it still answers probes
	// (liveness.go): it takes no placements from there meanwhile.
	SuspectSince *time.Time
}

// FreeMiB is the memory the node may still promise.
func (n *Node) FreeMiB() int64 { return n.MemoryMiB - n.CommittedMiB }

// Placement is what a create asks of the node it runs on.
type Placement struct {
	MemoryMiB int64 // the sandbox's memory; each node adds its overhead
	VCPU      int   // the sandbox's vCPUs
	// Alive: only nodes whose last heartbeat is after it.
	Alive time.Time
	// Exclude: nodes it must not run on (spreadFrom).
	Exclude []string
	// Require: the one node it must run on ("" any).
	Require string
	// Prefer: the node that comes first if it can take it ("" none), e.g.
	// the node that holds the snapshot it is a copy of (another node
	// fetches the snapshot first).
	Prefer string
	// Image: a digest every candidate must boot ("" any).
	Image string
}

// Choose returns the nodes of list that can take p, best first: up (not
// draining or down), alive, allowed, with the memory and vCPUs free; p.Prefer
// first, then the one left with the least free memory (best fit), then by
// id.
func Choose(list []*Node, p Placement) []*Node {
	var out []*Node
	for _, n := range list {
		switch {
		case n.State != StateUp, n.HeartbeatAt.Before(p.Alive),
			slices.Contains(p.Exclude, n.ID), p.Require != "" && n.ID != p.Require,
			p.Image != "" && !slices.Contains(n.Images, p.Image),
			n.FreeMiB() < p.MemoryMiB+n.OverheadMiB,
			n.VCPUs > 0 && n.CommittedVCPUs+p.VCPU > n.VCPUs:
			continue
		}
		out = append(out, n)
	}
	slices.SortFunc(out, func(a, b *Node) int {
		return cmp.Or(cmp.Compare(b2i(b.ID == p.Prefer), b2i(a.ID == p.Prefer)),
			cmp.Compare(a.FreeMiB()-a.OverheadMiB, b.FreeMiB()-b.OverheadMiB), cmp.Compare(a.ID, b.ID))
	})
	return out
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}
