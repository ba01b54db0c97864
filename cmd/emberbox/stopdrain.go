package main

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"time"

	"github.com/emberbox/emberbox/internal/cluster"
	"github.com/emberbox/emberbox/internal/sandbox"
)

// A node of a cluster asked to stop (SIGTERM: a rolling upgrade, a pod
// deleted) first moves its running sandboxes to other nodes, so that they
// outlive it: their VMs run in its process tree. Paused sandboxes stay,
// as their files outlive the process. It marks itself draining for that
// (no new sandboxes come) and notes so in the data dir, and the next start
// on that data dir ends the drain once it serves again. A node an
// operator drained stays drained.

// stopDrainMarker names the note, in the data dir, that this node drained
// itself to stop.
const stopDrainMarker = "drained-to-stop"

// drainBeforeStop moves this node's running sandboxes away, for at most
// --stop-drain-timeout, before the server stops.
func (s *server) drainBeforeStop(ctx context.Context) {
	if s.cl == nil || s.o.cluster.stopDrain <= 0 {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, s.o.cluster.stopDrain)
	defer cancel()
	log := s.log.With("node", s.cl.ID())
	self, err := s.st.GetNode(ctx, s.cl.ID())
	if err != nil {
		log.Warn("stopping without moving running sandboxes: reading this node", "err", err)
		return
	}
	if self.State != cluster.StateDraining {
		if err := os.WriteFile(filepath.Join(s.o.dataDir, stopDrainMarker), nil, 0o600); err != nil {
			log.Warn("stopping without moving running sandboxes", "err", err)
			return
		}
		if _, err := s.st.SetNodeDraining(ctx, s.cl.ID(), true); err != nil {
			log.Warn("stopping without moving running sandboxes: draining this node", "err", err)
			return
		}
	}
	s.cl.SetStopping()
	start := time.Now()
	log.Info("stopping: moving this node's running sandboxes to other nodes first", "timeout", s.o.cluster.stopDrain)
	t := time.NewTicker(500 * time.Millisecond)
	defer t.Stop()
	for {
		n, err := s.liveHere(ctx)
		// A sandbox paused for its move is still here until it has moved.
		if err == nil && n == 0 && s.mgr.Moves.Moving() == 0 {
			log.Info("stopping: no sandbox runs here any more", "took", time.Since(start).Round(time.Millisecond))
			return
		}
		if !s.otherNodeUp(ctx) {
			log.Warn("stopping with sandboxes still running here: no other node is up to take them", "running", n)
			return
		}
		select {
		case <-ctx.Done():
			log.Warn("stopping with sandboxes still running here: they stop with this node", "running", n,
				"stop_drain_timeout", s.o.cluster.stopDrain)
			return
		case <-t.C:
		}
	}
}

// liveHere counts this node's sandboxes with a VM, or about to have one.
func (s *server) liveHere(ctx context.Context) (int, error) {
	list, _, err := s.st.ListSandboxes(ctx, sandbox.ListOptions{AllOwners: true, Local: true, Limit: 100,
		States: []sandbox.State{sandbox.StateStarting, sandbox.StateRunning, sandbox.StatePausing, sandbox.StateResuming}})
	return len(list), err
}

// otherNodeUp reports whether a node other than this one takes sandboxes.
func (s *server) otherNodeUp(ctx context.Context) bool {
	nodes, err := s.st.ListNodes(ctx)
	if err != nil {
		return true // the store is slow: keep trying until the timeout
	}
	alive := time.Now().Add(-s.o.cluster.timeout)
	for _, n := range nodes {
		if n.ID != s.cl.ID() && n.State == cluster.StateUp && n.HeartbeatAt.After(alive) {
			return true
		}
	}
	return false
}

// undrainAfterStop ends the drain this node began to stop, now that it
// serves again.
func (s *server) undrainAfterStop(ctx context.Context) error {
	if s.cl == nil {
		return nil
	}
	marker := filepath.Join(s.o.dataDir, stopDrainMarker)
	if _, err := os.Stat(marker); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if _, err := s.st.SetNodeDraining(ctx, s.cl.ID(), false); err != nil {
		return err
	}
	s.log.Info("this node drained itself to stop; it takes sandboxes again")
	return os.Remove(marker)
}
