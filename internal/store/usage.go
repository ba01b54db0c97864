package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/emberbox/emberbox/internal/metering"
)

// meterRows are the store's methods on the metering tables (meters, usage, meter_points, storage_meters).
// A meter's transactions are scoped to it ("meter:" or "storage:" and its
// id): each reads and writes its own meter row, and adds to usage rows
// with single upserts, so the meters of different sandboxes settle in
// parallel.
type meterRows struct{ *backend }

// BeginMeter opens sandbox id's metering interval at r: from then on its
// VM's counters are charged. If an interval of the same VM is already
// open (a server that restarted and reattached), it is kept: the run is
// counted once and nothing is charged twice. An interval left open by a
// VM that is gone is replaced.
func (s *meterRows) BeginMeter(ctx context.Context, id, owner string, r metering.Reading) error {
	tx, err := s.db.beginScoped(ctx, "meter:"+id)
	if err != nil {
		return fmt.Errorf("opening the meter of %s: %w", id, err)
	}
	defer tx.Rollback()
	var vm string
	switch err := tx.QueryRowContext(ctx, `SELECT vm FROM meters WHERE sandbox_id = ?`, id).Scan(&vm); {
	case err == nil && vm == r.VM:
		return nil
	case err != nil && !errors.Is(err, sql.ErrNoRows):
		return fmt.Errorf("opening the meter of %s: %w", id, err)
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO meters (sandbox_id, vm, at_ms, cpu_ns, guest_cpu_ns, egress_bytes, ingress_bytes)
		VALUES (?, ?, ?, ?, ?, ?, ?)
		ON CONFLICT (sandbox_id) DO UPDATE SET vm = excluded.vm, at_ms = excluded.at_ms, cpu_ns = excluded.cpu_ns,
			guest_cpu_ns = excluded.guest_cpu_ns, egress_bytes = excluded.egress_bytes, ingress_bytes = excluded.ingress_bytes`, id, r.VM, r.At.UnixMilli(), r.CPUNs, r.GuestCPUNs, r.EgressBytes, r.IngressBytes); err != nil {
		return fmt.Errorf("opening the meter of %s: %w", id, err)
	}
	run := metering.Bucket{Hour: r.At.UTC().Truncate(time.Hour), Runs: 1}
	if err := s.addUsage(ctx, tx, id, metering.KindSandbox, owner, r.At, run); err != nil {
		return fmt.Errorf("opening the meter of %s: %w", id, err)
	}
	return tx.Commit()
}

// SettleMeter charges sandbox id's usage from its open interval's start to
// r, in the same transaction as it moves the interval's start to r (or,
// with final, closes it). It reports false, changing nothing, when no
// interval of r's VM is open: that usage was settled already.
func (s *meterRows) SettleMeter(ctx context.Context, id, owner string, shape metering.Shape, r metering.Reading, final bool) (bool, error) {
	tx, err := s.db.beginScoped(ctx, "meter:"+id)
	if err != nil {
		return false, fmt.Errorf("settling the meter of %s: %w", id, err)
	}
	defer tx.Rollback()
	var c metering.Reading
	var at int64
	err = tx.QueryRowContext(ctx, `SELECT vm, at_ms, cpu_ns, guest_cpu_ns, egress_bytes, ingress_bytes FROM meters WHERE sandbox_id = ?`, id).
		Scan(&c.VM, &at, &c.CPUNs, &c.GuestCPUNs, &c.EgressBytes, &c.IngressBytes)
	if errors.Is(err, sql.ErrNoRows) || (err == nil && c.VM != r.VM) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("settling the meter of %s: %w", id, err)
	}
	c.At = time.UnixMilli(at)
	if !r.At.After(c.At) {
		// Read before the interval's last settle (a sample racing the
		// final one): nothing to add, and the newer cursor stays.
		if final {
			_, err = tx.ExecContext(ctx, `DELETE FROM meters WHERE sandbox_id = ?`, id)
			if err == nil {
				err = tx.Commit()
			}
			return false, err
		}
		return false, nil
	}
	buckets := metering.Delta(c, r, shape)
	for _, b := range buckets {
		if err := s.addUsage(ctx, tx, id, metering.KindSandbox, owner, r.At, b); err != nil {
			return false, fmt.Errorf("settling the meter of %s: %w", id, err)
		}
	}
	if len(buckets) > 0 {
		var cpu, guest int64
		for _, b := range buckets {
			cpu += b.CPUNs
			guest += b.GuestCPUNs
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO meter_points (sandbox_id, at_ms, span_ms, cpu_ns, guest_cpu_ns, rss_bytes)
			VALUES (?, ?, ?, ?, ?, ?)
			ON CONFLICT (sandbox_id, at_ms) DO UPDATE SET span_ms = excluded.span_ms, cpu_ns = excluded.cpu_ns,
				guest_cpu_ns = excluded.guest_cpu_ns, rss_bytes = excluded.rss_bytes`, id, r.At.UnixMilli(), r.At.Sub(c.At).Milliseconds(), cpu, guest, r.RSSBytes); err != nil {
			return false, fmt.Errorf("settling the meter of %s: %w", id, err)
		}
	}
	if final {
		_, err = tx.ExecContext(ctx, `DELETE FROM meters WHERE sandbox_id = ?`, id)
	} else {
		_, err = tx.ExecContext(ctx, `UPDATE meters SET at_ms = ?, cpu_ns = ?, guest_cpu_ns = ?, egress_bytes = ?, ingress_bytes = ? WHERE sandbox_id = ?`,
			r.At.UnixMilli(), max(r.CPUNs, c.CPUNs), r.GuestCPUNs, r.EgressBytes, r.IngressBytes, id)
	}
	if err != nil {
		return false, fmt.Errorf("settling the meter of %s: %w", id, err)
	}
	if err := tx.Commit(); err != nil {
		return false, fmt.Errorf("settling the meter of %s: %w", id, err)
	}
	return true, nil
}

