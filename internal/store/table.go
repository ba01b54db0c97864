package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"

	"github.com/emberbox/emberbox/internal/errdefs"
)

// rowScanner is a *sql.Row or *sql.Rows: what a table's scan function
// reads one record from.
type rowScanner = interface {
	Scan(dest ...any) error
}

// table says how the records of one table are read by id, so that the
// read, the not-found mapping and the read-modify-write transaction are
// written once for every table.
type table[T any] struct {
	noun     string // how errors name a record: "sandbox"
	byID     string // SELECT <columns> FROM <table> WHERE id = ?
	scan     func(rowScanner) (T, error)
	notFound func(id string) error
	// rowLocked: update writes only the record itself, so its
	// transaction is scoped to it (beginScoped) rather than holding the
	// whole write lock.
	rowLocked bool
}

// newTable describes the table name, whose columns scan reads into one
// record and whose missing records are notFound; noun names a record in
// errors.
func newTable[T any](noun, name, columns string, scan func(rowScanner) (T, error), notFound func(id string) error) *table[T] {
	return &table[T]{noun: noun, byID: `SELECT ` + columns + ` FROM ` + name + ` WHERE id = ?`, scan: scan, notFound: notFound}
}

// lockingRows returns t with update scoped to the one record it changes
// (see rowLocked); every other writer of the table must be an ordinary
// transaction or take the same scope.
func (t *table[T]) lockingRows() *table[T] {
	u := *t
	u.rowLocked = true
	return &u
}

// begin starts update's transaction on record id.
func (t *table[T]) begin(ctx context.Context, db *dbHandle, id string) (*txHandle, error) {
	if t.rowLocked {
		return db.beginScoped(ctx, t.noun+":"+id)
	}
	return db.BeginTx(ctx, nil) // IMMEDIATE: the write lock is taken before the read
}

// get reads record id on q (the store's handle or one of its
// transactions) for doing ("getting", "updating"): a missing record is
// "<doing> <noun>: <notFound>", another failure "<doing> <noun> <id>: <err>".
func (t *table[T]) get(ctx context.Context, q queryer, doing, id string) (T, error) {
	v, err := t.scan(q.QueryRowContext(ctx, t.byID, id))
	if errors.Is(err, sql.ErrNoRows) {
		var zero T
		return zero, fmt.Errorf("%s %s: %w", doing, t.noun, t.notFound(id))
	}
	if err != nil {
		var zero T
		return zero, fmt.Errorf("%s %s %s: %w", doing, t.noun, id, err)
	}
	return v, nil
}

// read reads record id on q: a missing record is notFound itself,
// another failure "reading <noun> <id>: <err>".
func (t *table[T]) read(ctx context.Context, q queryer, id string) (T, error) {
	v, err := t.scan(q.QueryRowContext(ctx, t.byID, id))
	if errors.Is(err, sql.ErrNoRows) {
		var zero T
		return zero, t.notFound(id)
	}
	if err != nil {
		var zero T
		return zero, fmt.Errorf("reading %s %s: %w", t.noun, id, err)
	}
	return v, nil
}

// update changes record id in one write transaction (scoped to the
// record if t is rowLocked): it reads the committed record, lets vet refuse it (nil: no vetting) and fn change
// it, and unless fn returns false writes it back with write and commits,
// so that no other change can come between the read and the write. fn
// runs with the write lock held: it must not block. It returns the record
// as it is afterwards. write's errors are returned as they are; the
// others are "updating <noun> <id>: <err>" (see get for a missing one).
func (t *table[T]) update(ctx context.Context, db *dbHandle, id string,
	vet func(tx *txHandle, v T) error, fn func(v T) bool, write func(tx *txHandle, v T) error) (T, error) {
	var zero T
	tx, err := t.begin(ctx, db, id)
	if err != nil {
		return zero, fmt.Errorf("updating %s %s: %w", t.noun, id, err)
	}
	defer tx.Rollback()
	v, err := t.get(ctx, tx, "updating", id)
	if err != nil {
		return zero, err
	}
	if vet != nil {
		if err := vet(tx, v); err != nil {
			return zero, fmt.Errorf("updating %s %s: %w", t.noun, id, err)
		}
	}
	if !fn(v) {
		return v, nil
	}
	if err := write(tx, v); err != nil {
		return zero, err
	}
	if err := tx.Commit(); err != nil {
		return zero, fmt.Errorf("updating %s %s: %w", t.noun, id, err)
	}
	return v, nil
}

// queryRows runs query on q (the store's handle or one of its
// transactions) and reads every row it returns with scan.
func queryRows[T any](ctx context.Context, q querier, scan func(rowScanner) (T, error), query string, args ...any) ([]T, error) {
	rows, err := q.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	return scanRows(rows, scan)
}

// scanRows reads every row of rows with scan and closes rows; no rows is
// a nil slice.
func scanRows[T any](rows *sql.Rows, scan func(rowScanner) (T, error)) ([]T, error) {
	defer rows.Close()
	var out []T
	for rows.Next() {
		v, err := scan(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	return out, nil
}

// scanString reads a row of one text column, such as an id.
func scanString(row rowScanner) (string, error) {
	var s string
	err := row.Scan(&s)
	return s, err
}

// pageLimit is the size of a page of sandboxes or snapshots asked for
// with limit: DefaultListLimit for 0, at most MaxListLimit.
func pageLimit(limit int) (int, error) {
	switch {
	case limit == 0:
		return DefaultListLimit, nil
	case limit < 0 || limit > MaxListLimit:
		return 0, errdefs.New(errdefs.ErrInvalidArgument, "invalid_limit", "limit must be between 1 and %d", MaxListLimit)
	}
	return limit, nil
}

// ownerPage selects a page of one owner's records by id, newest first:
// where and args (the last one the LIMIT, one more than the page holds, to
// tell whether another page follows), and the page's size.
type ownerPage struct {
	where string
	args  []any
	limit int
}

// newOwnerPage selects owner's records in state (any but deleted for ""),
// with column = value when value is set, before cursor when it is set, at
// most limit of them (50 unless limit is 1 to 100).
func newOwnerPage(owner, state, column, value, cursor string, limit int) ownerPage {
	where, args := []string{"owner_key_id = ?"}, []any{owner}
	if state != "" {
		where, args = append(where, "state = ?"), append(args, state)
	} else {
		where = append(where, "state != 'deleted'")
	}
	if value != "" {
		where, args = append(where, column+" = ?"), append(args, value)
	}
	if cursor != "" {
		where, args = append(where, "id < ?"), append(args, cursor)
	}
	if limit <= 0 || limit > 100 {
		limit = 50
	}
	return ownerPage{where: strings.Join(where, " AND "), args: append(args, limit+1), limit: limit}
}

// cutPage cuts the one record read past a page of limit off out and
// returns the cursor of the next page, made by cursor from the page's
// last record, or "" if out was the last page.
func cutPage[T any](out []T, limit int, cursor func(T) string) ([]T, string) {
	if len(out) <= limit {
		return out, ""
	}
	out = out[:limit]
	return out, cursor(out[limit-1])
}
