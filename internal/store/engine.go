package store

import (
	"context"
	"database/sql"
	"fmt"
	"hash/fnv"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"
)

// engine is the database behind a Store.
type engine int

const (
	sqliteEngine engine = iota
	postgresEngine
)

func (e engine) String() string {
	if e == postgresEngine {
		return "postgres"
	}
	return "sqlite"
}

// writeLockKey names the PostgreSQL advisory lock every write transaction
// holds ("emberbox" in ASCII): the one writer at a time SQLite's IMMEDIATE
// transactions give, across every node that shares the database.
const writeLockKey int64 = 0x656d626572626f78

// dbHandle is the store's *sql.DB seen through its engine: queries are
// written once, for SQLite, with ? placeholders, and rebound for
// PostgreSQL. The methods mirror *sql.DB's, so that call sites read the
// same on either engine.
type dbHandle struct {
	*sql.DB
	engine engine
}

// txHandle is a transaction of a dbHandle.
type txHandle struct {
	*sql.Tx
	engine engine
}

// BeginTx starts a transaction. On SQLite it is IMMEDIATE (the DSN's
// _txlock): it holds the database's write lock from the start. On
// PostgreSQL it takes the advisory write lock first, so it is just as
// atomic: nothing else writes between its reads and its writes. The cost
// is that writers on every node queue behind one another, as they do on
// SQLite; readers outside transactions never wait. A read-only
// transaction (opts.ReadOnly) takes no lock.
func (d *dbHandle) BeginTx(ctx context.Context, opts *sql.TxOptions) (*txHandle, error) {
	tx, err := d.DB.BeginTx(ctx, opts)
	if err != nil {
		return nil, err
	}
	if d.engine == postgresEngine && (opts == nil || !opts.ReadOnly) {
		if _, err := tx.ExecContext(ctx, "SELECT pg_advisory_xact_lock($1)", writeLockKey); err != nil {
			tx.Rollback()
			return nil, fmt.Errorf("taking the write lock: %w", err)
		}
	}
	return &txHandle{Tx: tx, engine: d.engine}, nil
}

// beginScoped starts a write transaction that reads and writes only what
// its scopes name (such as "sandbox:" and an id), so that on PostgreSQL
// writes of different things proceed in parallel, on every node: it
// takes the write lock shared, then an advisory lock of each scope, in
// one order (no deadlock between two of them). Everything else that
// writes those rows either takes the same scope or is an ordinary
// transaction (BeginTx, ExecContext), whose exclusive write lock waits
// for every scoped one and holds them all off; so a scoped transaction is
// as atomic as one under the whole lock, for the rows its scopes cover.
// Reads of other rows see what is committed (a node's fence, which only
// ordinary transactions change, cannot change under it). Scoped
// transactions that append to the feed commit their seqs in any order;
// its gap-free reader holds the whole lock (feed.go). On SQLite, with one
// writer per file, it is BeginTx.
func (d *dbHandle) beginScoped(ctx context.Context, scopes ...string) (*txHandle, error) {
	if d.engine != postgresEngine {
		return d.BeginTx(ctx, nil)
	}
	keys := make([]int64, 0, len(scopes))
	for _, s := range scopes {
		keys = append(keys, scopeKey(s))
	}
	slices.Sort(keys)
	keys = slices.Compact(keys)
	tx, err := d.DB.BeginTx(ctx, nil)
	if err != nil {
		return nil, err
	}
	if _, err := tx.ExecContext(ctx, "SELECT pg_advisory_xact_lock_shared($1)", writeLockKey); err != nil {
		tx.Rollback()
		return nil, fmt.Errorf("taking the write lock: %w", err)
	}
	for _, k := range keys {
		if _, err := tx.ExecContext(ctx, "SELECT pg_advisory_xact_lock($1)", k); err != nil {
			tx.Rollback()
			return nil, fmt.Errorf("taking a row lock: %w", err)
		}
	}
	return &txHandle{Tx: tx, engine: d.engine}, nil
}