// OpenMeter returns the start of sandbox id's open metering interval, or
// nil if none is open.
func (s *meterRows) OpenMeter(ctx context.Context, id string) (*metering.Reading, error) {
	var r metering.Reading
	var at int64
	err := s.db.QueryRowContext(ctx, `SELECT vm, at_ms, cpu_ns, guest_cpu_ns, egress_bytes, ingress_bytes FROM meters WHERE sandbox_id = ?`, id).
		Scan(&r.VM, &at, &r.CPUNs, &r.GuestCPUNs, &r.EgressBytes, &r.IngressBytes)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading the meter of %s: %w", id, err)
	}
	r.At = time.UnixMilli(at)
	return &r, nil
}

// DropMeter closes sandbox id's open interval without charging it: its VM
// ended while no server watched, and its last counters are gone.
func (s *meterRows) DropMeter(ctx context.Context, id string) error {
	if _, err := s.db.execScoped(ctx, []string{"meter:" + id}, `DELETE FROM meters WHERE sandbox_id = ?`, id); err != nil {
		return fmt.Errorf("dropping the meter of %s: %w", id, err)
	}
	return nil
}

// OldestOpenMeter returns the start of the oldest open interval: usage
// from before it can no longer change.
func (s *meterRows) OldestOpenMeter(ctx context.Context) (time.Time, bool, error) {
	var at sql.NullInt64
	if err := s.db.QueryRowContext(ctx, `SELECT MIN(at_ms) FROM meters`).Scan(&at); err != nil {
		return time.Time{}, false, fmt.Errorf("reading the meters: %w", err)
	}
	if !at.Valid {
		return time.Time{}, false, nil
	}
	return time.UnixMilli(at.Int64).UTC(), true, nil
}

