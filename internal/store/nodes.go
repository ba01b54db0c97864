package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/emberbox/emberbox/internal/cluster"
	"github.com/emberbox/emberbox/internal/errdefs"
	"github.com/emberbox/emberbox/internal/sandbox"
)

// nodeRows are the store's methods on the nodes of a cluster and the sandboxes that move between them.
type nodeRows struct{ *backend }

// nodeScope is the node of a cluster this store works for, and the epoch
// it registered with: the fencing token its writes carry.
type nodeScope struct {
	id    string
	epoch int64
}

// SetNode scopes the store to node id at epoch (from RegisterNode). From
// then on the sandboxes and snapshots it inserts are that node's, ListLive
// and the housekeeping lists (ListOptions.Local, expired snapshots,
// stopped disks) see that node's alone, and every sandbox write it makes
// is fenced: refused with code "node_fenced" unless the sandbox is this
// node's and the node's epoch in the store is still epoch (another node
// declaring it lost bumps the epoch).
func (s *nodeRows) SetNode(id string, epoch int64) {
	s.node.Store(&nodeScope{id: id, epoch: epoch})
}

// localOnly is the condition that keeps a sandboxes or snapshots query to
// this node's rows, and its argument; empty off a cluster.
func (s *backend) localOnly() (string, []any) {
	if n := s.node.Load(); n != nil {
		return " AND node_id = ?", []any{n.id}
	}
	return "", nil
}

func errFenced(format string, args ...any) error {
	return errdefs.New(errdefs.ErrConflict, "node_fenced", format, args...).
		WithHint("this node was declared lost or the sandbox moved; the node stands down and starts again")
}

// checkFence refuses a write of a node the cluster no longer counts as the
// one that registered (declared down, or started again since).
func (s *backend) checkFence(ctx context.Context, tx *txHandle) error {
	n := s.node.Load()
	if n == nil {
		return nil
	}
	var epoch int64
	var state string
	err := tx.QueryRowContext(ctx, `SELECT epoch, state FROM nodes WHERE id = ?`, n.id).Scan(&epoch, &state)
	if errors.Is(err, sql.ErrNoRows) {
		return errFenced("node %s is not registered", n.id)
	}
	if err != nil {
		return fmt.Errorf("reading the node's fence: %w", err)
	}
	if epoch != n.epoch || state == cluster.StateDown {
		return errFenced("node %s is fenced: its epoch is %d (%s), this process holds %d", n.id, epoch, state, n.epoch)
	}
	return nil
}

// checkOwner refuses a write to a sandbox another node owns, and any write
// of a fenced node.
func (s *backend) checkOwner(ctx context.Context, tx *txHandle, owner string) error {
	n := s.node.Load()
	if n == nil {
		return nil
	}
	if owner != n.id {
		return errFenced("the sandbox is node %q's, not %s's", owner, n.id)
	}
	return s.checkFence(ctx, tx)
}

const nodeColumns = `id, address, api_url, state, epoch, memory_mib, overhead_mib, vcpus, accel, images,
	version, started_at, heartbeat_at, down_at`

