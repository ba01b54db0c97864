package store

import (
	"context"
	"database/sql"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/emberbox/emberbox/internal/errdefs"
	"github.com/emberbox/emberbox/internal/sandbox"
)

// sandboxRows are the store's methods on the sandboxes table.
type sandboxRows struct{ *backend }

// Page sizes of ListSandboxes (sandbox.ListOptions.Limit).
const (
	DefaultListLimit = 50
	MaxListLimit     = 100
)

const sandboxColumns = `id, owner_key_id, name, labels, env_names, vcpu, memory_mib, disk_mib,
	timeout_seconds, on_lease_end, state, stop_reason, accel, driver,
	created_at, ready_at, expires_at, ended_at, deleted_at, vm,
	paused_at, auto_wake, idle_pause_seconds, persistent, snapshot_id, disk_removed_at,
	image_id, rootfs, node_id`

// InsertSandbox records a new sandbox. If sb.CreatedAt is zero it is set to
// the current time. A non-empty idempotencyKey names the pending
// Idempotency-Key record (of sb.OwnerKeyID) of the request that creates it:
// the sandbox's id is stored with that key in the same transaction, so a
// retry after a crash finds this sandbox and never makes a second one.
// The entries are appended to its trail in the same transaction (as
// UpdateSandbox's). A non-empty name already held by another sandbox of
// the same owner that is not stopped or deleted fails with an
// *errdefs.CodedError of class errdefs.ErrConflict and code "name_taken".
func (s *sandboxRows) InsertSandbox(ctx context.Context, sb *sandbox.Sandbox, idempotencyKey string, entries ...*sandbox.TrailEntry) error {
	if sb.ID == "" {
		return errdefs.New(errdefs.ErrInvalidArgument, "invalid_sandbox", "inserting sandbox: empty id")
	}
	if sb.CreatedAt.IsZero() {
		sb.CreatedAt = s.now()
	}
	if n := s.node.Load(); n != nil {
		sb.NodeID = n.id
	}
	labels, err := jsonOrNull(sb.Labels, sb.Labels == nil)
	if err != nil {
		return fmt.Errorf("inserting sandbox %s: encoding labels: %w", sb.ID, err)
	}
	envNames, err := jsonOrNull(sb.EnvNames, sb.EnvNames == nil)
	if err != nil {
		return fmt.Errorf("inserting sandbox %s: encoding env names: %w", sb.ID, err)
	}
	// Scoped to the new row (the name's uniqueness is the index's) and to
	// the key's idempotency records, one of which it links.
	scopes := []string{sandboxScope(sb.ID)}
	if idempotencyKey != "" {
		scopes = append(scopes, idempotencyScope(sb.OwnerKeyID))
	}
	tx, err := s.db.beginScoped(ctx, scopes...)
	if err != nil {
		return fmt.Errorf("inserting sandbox %s: %w", sb.ID, err)
	}
	defer tx.Rollback()
	if err := s.checkFence(ctx, tx); err != nil {
		return fmt.Errorf("inserting sandbox %s: %w", sb.ID, err)
	}
	// The partial unique index sandboxes_live_name makes the name check and
	// the insert one atomic step.
	_, err = tx.ExecContext(ctx, `INSERT INTO sandboxes (`+sandboxColumns+`)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
		sb.ID, sb.OwnerKeyID, sb.Name, labels, envNames, sb.VCPU, sb.MemoryMiB, sb.DiskMiB,
		sb.TimeoutSeconds, sb.OnLeaseEnd, string(sb.State), sb.StopReason, sb.Accel, sb.Driver,
		formatTime(sb.CreatedAt), formatTimePtr(sb.ReadyAt), formatTimePtr(sb.ExpiresAt),
		formatTimePtr(sb.EndedAt), formatTimePtr(sb.DeletedAt), sb.VM,
		formatTimePtr(sb.PausedAt), sb.AutoWake, sb.IdlePauseSeconds, sb.Persistent, sb.SnapshotID,
		formatTimePtr(sb.DiskRemovedAt), sb.ImageID, sb.Rootfs, sb.NodeID)
	switch {
	case isUniqueViolation(err):
		return fmt.Errorf("inserting sandbox %s: %w", sb.ID, nameTaken(sb.Name))
	case isPrimaryKeyViolation(err):
		return fmt.Errorf("inserting sandbox %s: id in use: %w", sb.ID, errdefs.ErrConflict)
	case err != nil:
		return fmt.Errorf("inserting sandbox %s: %w", sb.ID, err)
	}
	if idempotencyKey != "" {
		if _, err := tx.ExecContext(ctx, `UPDATE idempotency SET sandbox_id = ?
			WHERE key_id = ? AND key = ? AND status = 0`, sb.ID, sb.OwnerKeyID, idempotencyKey); err != nil {
			return fmt.Errorf("inserting sandbox %s: linking its idempotency key: %w", sb.ID, err)
		}
	}
	if len(entries) > 0 {
		if err := appendEntries(ctx, tx, sb.ID, entries, formatTime(s.now())); err != nil {
			return fmt.Errorf("inserting sandbox %s: %w", sb.ID, err)
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("inserting sandbox %s: %w", sb.ID, err)
	}
	return nil
}

// sandboxScope is the lock scope (engine.go's beginScoped) of sandbox
// id's rows: its record, events and egress policy. sandboxTable's updates
// take it too.
func sandboxScope(id string) string { return sandboxTable.noun + ":" + id }

func nameTaken(name string) error {
	return errdefs.New(errdefs.ErrConflict, "name_taken",
		"a sandbox named %q already exists and is not stopped", name).
		WithHint("stop or delete that sandbox, or choose another name")
}

func sandboxNotFound(id string) error {
	return errdefs.New(errdefs.ErrNotFound, "sandbox_not_found", "sandbox %s not found", id)
}

// GetSandbox returns the sandbox with the given id, of any owner and in any
// state. A missing sandbox is an error of class errdefs.ErrNotFound.
func (s *sandboxRows) GetSandbox(ctx context.Context, id string) (*sandbox.Sandbox, error) {
	return sandboxTable.get(ctx, s.db, "getting", id)
}

// sandboxTable reads sandboxes by id.
// Its updates lock the one row (sandboxScope, which is the table's noun
// and the id), so transitions of different sandboxes, on different nodes,
// commit in parallel.
var sandboxTable = newTable("sandbox", "sandboxes", sandboxColumns, scanSandbox, sandboxNotFound).lockingRows()

// UpdateSandbox changes the record of sandbox id in one transaction: it
// reads the committed record, lets fn change it, and writes the mutable
// fields (everything but ID, OwnerKeyID, VCPU, MemoryMiB, DiskMiB,
// CreatedAt and SnapshotID; ImageID and Rootfs change by a switch of
// image) back, so that no other change can come between the read
// and the write. If fn returns false nothing is written. It returns the
// record as it is afterwards. A missing sandbox is an error of class
// errdefs.ErrNotFound; a name clash as in InsertSandbox fails with code
// "name_taken". fn runs with the database's write lock held: it must not
// block.
//
// When the record is written, each of entries is appended to the
// sandbox's trail (and the feed, as AppendEvent does) in the same
// transaction: the change and the events that report it commit together.
// The entries are read after fn returns, so fn may fill them in.
func (s *sandboxRows) UpdateSandbox(ctx context.Context, id string, fn func(sb *sandbox.Sandbox) bool, entries ...*sandbox.TrailEntry) (*sandbox.Sandbox, error) {
	return sandboxTable.update(ctx, s.db, id,
		func(tx *txHandle, sb *sandbox.Sandbox) error { return s.checkOwner(ctx, tx, sb.NodeID) },
		fn,
		func(tx *txHandle, sb *sandbox.Sandbox) error {
			sb.ID = id
			if err := updateSandbox(ctx, tx, sb); err != nil {
				return err
			}
			return appendEntries(ctx, tx, id, entries, formatTime(s.now()))
		})
}

// execer is a *sql.DB or a *sql.Tx.
type execer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
}

// updateSandbox writes the mutable fields of sb to its record.
func updateSandbox(ctx context.Context, db execer, sb *sandbox.Sandbox) error {
	labels, err := jsonOrNull(sb.Labels, sb.Labels == nil)
	if err != nil {
		return fmt.Errorf("updating sandbox %s: encoding labels: %w", sb.ID, err)
	}
	envNames, err := jsonOrNull(sb.EnvNames, sb.EnvNames == nil)
	if err != nil {
		return fmt.Errorf("updating sandbox %s: encoding env names: %w", sb.ID, err)
	}
	res, err := db.ExecContext(ctx, `UPDATE sandboxes SET
		name = ?, labels = ?, env_names = ?, timeout_seconds = ?, on_lease_end = ?, state = ?,
		stop_reason = ?, accel = ?, driver = ?, ready_at = ?, expires_at = ?,
		ended_at = ?, deleted_at = ?, vm = ?,
		paused_at = ?, auto_wake = ?, idle_pause_seconds = ?, persistent = ?,
		image_id = ?, rootfs = ?
		WHERE id = ?`,
		sb.Name, labels, envNames, sb.TimeoutSeconds, sb.OnLeaseEnd, string(sb.State),
		sb.StopReason, sb.Accel, sb.Driver, formatTimePtr(sb.ReadyAt), formatTimePtr(sb.ExpiresAt),
		formatTimePtr(sb.EndedAt), formatTimePtr(sb.DeletedAt), sb.VM,
		formatTimePtr(sb.PausedAt), sb.AutoWake, sb.IdlePauseSeconds, sb.Persistent,
		sb.ImageID, sb.Rootfs,
		sb.ID)
	if isUniqueViolation(err) {
		return fmt.Errorf("updating sandbox %s: %w", sb.ID, nameTaken(sb.Name))
	}
	if err != nil {
		return fmt.Errorf("updating sandbox %s: %w", sb.ID, err)
	}
	if n, err := res.RowsAffected(); err != nil {
		return fmt.Errorf("updating sandbox %s: %w", sb.ID, err)
	} else if n == 0 {
		return fmt.Errorf("updating sandbox: %w", sandboxNotFound(sb.ID))
	}
	return nil
}

// ListSandboxes returns one page of sandboxes matching opts, newest first,
// and the cursor of the next page ("" on the last page). Without opts.States,
// stopped sandboxes are left out unless opts.IncludeStopped is set, and
// deleted ones are always left out.
func (s *sandboxRows) ListSandboxes(ctx context.Context, opts sandbox.ListOptions) ([]*sandbox.Sandbox, string, error) {
	limit, err := pageLimit(opts.Limit)
	if err != nil {
		return nil, "", err
	}

	var (
		where []string
		args  []any
	)
	if opts.OwnerKeyID != "" {
		where = append(where, "owner_key_id = ?")
		args = append(args, opts.OwnerKeyID)
	}
	switch {
	case len(opts.States) > 0:
		where = append(where, "state IN (?"+strings.Repeat(", ?", len(opts.States)-1)+")")
		for _, st := range opts.States {
			args = append(args, string(st))
		}
	case opts.IncludeStopped:
		where = append(where, "state <> 'deleted'")
	default:
		where = append(where, "state NOT IN ('stopped', 'deleted')")
	}
	if opts.Name != "" {
		where = append(where, "name = ?")
		args = append(args, opts.Name)
	}
	if n := s.node.Load(); n != nil && opts.Local {
		where = append(where, "node_id = ?")
		args = append(args, n.id)
	}
	// Labels are matched in SQL so that LIMIT and the cursor see exactly the
	// matching rows. Sorted for a stable statement text.
	for _, k := range slices.Sorted(maps.Keys(opts.Labels)) {
		cond, condArgs, err := s.labelMatch(k, opts.Labels[k])
		if err != nil {
			return nil, "", fmt.Errorf("listing sandboxes: %w", err)
		}
		where, args = append(where, cond), append(args, condArgs...)
	}
	if opts.Cursor != "" {
		created, id, err := decodeCursor(opts.Cursor)
		if err != nil {
			return nil, "", err
		}
		where = append(where, "(created_at < ? OR (created_at = ? AND id < ?))")
		args = append(args, created, created, id)
	}
	query := `SELECT ` + sandboxColumns + ` FROM sandboxes WHERE ` + strings.Join(where, " AND ") +
		` ORDER BY created_at DESC, id DESC LIMIT ?`
	// One extra row tells whether there is a next page.
	args = append(args, limit+1)

	list, err := queryRows(ctx, s.db, scanSandbox, query, args...)
	if err != nil {
		return nil, "", fmt.Errorf("listing sandboxes: %w", err)
	}
	list, next := cutPage(list, limit, func(sb *sandbox.Sandbox) string { return encodeCursor(formatTime(sb.CreatedAt), sb.ID) })
	return list, next, nil
}

// labelMatch is the condition that a sandbox's labels (a JSON object of
// strings) hold key k with value v, and its arguments.
func (s *sandboxRows) labelMatch(k, v string) (string, []any, error) {
	if s.db.engine != postgresEngine {
		return "EXISTS (SELECT 1 FROM json_each(sandboxes.labels) AS l WHERE l.key = ? AND l.value = ?)", []any{k, v}, nil
	}
	// PostgreSQL's jsonb refuses a label holding \u0000, and one such row
	// would fail every listing that parses it. The labels are
	// json.Marshal's text, so the pair is found as text instead: "k":"v"
	// encoded the same way, between the delimiters a member has ({ or ,
	// before, , or } after). Within a JSON string every " is escaped, so
	// {" and ," only ever start a member.
	kb, err := json.Marshal(k)
	if err != nil {
		return "", nil, err
	}
	vb, err := json.Marshal(v)
	if err != nil {
		return "", nil, err
	}
	pair := string(kb) + ":" + string(vb)
	var args []any
	for _, pre := range []string{"{", ","} {
		for _, post := range []string{",", "}"} {
			args = append(args, pre+pair+post)
		}
	}
	return "(strpos(sandboxes.labels, ?) > 0 OR strpos(sandboxes.labels, ?) > 0 OR " +
		"strpos(sandboxes.labels, ?) > 0 OR strpos(sandboxes.labels, ?) > 0)", args, nil
}

// ListLive returns every sandbox not in a terminal state, oldest first, of
// all owners: the ones to reattach after a restart and to watch the leases of.
// On a node of a cluster (SetNode) it returns that node's alone.
func (s *sandboxRows) ListLive(ctx context.Context) ([]*sandbox.Sandbox, error) {
	cond, args := s.localOnly()
	list, err := queryRows(ctx, s.db, scanSandbox, `SELECT `+sandboxColumns+` FROM sandboxes
		WHERE state NOT IN ('stopped', 'deleted')`+cond+` ORDER BY created_at, id`, args...)
	if err != nil {
		return nil, fmt.Errorf("listing live sandboxes: %w", err)
	}
	return list, nil
}

func scanSandbox(row interface{ Scan(...any) error }) (*sandbox.Sandbox, error) {
	var (
		sb                             sandbox.Sandbox
		state, created                 string
		labels, envNames               sql.NullString
		ready, expires, ended, deleted sql.NullString
		paused, diskRemoved            sql.NullString
	)
	err := row.Scan(&sb.ID, &sb.OwnerKeyID, &sb.Name, &labels, &envNames, &sb.VCPU, &sb.MemoryMiB, &sb.DiskMiB,
		&sb.TimeoutSeconds, &sb.OnLeaseEnd, &state, &sb.StopReason, &sb.Accel, &sb.Driver,
		&created, &ready, &expires, &ended, &deleted, &sb.VM,
		&paused, &sb.AutoWake, &sb.IdlePauseSeconds, &sb.Persistent, &sb.SnapshotID, &diskRemoved,
		&sb.ImageID, &sb.Rootfs, &sb.NodeID)
	if err != nil {
		return nil, err
	}
	sb.State = sandbox.State(state)
	if err := unmarshalNullable(labels, &sb.Labels); err != nil {
		return nil, fmt.Errorf("sandbox %s: decoding labels: %w", sb.ID, err)
	}
	if err := unmarshalNullable(envNames, &sb.EnvNames); err != nil {
		return nil, fmt.Errorf("sandbox %s: decoding env names: %w", sb.ID, err)
	}
	if sb.CreatedAt, err = parseTime(created); err != nil {
		return nil, fmt.Errorf("sandbox %s: %w", sb.ID, err)
	}
	for _, f := range []struct {
		dst **time.Time
		src sql.NullString
	}{{&sb.ReadyAt, ready}, {&sb.ExpiresAt, expires}, {&sb.EndedAt, ended}, {&sb.DeletedAt, deleted}, {&sb.PausedAt, paused}, {&sb.DiskRemovedAt, diskRemoved}} {
		if *f.dst, err = parseTimePtr(f.src); err != nil {
			return nil, fmt.Errorf("sandbox %s: %w", sb.ID, err)
		}
	}
	return &sb, nil
}

// The cursor is the position of the last row of a page: its creation time
// and id, base64url-encoded so that callers treat it as opaque.
func encodeCursor(created, id string) string {
	return base64.RawURLEncoding.EncodeToString([]byte(created + " " + id))
}

func decodeCursor(c string) (created, id string, err error) {
	b, err := base64.RawURLEncoding.DecodeString(c)
	if err == nil {
		var ok bool
		created, id, ok = strings.Cut(string(b), " ")
		if ok && id != "" {
			if _, err = parseTime(created); err == nil {
				return created, id, nil
			}
		}
	}
	return "", "", errdefs.New(errdefs.ErrInvalidArgument, "invalid_cursor", "invalid cursor")
}