// AccrueStorage charges bytes of kept disk (a paused or stopped sandbox's,
// or a snapshot's) from the later of since and the last accrual of
// resource id until now, and records now as that accrual, in one step.
func (s *meterRows) AccrueStorage(ctx context.Context, id, kind, owner string, bytes int64, since, now time.Time) error {
	tx, err := s.db.beginScoped(ctx, "storage:"+id)
	if err != nil {
		return fmt.Errorf("charging the storage of %s: %w", id, err)
	}
	defer tx.Rollback()
	var at int64
	switch err := tx.QueryRowContext(ctx, `SELECT at_ms FROM storage_meters WHERE resource_id = ?`, id).Scan(&at); {
	case err == nil:
		if t := time.UnixMilli(at); t.After(since) {
			since = t
		}
	case !errors.Is(err, sql.ErrNoRows):
		return fmt.Errorf("charging the storage of %s: %w", id, err)
	}
	if !now.After(since) {
		return nil
	}
	for _, b := range metering.Storage(bytes, since, now) {
		if err := s.addUsage(ctx, tx, id, kind, owner, now, b); err != nil {
			return fmt.Errorf("charging the storage of %s: %w", id, err)
		}
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO storage_meters (resource_id, at_ms) VALUES (?, ?)
		ON CONFLICT (resource_id) DO UPDATE SET at_ms = excluded.at_ms`, id, now.UnixMilli()); err != nil {
		return fmt.Errorf("charging the storage of %s: %w", id, err)
	}
	return tx.Commit()
}

// addUsage adds b to resource id's row of b's hour.
func (s *meterRows) addUsage(ctx context.Context, tx *txHandle, id, kind, owner string, at time.Time, b metering.Bucket) error {
	// The target's columns are qualified (u.): PostgreSQL finds a bare
	// name in the SET clause ambiguous with excluded's, and has no
	// two-argument max().
	_, err := tx.ExecContext(ctx, `INSERT INTO usage AS u (resource_id, kind, owner_key_id, hour, running_ms, vcpu_ms, memory_mib_ms, cpu_ns,
			guest_cpu_ns, egress_bytes, ingress_bytes, rss_max_bytes, runs, storage_byte_ms, settled_ms)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
		ON CONFLICT (resource_id, hour) DO UPDATE SET
			running_ms = u.running_ms + excluded.running_ms, vcpu_ms = u.vcpu_ms + excluded.vcpu_ms,
			memory_mib_ms = u.memory_mib_ms + excluded.memory_mib_ms, cpu_ns = u.cpu_ns + excluded.cpu_ns,
			guest_cpu_ns = u.guest_cpu_ns + excluded.guest_cpu_ns, egress_bytes = u.egress_bytes + excluded.egress_bytes,
			ingress_bytes = u.ingress_bytes + excluded.ingress_bytes,
			rss_max_bytes = CASE WHEN excluded.rss_max_bytes > u.rss_max_bytes THEN excluded.rss_max_bytes ELSE u.rss_max_bytes END,
			runs = u.runs + excluded.runs, storage_byte_ms = u.storage_byte_ms + excluded.storage_byte_ms,
			settled_ms = CASE WHEN excluded.settled_ms > u.settled_ms THEN excluded.settled_ms ELSE u.settled_ms END`,
		id, kind, owner, b.Hour.Unix(), b.RunningMs, b.VCPUMs, b.MemoryMiBMs, b.CPUNs, b.GuestCPUNs, b.EgressBytes, b.IngressBytes,
		b.RSSMaxBytes, b.Runs, b.StorageByteMs, at.UnixMilli())
	return err
}

// UsageRows lists usage rows, oldest hour first.
func (s *meterRows) UsageRows(ctx context.Context, q metering.Query) ([]metering.Row, error) {
	var out []metering.Row
	err := s.EachUsageRow(ctx, q, func(r metering.Row) error {
		out = append(out, r)
		return nil
	})
	return out, err
}

// EachUsageRow calls fn with each usage row q selects, oldest hour first,
// without holding them all: a month of a busy server's rows can be large.
// fn must not use the store; an error from it ends the listing.
func (s *meterRows) EachUsageRow(ctx context.Context, q metering.Query, fn func(metering.Row) error) error {
	var where []string
	var args []any
	if q.Owner != "" {
		where, args = append(where, "u.owner_key_id = ?"), append(args, q.Owner)
	}
	if len(q.ResourceIDs) > 0 {
		where = append(where, "u.resource_id IN (?"+strings.Repeat(", ?", len(q.ResourceIDs)-1)+")")
		for _, id := range q.ResourceIDs {
			args = append(args, id)
		}
	}
	if !q.From.IsZero() {
		where, args = append(where, "u.hour >= ?"), append(args, q.From.Unix())
	}
	if !q.To.IsZero() {
		where, args = append(where, "u.hour < ?"), append(args, q.To.Unix())
	}
	if !q.AfterHour.IsZero() {
		where, args = append(where, "(u.hour, u.resource_id) > (?, ?)"), append(args, q.AfterHour.Unix(), q.AfterID)
	}
	query := `SELECT u.resource_id, u.kind, u.owner_key_id, u.hour, u.running_ms, u.vcpu_ms, u.memory_mib_ms, u.cpu_ns, u.guest_cpu_ns,
			u.egress_bytes, u.ingress_bytes, u.rss_max_bytes, u.runs, u.storage_byte_ms, u.settled_ms,
			CASE WHEN coalesce(sb.state, sn.state) = 'deleted' THEN 1 ELSE 0 END
		FROM usage u
		LEFT JOIN sandboxes sb ON u.kind = 'sandbox' AND sb.id = u.resource_id
		LEFT JOIN snapshots sn ON u.kind = 'snapshot' AND sn.id = u.resource_id`
	if len(where) > 0 {
		query += " WHERE " + strings.Join(where, " AND ")
	}
	query += " ORDER BY u.hour, u.resource_id"
	if q.Limit > 0 {
		query += fmt.Sprintf(" LIMIT %d", q.Limit)
	}
	rows, err := s.db.QueryContext(ctx, query, args...)
	if err != nil {
		return fmt.Errorf("listing usage: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var r metering.Row
		var hour, settled int64
		if err := rows.Scan(&r.ResourceID, &r.Kind, &r.Owner, &hour, &r.RunningMs, &r.VCPUMs, &r.MemoryMiBMs, &r.CPUNs, &r.GuestCPUNs,
			&r.EgressBytes, &r.IngressBytes, &r.RSSMaxBytes, &r.Runs, &r.StorageByteMs, &settled, &r.Final); err != nil {
			return fmt.Errorf("listing usage: %w", err)
		}
		r.Hour, r.SettledAt = time.Unix(hour, 0).UTC(), time.UnixMilli(settled).UTC()
		if err := fn(r); err != nil {
			return err
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("listing usage: %w", err)
	}
	return nil
}

// MeterPoints lists sandbox id's settled intervals that end in [from, to),
// oldest first.
func (s *meterRows) MeterPoints(ctx context.Context, id string, from, to time.Time) ([]metering.Point, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT at_ms, span_ms, cpu_ns, guest_cpu_ns, rss_bytes FROM meter_points
		WHERE sandbox_id = ? AND at_ms >= ? AND at_ms < ? ORDER BY at_ms`, id, from.UnixMilli(), to.UnixMilli())
	if err != nil {
		return nil, fmt.Errorf("reading the metrics of %s: %w", id, err)
	}
	defer rows.Close()
	var out []metering.Point
	for rows.Next() {
		var p metering.Point
		var at, span int64
		if err := rows.Scan(&at, &span, &p.CPUNs, &p.GuestCPUNs, &p.RSSBytes); err != nil {
			return nil, fmt.Errorf("reading the metrics of %s: %w", id, err)
		}
		p.At, p.Span = time.UnixMilli(at).UTC(), time.Duration(span)*time.Millisecond
		out = append(out, p)
	}
	return out, rows.Err()
}

// PruneMeterPoints removes settled intervals that ended before t; the
// hourly usage rows keep what they added up to.
func (s *meterRows) PruneMeterPoints(ctx context.Context, t time.Time) (int64, error) {
	res, err := s.db.ExecContext(ctx, `DELETE FROM meter_points WHERE at_ms < ?`, t.UnixMilli())
	if err != nil {
		return 0, fmt.Errorf("pruning metrics: %w", err)
	}
	return res.RowsAffected()
}

// CountSandboxes counts the sandboxes in each state.
func (s *meterRows) CountSandboxes(ctx context.Context) (map[string]int, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT state, COUNT(*) FROM sandboxes GROUP BY state`)
	if err != nil {
		return nil, fmt.Errorf("counting sandboxes: %w", err)
	}
	defer rows.Close()
	out := map[string]int{}
	for rows.Next() {
		var st string
		var n int
		if err := rows.Scan(&st, &n); err != nil {
			return nil, fmt.Errorf("counting sandboxes: %w", err)
		}
		out[st] = n
	}
	return out, rows.Err()
}