// RegisterNode records node n as started, or started again: its epoch is
// one more than before (1 for a new node), its heartbeat now, and its state
// up, or draining if it was draining. It returns the new epoch, the fencing
// token of this process.
func (s *nodeRows) RegisterNode(ctx context.Context, n *cluster.Node) (int64, error) {
	images, err := json.Marshal(emptyIfNil(n.Images))
	if err != nil {
		return 0, fmt.Errorf("registering node %s: %w", n.ID, err)
	}
	now := formatTime(s.now())
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return 0, fmt.Errorf("registering node %s: %w", n.ID, err)
	}
	defer tx.Rollback()
	var epoch int64
	var state string
	err = tx.QueryRowContext(ctx, `SELECT epoch, state FROM nodes WHERE id = ?`, n.ID).Scan(&epoch, &state)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		epoch, state = 1, cluster.StateUp
		_, err = tx.ExecContext(ctx, `INSERT INTO nodes (`+nodeColumns+`)
			VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, NULL)`,
			n.ID, n.Address, n.APIURL, state, epoch, n.MemoryMiB, n.OverheadMiB, n.VCPUs, n.Accel, string(images),
			n.Version, now, now)
	case err == nil:
		epoch++
		if state != cluster.StateDraining {
			state = cluster.StateUp
		}
		_, err = tx.ExecContext(ctx, `UPDATE nodes SET address = ?, api_url = ?, state = ?, epoch = ?,
			memory_mib = ?, overhead_mib = ?, vcpus = ?, accel = ?, images = ?, version = ?,
			started_at = ?, heartbeat_at = ?, down_at = NULL WHERE id = ?`,
			n.Address, n.APIURL, state, epoch, n.MemoryMiB, n.OverheadMiB, n.VCPUs, n.Accel, string(images),
			n.Version, now, now, n.ID)
	}
	if err != nil {
		return 0, fmt.Errorf("registering node %s: %w", n.ID, err)
	}
	if err := tx.Commit(); err != nil {
		return 0, fmt.Errorf("registering node %s: %w", n.ID, err)
	}
	return epoch, nil
}

func emptyIfNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

// Heartbeat records node id alive at epoch. A node the cluster declared
// down, or one that registered again since (another process with its id),
// gets code "node_fenced": it must stand down.
func (s *nodeRows) Heartbeat(ctx context.Context, id string, epoch int64) error {
	// Apart from the cluster's write lock: a heartbeat that queued behind
	// other nodes' writes arrived late, already older than its own time,
	// and a busy store made healthy nodes look silent.
	res, err := s.db.execApart(ctx, `UPDATE nodes SET heartbeat_at = ?
		WHERE id = ? AND epoch = ? AND state <> 'down'`, formatTime(s.now()), id, epoch)
	if err != nil {
		return fmt.Errorf("heartbeat of node %s: %w", id, err)
	}
	if n, err := res.RowsAffected(); err != nil {
		return fmt.Errorf("heartbeat of node %s: %w", id, err)
	} else if n == 0 {
		return errFenced("node %s at epoch %d was declared down or started again", id, epoch)
	}
	return nil
}

// ListNodes returns every node, by id, with what its sandboxes hold: the
// memory of those with a VM (not paused, stopped or deleted) plus the
// node's overhead for each, as its admission ledger counts them.
func (s *nodeRows) ListNodes(ctx context.Context) ([]*cluster.Node, error) {
	return listNodes(ctx, s.db, "")
}