// scopeKey maps a scope to an advisory lock key (FNV-1a). Two scopes
// that collide only wait for each other; the whole lock's key is far
// from any one scope's in practice, and a collision with it would cost a
// wait, not atomicity.
func scopeKey(scope string) int64 {
	h := fnv.New64a()
	h.Write([]byte(scope))
	return int64(h.Sum64())
}

// ExecContext runs a statement on its own. On PostgreSQL a write runs in
// a transaction that holds the write lock, so that it cannot land between
// the read and the write of a transaction (SQLite's lock covers single
// statements too). Statements that write and return rows (RETURNING) are
// run in an explicit transaction by their callers for the same reason.
func (d *dbHandle) ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error) {
	if d.engine != postgresEngine || !isWrite(query) {
		return d.DB.ExecContext(ctx, d.engine.rebind(query), d.engine.args(args)...)
	}
	tx, err := d.BeginTx(ctx, nil)
	if err != nil {
		return nil, err
	}
	return execCommit(ctx, tx, query, args...)
}

// execCommit runs one statement in tx and commits it.
func execCommit(ctx context.Context, tx *txHandle, query string, args ...any) (sql.Result, error) {
	defer tx.Rollback()
	res, err := tx.ExecContext(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	if err := tx.Commit(); err != nil {
		return nil, err
	}
	return res, nil
}

// execScoped runs a write statement on its own in a scoped transaction
// (beginScoped): for a statement that changes only what scopes name, so
// that it waits for no write of anything else. On SQLite it is
// ExecContext.
func (d *dbHandle) execScoped(ctx context.Context, scopes []string, query string, args ...any) (sql.Result, error) {
	if d.engine != postgresEngine {
		return d.ExecContext(ctx, query, args...)
	}
	tx, err := d.beginScoped(ctx, scopes...)
	if err != nil {
		return nil, err
	}
	return execCommit(ctx, tx, query, args...)
}

// execApart runs a single-row write that no transaction reads and then
// writes on (a node's heartbeat: whoever acts on it re-checks the row in
// its own conditional update). On PostgreSQL it takes no cluster write
// lock, so it never queues behind other nodes' writes, and its commit
// does not wait to be durable (a heartbeat lost to a database crash costs
// one beat). On SQLite it is ExecContext: one writer is the file's rule.
func (d *dbHandle) execApart(ctx context.Context, query string, args ...any) (sql.Result, error) {
	if d.engine != postgresEngine {
		return d.ExecContext(ctx, query, args...)
	}
	tx, err := d.DB.BeginTx(ctx, nil)
	if err != nil {
		return nil, err
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, "SET LOCAL synchronous_commit TO OFF"); err != nil {
		return nil, err
	}
	res, err := tx.ExecContext(ctx, d.engine.rebind(query), d.engine.args(args)...)
	if err != nil {
		return nil, err
	}
	if err := tx.Commit(); err != nil {
		return nil, err
	}
	return res, nil
}

// QueryContext runs a query outside any transaction.
func (d *dbHandle) QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error) {
	return d.DB.QueryContext(ctx, d.engine.rebind(query), d.engine.args(args)...)
}

// QueryRowContext runs a query that returns at most one row.
func (d *dbHandle) QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row {
	return d.DB.QueryRowContext(ctx, d.engine.rebind(query), d.engine.args(args)...)
}

// ExecContext runs a statement in the transaction.
func (t *txHandle) ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error) {
	return t.Tx.ExecContext(ctx, t.engine.rebind(query), t.engine.args(args)...)
}

// QueryContext runs a query in the transaction.
func (t *txHandle) QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error) {
	return t.Tx.QueryContext(ctx, t.engine.rebind(query), t.engine.args(args)...)
}

// QueryRowContext runs a query that returns at most one row in the
// transaction.
func (t *txHandle) QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row {
	return t.Tx.QueryRowContext(ctx, t.engine.rebind(query), t.engine.args(args)...)
}

// isWrite reports whether a statement changes data, by its first word.
func isWrite(query string) bool {
	q := strings.TrimSpace(query)
	word, _, _ := strings.Cut(q, " ")
	switch strings.ToUpper(strings.TrimSpace(word)) {
	case "INSERT", "UPDATE", "DELETE", "REPLACE", "WITH":
		return true
	}
	return false
}