type querier interface {
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

// listNodes reads every node, or node id alone when id is not "" (the
// router reads one per proxied call: the join then scans that node's
// sandboxes only).
func listNodes(ctx context.Context, db querier, id string) ([]*cluster.Node, error) {
	where, args := "", []any(nil)
	if id != "" {
		where, args = "WHERE n.id = ?", []any{id}
	}
	rows, err := db.QueryContext(ctx, `SELECT n.id, n.address, n.api_url, n.state, n.epoch, n.memory_mib,
		n.overhead_mib, n.vcpus, n.accel, n.images, n.version, n.started_at, n.heartbeat_at, n.down_at,
		coalesce(sum(s.memory_mib), 0), count(s.id), coalesce(sum(s.vcpu), 0)
		FROM nodes AS n LEFT JOIN sandboxes AS s
			ON s.node_id = n.id AND s.state NOT IN ('paused', 'stopped', 'deleted')
		`+where+`
		GROUP BY n.id, n.address, n.api_url, n.state, n.epoch, n.memory_mib, n.overhead_mib, n.vcpus,
			n.accel, n.images, n.version, n.started_at, n.heartbeat_at, n.down_at
		ORDER BY n.id`, args...)
	if err != nil {
		return nil, fmt.Errorf("listing nodes: %w", err)
	}
	defer rows.Close()
	var list []*cluster.Node
	for rows.Next() {
		var (
			n                  cluster.Node
			images             string
			started, heartbeat string
			down               sql.NullString
			memory, count, cpu int64
		)
		if err := rows.Scan(&n.ID, &n.Address, &n.APIURL, &n.State, &n.Epoch, &n.MemoryMiB, &n.OverheadMiB,
			&n.VCPUs, &n.Accel, &images, &n.Version, &started, &heartbeat, &down, &memory, &count, &cpu); err != nil {
			return nil, fmt.Errorf("listing nodes: %w", err)
		}
		if err := json.Unmarshal([]byte(images), &n.Images); err != nil {
			return nil, fmt.Errorf("node %s: decoding images: %w", n.ID, err)
		}
		if n.StartedAt, err = parseTime(started); err != nil {
			return nil, err
		}
		if n.HeartbeatAt, err = parseTime(heartbeat); err != nil {
			return nil, err
		}
		if n.DownAt, err = parseTimePtr(down); err != nil {
			return nil, err
		}
		n.Running = int(count)
		n.CommittedMiB = memory + count*n.OverheadMiB
		n.CommittedVCPUs = int(cpu)
		list = append(list, &n)
	}
	return list, rows.Err()
}

// GetNode returns node id; a missing one is errdefs.ErrNotFound.
func (s *nodeRows) GetNode(ctx context.Context, id string) (*cluster.Node, error) {
	list, err := listNodes(ctx, s.db, id)
	if err != nil {
		return nil, err
	}
	if len(list) == 0 {
		return nil, errdefs.New(errdefs.ErrNotFound, "node_not_found", "node %s not found", id)
	}
	return list[0], nil
}

// Place returns the nodes that can take a sandbox as p asks, best first,
// read in one transaction against what the nodes' sandboxes hold: nodes up
// (not draining or down) whose heartbeat is after p.Alive, not in
// p.Exclude, p.Require if it is set, and with the memory free; the one left
// with the least free memory comes first (best fit), then by id. The
// owning node's admission ledger has the last word at its create, which
// answers no_capacity if two creates raced for its last room.
func (s *nodeRows) Place(ctx context.Context, p cluster.Placement) ([]*cluster.Node, error) {
	tx, err := s.db.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
	if err != nil {
		return nil, fmt.Errorf("placing a sandbox: %w", err)
	}
	defer tx.Rollback()
	nodes, err := listNodes(ctx, tx, "")
	if err != nil {
		return nil, fmt.Errorf("placing a sandbox: %w", err)
	}
	_ = tx.Commit()
	return cluster.Choose(nodes, p), nil
}

// StaleNodes returns the nodes not down whose last heartbeat is before
// cutoff.
func (s *nodeRows) StaleNodes(ctx context.Context, cutoff time.Time) ([]string, error) {
	ids, err := queryRows(ctx, s.db, scanString, `SELECT id FROM nodes WHERE state <> 'down' AND heartbeat_at < ? ORDER BY id`,
		formatTime(cutoff))
	if err != nil {
		return nil, fmt.Errorf("listing silent nodes: %w", err)
	}
	return ids, nil
}

// DeclareLost marks node id down, in one transaction, if it is still not
// down and silent since before cutoff: its epoch moves on (so the process,
// if it still runs, is fenced) and every sandbox it held that is not
// stopped or deleted is stopped with reason node_lost, its open meter
// dropped (the counters went with the node) and an event recorded. It
// returns the sandboxes it stopped; none if another node got there first
// or the node spoke meanwhile.
func (s *nodeRows) DeclareLost(ctx context.Context, id string, cutoff time.Time, by string) ([]string, error) {
	now := formatTime(s.now())
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return nil, fmt.Errorf("declaring node %s lost: %w", id, err)
	}
	defer tx.Rollback()
	res, err := tx.ExecContext(ctx, `UPDATE nodes SET state = 'down', epoch = epoch + 1, down_at = ?
		WHERE id = ? AND state <> 'down' AND heartbeat_at < ?`, now, id, formatTime(cutoff))
	if err != nil {
		return nil, fmt.Errorf("declaring node %s lost: %w", id, err)
	}
	if n, err := res.RowsAffected(); err != nil || n == 0 {
		return nil, err
	}
	ids, err := queryRows(ctx, tx, scanString, `SELECT id FROM sandboxes
		WHERE node_id = ? AND state NOT IN ('stopped', 'deleted') ORDER BY id`, id)
	if err != nil {
		return nil, fmt.Errorf("declaring node %s lost: %w", id, err)
	}
	data, _ := json.Marshal(map[string]any{"node": id, "declaredBy": by})
	for _, sid := range ids {
		if _, err := tx.ExecContext(ctx, `UPDATE sandboxes SET state = 'stopped', stop_reason = ?, ended_at = ?,
			paused_at = NULL WHERE id = ?`, sandbox.ReasonNodeLost, now, sid); err != nil {
			return nil, fmt.Errorf("declaring node %s lost: stopping %s: %w", id, sid, err)
		}
		if _, err := tx.ExecContext(ctx, `DELETE FROM meters WHERE sandbox_id = ?`, sid); err != nil {
			return nil, fmt.Errorf("declaring node %s lost: %w", id, err)
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO sandbox_events (sandbox_id, type, message, data, at)
			VALUES (?, ?, ?, ?, ?)`, sid, "node_lost", "its node "+id+" stopped answering; the sandbox is stopped",
			string(data), now); err != nil {
			return nil, fmt.Errorf("declaring node %s lost: %w", id, err)
		}
	}
	if err := tx.Commit(); err != nil {
		return nil, fmt.Errorf("declaring node %s lost: %w", id, err)
	}
	return ids, nil
}

// SetNodeDraining starts (true) or ends a drain of node id: a draining node
// takes no new sandboxes and moves its paused ones away. A down node
// cannot be drained (code node_down).
func (s *nodeRows) SetNodeDraining(ctx context.Context, id string, draining bool) (*cluster.Node, error) {
	from, to := cluster.StateUp, cluster.StateDraining
	if !draining {
		from, to = to, from
	}
	res, err := s.db.ExecContext(ctx, `UPDATE nodes SET state = ? WHERE id = ? AND state IN (?, ?)`, to, id, from, to)
	if err != nil {
		return nil, fmt.Errorf("draining node %s: %w", id, err)
	}
	n, err := s.GetNode(ctx, id)
	if err != nil {
		return nil, err
	}
	if k, _ := res.RowsAffected(); k == 0 && n.State == cluster.StateDown {
		return nil, errdefs.New(errdefs.ErrConflict, "node_down", "node %s is down", id)
	}
	return n, nil
}

// MoveSandbox makes paused sandbox id node to's instead of node from's,
// in one transaction, with an event; and with it those of its
// checkpoints that are node from's and named in checkpoints (their files
// arrived with it). It fails with code "not_movable" if the sandbox is no
// longer paused on from. The receiving node calls it, with everything in
// place, as the commit of its MoveIn.
func (s *nodeRows) MoveSandbox(ctx context.Context, id, from, to string, checkpoints []string) error {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("moving sandbox %s: %w", id, err)
	}
	defer tx.Rollback()
	if err := s.checkFence(ctx, tx); err != nil {
		return fmt.Errorf("moving sandbox %s: %w", id, err)
	}
	res, err := tx.ExecContext(ctx, `UPDATE sandboxes SET node_id = ?
		WHERE id = ? AND node_id = ? AND state = 'paused'`, to, id, from)
	if err != nil {
		return fmt.Errorf("moving sandbox %s: %w", id, err)
	}
	if n, err := res.RowsAffected(); err != nil {
		return fmt.Errorf("moving sandbox %s: %w", id, err)
	} else if n == 0 {
		return errdefs.New(errdefs.ErrConflict, "not_movable", "sandbox %s is not paused on node %s", id, from)
	}
	for chunk := range slices.Chunk(checkpoints, 500) {
		args := []any{to, id, from}
		for _, cid := range chunk {
			args = append(args, cid)
		}
		if _, err := tx.ExecContext(ctx, `UPDATE snapshots SET node_id = ?
			WHERE checkpoint_of = ? AND node_id = ? AND id IN (?`+strings.Repeat(", ?", len(chunk)-1)+`)`,
			args...); err != nil {
			return fmt.Errorf("moving the checkpoints of sandbox %s: %w", id, err)
		}
	}
	data, _ := json.Marshal(map[string]any{"from": from, "to": to, "checkpoints": len(checkpoints)})
	if _, err := tx.ExecContext(ctx, `INSERT INTO sandbox_events (sandbox_id, type, message, data, at)
		VALUES (?, ?, ?, ?, ?)`, id, "moved", "moved from node "+from+" to node "+to, string(data),
		formatTime(s.now())); err != nil {
		return fmt.Errorf("moving sandbox %s: %w", id, err)
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("moving sandbox %s: %w", id, err)
	}
	return nil
}

// OwnerNode returns the node of the sandbox or snapshot id (table
// "sandboxes" or "snapshots"): "" if it is on no node, unknown or deleted,
// which any node answers for from the store.
func (s *nodeRows) OwnerNode(ctx context.Context, table, id string) (string, error) {
	if !slices.Contains([]string{"sandboxes", "snapshots"}, table) {
		return "", fmt.Errorf("owner node: unknown table %q", table)
	}
	var node, state string
	err := s.db.QueryRowContext(ctx, `SELECT node_id, state FROM `+table+` WHERE id = ?`, id).Scan(&node, &state)
	if errors.Is(err, sql.ErrNoRows) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("finding the node of %s: %w", id, err)
	}
	if state == "deleted" {
		return "", nil // nothing of it is left on a node: any node answers
	}
	return node, nil
}

// SnapshotsElsewhere returns those of the snapshots and checkpoints ids
// that another node holds and that no sandbox of this node, not deleted
// and with its disk, is a copy of: this node removes its files of those
// (a checkpoint moved with its sandbox, a snapshot fetched for a copy).
// Off a cluster it returns none.
func (s *nodeRows) SnapshotsElsewhere(ctx context.Context, ids []string) ([]string, error) {
	n := s.node.Load()
	if n == nil {
		return nil, nil
	}
	var away []string
	for chunk := range slices.Chunk(ids, 500) {
		args := []any{n.id, n.id}
		for _, id := range chunk {
			args = append(args, id)
		}
		got, err := queryRows(ctx, s.db, scanString, `SELECT id FROM snapshots AS sn
			WHERE node_id <> ? AND node_id <> ''
			AND NOT EXISTS (SELECT 1 FROM sandboxes
				WHERE snapshot_id = sn.id AND node_id = ? AND state <> 'deleted' AND disk_removed_at IS NULL)
			AND id IN (?`+strings.Repeat(", ?", len(chunk)-1)+`) ORDER BY id`, args...)
		if err != nil {
			return nil, fmt.Errorf("finding snapshots another node holds: %w", err)
		}
		away = append(away, got...)
	}
	return away, nil
}

// MovedAway returns those of ids whose sandbox the store gives to another
// node (not deleted): a node that died after a drain moved one of its
// paused sandboxes, but before it removed the files, finds them at its
// next start and removes them. Off a cluster it returns none.
func (s *nodeRows) MovedAway(ctx context.Context, ids []string) ([]string, error) {
	n := s.node.Load()
	if n == nil {
		return nil, nil
	}
	var away []string
	for chunk := range slices.Chunk(ids, 500) {
		args := []any{n.id}
		for _, id := range chunk {
			args = append(args, id)
		}
		rows, err := s.db.QueryContext(ctx, `SELECT id FROM sandboxes
			WHERE node_id <> ? AND node_id <> '' AND state <> 'deleted'
			AND id IN (?`+strings.Repeat(", ?", len(chunk)-1)+`) ORDER BY id`, args...)
		if err != nil {
			return nil, fmt.Errorf("finding sandboxes moved away: %w", err)
		}
		for rows.Next() {
			var id string
			if err := rows.Scan(&id); err != nil {
				rows.Close()
				return nil, fmt.Errorf("finding sandboxes moved away: %w", err)
			}
			away = append(away, id)
		}
		err = rows.Err()
		rows.Close()
		if err != nil {
			return nil, fmt.Errorf("finding sandboxes moved away: %w", err)
		}
	}
	return away, nil
}

// LostSandboxes returns this node's sandboxes that the cluster stopped
// with reason node_lost and whose files are still here: a node that comes
// back ends any VM of them still running before it serves.
func (s *nodeRows) LostSandboxes(ctx context.Context) ([]*sandbox.Sandbox, error) {
	n := s.node.Load()
	if n == nil {
		return nil, nil
	}
	list, err := queryRows(ctx, s.db, scanSandbox, `SELECT `+sandboxColumns+` FROM sandboxes
		WHERE node_id = ? AND state = 'stopped' AND stop_reason = ? AND disk_removed_at IS NULL ORDER BY id`,
		n.id, sandbox.ReasonNodeLost)
	if err != nil {
		return nil, fmt.Errorf("listing lost sandboxes: %w", err)
	}
	return list, nil
}

// ClusterSetting returns the shared setting name, or put if it has none
// yet: the first node to ask decides (the cluster's CA).
func (s *nodeRows) ClusterSetting(ctx context.Context, name string, put func() (string, error)) (string, error) {
	var v string
	err := s.db.QueryRowContext(ctx, `SELECT value FROM cluster_settings WHERE name = ?`, name).Scan(&v)
	if err == nil {
		return v, nil
	}
	if !errors.Is(err, sql.ErrNoRows) {
		return "", fmt.Errorf("reading cluster setting %s: %w", name, err)
	}
	v, err = put()
	if err != nil {
		return "", err
	}
	// Another node may have put one meanwhile: the stored one wins.
	if _, err := s.db.ExecContext(ctx, `INSERT INTO cluster_settings (name, value) VALUES (?, ?)
		ON CONFLICT (name) DO NOTHING`, name, v); err != nil {
		return "", fmt.Errorf("storing cluster setting %s: %w", name, err)
	}
	if err := s.db.QueryRowContext(ctx, `SELECT value FROM cluster_settings WHERE name = ?`, name).Scan(&v); err != nil {
		return "", fmt.Errorf("reading cluster setting %s: %w", name, err)
	}
	return v, nil
}

// ReadClusterSetting returns the shared setting name, or a not-found
// error if it has none.
func (s *nodeRows) ReadClusterSetting(ctx context.Context, name string) (string, error) {
	var v string
	err := s.db.QueryRowContext(ctx, `SELECT value FROM cluster_settings WHERE name = ?`, name).Scan(&v)
	if errors.Is(err, sql.ErrNoRows) {
		return "", errdefs.New(errdefs.ErrNotFound, "setting_not_found", "no cluster setting %s", name)
	}
	if err != nil {
		return "", fmt.Errorf("reading cluster setting %s: %w", name, err)
	}
	return v, nil
}

// SwapClusterSetting replaces the shared setting name by next if it is
// still prev: a conflict error if another node changed it first, not
// found if it has none.
func (s *nodeRows) SwapClusterSetting(ctx context.Context, name, prev, next string) error {
	res, err := s.db.ExecContext(ctx, `UPDATE cluster_settings SET value = ? WHERE name = ? AND value = ?`, next, name, prev)
	if err != nil {
		return fmt.Errorf("storing cluster setting %s: %w", name, err)
	}
	if n, err := res.RowsAffected(); err != nil || n == 1 {
		return err
	}
	if _, err := s.ReadClusterSetting(ctx, name); err != nil {
		return err
	}
	return errdefs.New(errdefs.ErrConflict, "setting_changed", "cluster setting %s was changed meanwhile", name)
}