// args converts query arguments for the engine. On PostgreSQL:
//   - The schema has no boolean columns (SQLite has none): flags are
//     INTEGER 0 or 1, which the SQLite driver writes for a Go bool but pgx
//     refuses to, so a bool becomes the integer.
//   - Text must be UTF-8 without NUL bytes, while guests and builds write
//     what they like (SQLite keeps it as given): each invalid byte and
//     each NUL becomes U+FFFD, so such text is stored, and looking it up
//     finds nothing rather than fails.
func (e engine) args(args []any) []any {
	if e != postgresEngine {
		return args
	}
	var out []any
	set := func(i int, v any) {
		if out == nil {
			out = append([]any(nil), args...)
		}
		out[i] = v
	}
	for i, a := range args {
		switch a := a.(type) {
		case bool:
			set(i, map[bool]int64{false: 0, true: 1}[a])
		case string:
			if !utf8.ValidString(a) || strings.IndexByte(a, 0) >= 0 {
				set(i, strings.ReplaceAll(strings.ToValidUTF8(a, "\uFFFD"), "\x00", "\uFFFD"))
			}
		}
	}
	if out == nil {
		return args
	}
	return out
}

// rebind turns the ? and ?NNN placeholders of query into PostgreSQL's $n,
// numbering as SQLite does (a bare ? is one more than the largest number
// before it), and leaves string literals, quoted identifiers and comments
// alone. SQLite takes the query as it is.
func (e engine) rebind(query string) string {
	if e != postgresEngine || !strings.Contains(query, "?") {
		return query
	}
	var b strings.Builder
	b.Grow(len(query) + 16)
	n := 0
	for _, seg := range scanSQL(query) {
		if seg.kind != segCode {
			b.WriteString(seg.text)
			continue
		}
		s := seg.text
		for i := 0; i < len(s); i++ {
			if s[i] != '?' {
				b.WriteByte(s[i])
				continue
			}
			j := i + 1
			for j < len(s) && s[j] >= '0' && s[j] <= '9' {
				j++
			}
			if j > i+1 {
				k, _ := strconv.Atoi(s[i+1 : j])
				n = max(n, k)
				b.WriteString("$" + s[i+1:j])
				i = j - 1
				continue
			}
			n++
			b.WriteString("$" + strconv.Itoa(n))
		}
	}
	return b.String()
}

// segment is a piece of SQL text: code, or something whose text must not
// be rewritten.
type segment struct {
	kind segKind
	text string
}

type segKind int

const (
	segCode    segKind = iota
	segString          // '…'
	segIdent           // "…"
	segComment         // -- … or /* … */
)

// scanSQL splits SQL text into segments. Quotes are escaped by doubling,
// which scans as two adjacent quoted segments.
func scanSQL(q string) []segment {
	var out []segment
	start := 0
	flush := func(end int) {
		if end > start {
			out = append(out, segment{segCode, q[start:end]})
		}
	}
	for i := 0; i < len(q); {
		var kind segKind
		var end int
		switch {
		case q[i] == '\'' || q[i] == '"':
			kind = segString
			if q[i] == '"' {
				kind = segIdent
			}
			end = strings.IndexByte(q[i+1:], q[i])
			if end < 0 {
				end = len(q)
			} else {
				end += i + 2
			}
		case strings.HasPrefix(q[i:], "--"):
			kind = segComment
			end = strings.IndexByte(q[i:], '\n')
			if end < 0 {
				end = len(q)
			} else {
				end += i
			}
		case strings.HasPrefix(q[i:], "/*"):
			kind = segComment
			end = strings.Index(q[i+2:], "*/")
			if end < 0 {
				end = len(q)
			} else {
				end += i + 4
			}
		default:
			i++
			continue
		}
		flush(i)
		out = append(out, segment{kind, q[i:end]})
		i, start = end, end
	}
	flush(len(q))
	return out
}
