package store

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/emberbox/emberbox/internal/errdefs"
	"github.com/emberbox/emberbox/internal/sandbox"
	"github.com/emberbox/emberbox/internal/webhook"
)

// openTest opens a fresh store on the engine under test and returns its
// DSN, for a test to open again.
func openTest(t *testing.T) (*Store, string) {
	t.Helper()
	path := newDSN(t)
	s, err := Open(t.Context(), path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s, path
}

// base is a fixed instant with sub-millisecond digits, to catch truncation.
var base = time.Date(2025, 3, 14, 15, 9, 26, 535897932, time.UTC)

func ptr[T any](v T) *T { return &v }

func newSandbox(id, owner string, created time.Time) *sandbox.Sandbox {
	return &sandbox.Sandbox{
		ID:             id,
		OwnerKeyID:     owner,
		VCPU:           sandbox.DefaultVCPU,
		MemoryMiB:      sandbox.DefaultMemoryMiB,
		DiskMiB:        sandbox.DefaultDiskMiB,
		TimeoutSeconds: sandbox.DefaultTimeoutSeconds,
		OnLeaseEnd:     sandbox.LeaseEndStop,
		State:          sandbox.StateRunning,
		CreatedAt:      created,
	}
}

func mustInsert(t *testing.T, s *Store, sbs ...*sandbox.Sandbox) {
	t.Helper()
	for _, sb := range sbs {
		if err := s.InsertSandbox(t.Context(), sb, ""); err != nil {
			t.Fatal(err)
		}
	}
}

func TestOpenSettings(t *testing.T) {
	s, _ := openTest(t)
	ctx := t.Context()
	if got := s.Engine(); got != testEngine.String() {
		t.Errorf("Engine() = %q, want %q", got, testEngine)
	}
	if v, err := s.schemaVersion(ctx); err != nil || v != len(migrations) {
		t.Errorf("schema version %d, %v; want %d", v, err, len(migrations))
	}
	if s.Engine() == "postgres" {
		var lt string
		if err := s.db.QueryRowContext(ctx, "SHOW lock_timeout").Scan(&lt); err != nil || lt != "30s" {
			t.Errorf("lock_timeout = %q, %v; want 30s", lt, err)
		}
	}
	sqliteOnly(t, "pragmas")
	for _, tc := range []struct {
		pragma string
		want   string
	}{
		{"journal_mode", "wal"},
		{"foreign_keys", "1"},
		{"busy_timeout", "5000"},
		{"synchronous", "1"}, // NORMAL
		{"user_version", fmt.Sprint(len(migrations))},
	} {
		var got string
		if err := s.db.QueryRowContext(ctx, "PRAGMA "+tc.pragma).Scan(&got); err != nil {
			t.Fatal(err)
		}
		if got != tc.want {
			t.Errorf("PRAGMA %s = %q, want %q", tc.pragma, got, tc.want)
		}
	}
}

func TestOpenNewerSchema(t *testing.T) {
	path := newDSN(t)
	s, err := Open(t.Context(), path)
	if err != nil {
		t.Fatal(err)
	}
	bump := fmt.Sprintf("PRAGMA user_version = %d", len(migrations)+1)
	if s.db.engine == postgresEngine {
		bump = fmt.Sprintf("UPDATE schema_version SET version = %d", len(migrations)+1)
	}
	if _, err := s.db.Exec(bump); err != nil {
		t.Fatal(err)
	}
	s.Close()
	if s, err := Open(t.Context(), path); err == nil {
		s.Close()
		t.Fatal("Open of a newer schema succeeded")
	}
}

func TestOpenPathNeedsEscaping(t *testing.T) {
	sqliteOnly(t, "a file path")
	path := filepath.Join(t.TempDir(), "a dir?#%", "x.db")
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	s, err := Open(t.Context(), path)
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	if _, err := os.Stat(path); err != nil {
		t.Fatal(err)
	}
}

func TestSandboxRoundTrip(t *testing.T) {
	s, _ := openTest(t)
	ctx := t.Context()

	full := &sandbox.Sandbox{
		ID:             "sbx_full",
		OwnerKeyID:     "key_1",
		Name:           "web",
		Labels:         map[string]string{"team": "a", "weird key \"'.$": "v"},
		EnvNames:       []string{"A", "B"},
		VCPU:           4,
		MemoryMiB:      8192,
		DiskMiB:        10240,
		TimeoutSeconds: 600,
		OnLeaseEnd:     sandbox.LeaseEndDelete,
		State:          sandbox.StateStopped,
		StopReason:     sandbox.ReasonRequested,
		Accel:          "kvm",
		Driver:         "qemu",
		CreatedAt:      base,
		ReadyAt:        ptr(base.Add(time.Second)),
		ExpiresAt:      ptr(base.Add(10 * time.Minute).In(time.FixedZone("X", 3600))),
		EndedAt:        ptr(base.Add(time.Minute)),
		DeletedAt:      ptr(base.Add(2 * time.Minute)),
		VM:             []byte(`{"pid":123}`),
	}
	minimal := newSandbox("sbx_min", "key_1", base)
	empty := newSandbox("sbx_empty", "key_1", base)
	empty.Labels = map[string]string{}
	empty.EnvNames = []string{}

	for _, sb := range []*sandbox.Sandbox{full, minimal, empty} {
		t.Run(sb.ID, func(t *testing.T) {
			mustInsert(t, s, sb)
			got, err := s.GetSandbox(ctx, sb.ID)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(sb, got); diff != "" {
				t.Errorf("GetSandbox mismatch (-want +got):\n%s", diff)
			}
		})
	}

	// Update flips every mutable field, nil pointers to set and back.
	upd := *minimal
	upd.Name = "renamed"
	upd.Labels = map[string]string{"x": "y"}
	upd.TimeoutSeconds = 120
	upd.OnLeaseEnd = sandbox.LeaseEndDelete
	upd.State = sandbox.StateStopping
	upd.StopReason = sandbox.ReasonLeaseExpired
	upd.Accel = "tcg"
	upd.Driver = "firecracker"
	upd.ReadyAt = ptr(base.Add(time.Millisecond))
	upd.ExpiresAt = ptr(base.Add(time.Hour))
	upd.EndedAt = ptr(base.Add(2 * time.Hour))
	upd.DeletedAt = ptr(base.Add(3 * time.Hour))
	upd.VM = []byte(`{"pid":7}`)
	if err := put(ctx, s, &upd); err != nil {
		t.Fatal(err)
	}
	got, err := s.GetSandbox(ctx, upd.ID)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(&upd, got); diff != "" {
		t.Errorf("after update (-want +got):\n%s", diff)
	}
	back := *full
	back.ID = upd.ID
	back.OwnerKeyID, back.EnvNames, back.VCPU, back.MemoryMiB, back.DiskMiB, back.CreatedAt =
		upd.OwnerKeyID, upd.EnvNames, upd.VCPU, upd.MemoryMiB, upd.DiskMiB, upd.CreatedAt
	back.ReadyAt, back.ExpiresAt, back.EndedAt, back.DeletedAt, back.VM, back.Labels = nil, nil, nil, nil, nil, nil
	if err := put(ctx, s, &back); err != nil {
		t.Fatal(err)
	}
	if got, err = s.GetSandbox(ctx, upd.ID); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(&back, got); diff != "" {
		t.Errorf("after update to nil (-want +got):\n%s", diff)
	}
}

func TestInsertDefaultsCreatedAt(t *testing.T) {
	s, _ := openTest(t)
	sb := newSandbox("sbx_1", "key_1", time.Time{})
	before := time.Now()
	mustInsert(t, s, sb)
	if sb.CreatedAt.Before(before) || time.Since(sb.CreatedAt) > time.Minute {
		t.Errorf("CreatedAt = %v, want about now", sb.CreatedAt)
	}
	got, err := s.GetSandbox(t.Context(), sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	if !got.CreatedAt.Equal(sb.CreatedAt) {
		t.Errorf("stored CreatedAt = %v, want %v", got.CreatedAt, sb.CreatedAt)
	}
}

func TestSandboxErrors(t *testing.T) {
	s, _ := openTest(t)
	ctx := t.Context()
	if _, err := s.GetSandbox(ctx, "sbx_nope"); !errdefs.IsNotFound(err) || errdefs.Code(err) != "sandbox_not_found" {
		t.Errorf("GetSandbox(missing) = %v, want sandbox_not_found", err)
	}
	if err := put(ctx, s, newSandbox("sbx_nope", "key_1", base)); !errdefs.IsNotFound(err) {
		t.Errorf("UpdateSandbox(missing) = %v, want not found", err)
	}
	sb := newSandbox("sbx_1", "key_1", base)
	mustInsert(t, s, sb)
	if err := s.InsertSandbox(ctx, sb, ""); !errdefs.IsConflict(err) || errdefs.Code(err) == "name_taken" {
		t.Errorf("InsertSandbox(duplicate id) = %v, want conflict, not name_taken", err)
	}
	if err := s.InsertSandbox(ctx, newSandbox("", "key_1", base), ""); !errdefs.IsInvalidArgument(err) {
		t.Errorf("InsertSandbox(no id) = %v, want invalid argument", err)
	}
}

func TestNameTaken(t *testing.T) {
	s, _ := openTest(t)
	ctx := t.Context()

	holder := newSandbox("sbx_a", "key_1", base)
	holder.Name = "web"
	mustInsert(t, s, holder)

	isNameTaken := func(err error) bool { return errdefs.IsConflict(err) && errdefs.Code(err) == "name_taken" }

	for _, state := range []sandbox.State{sandbox.StateStarting, sandbox.StateRunning, sandbox.StateStopping} {
		sb := newSandbox("sbx_b_"+string(state), "key_1", base)
		sb.Name, sb.State = "web", state
		if err := s.InsertSandbox(ctx, sb, ""); !isNameTaken(err) {
			t.Errorf("InsertSandbox(same name, %s) = %v, want name_taken", state, err)
		}
	}

	// Other owners, unnamed sandboxes and stopped ones do not clash.
	other := newSandbox("sbx_other", "key_2", base)
	other.Name = "web"
	stopped := newSandbox("sbx_stopped", "key_1", base)
	stopped.Name, stopped.State = "web", sandbox.StateStopped
	mustInsert(t, s, other, stopped, newSandbox("sbx_n1", "key_1", base), newSandbox("sbx_n2", "key_1", base))

	// Renaming another live sandbox onto the name clashes too.
	rename := newSandbox("sbx_n1", "key_1", base)
	rename.Name = "web"
	if err := put(ctx, s, rename); !isNameTaken(err) {
		t.Errorf("UpdateSandbox(rename onto taken name) = %v, want name_taken", err)
	}

	// Once the holder stops, the name is free again.
	holder.State, holder.StopReason = sandbox.StateStopped, sandbox.ReasonRequested
	if err := put(ctx, s, holder); err != nil {
		t.Fatal(err)
	}
	next := newSandbox("sbx_c", "key_1", base.Add(time.Second))
	next.Name = "web"
	if err := s.InsertSandbox(ctx, next, ""); err != nil {
		t.Fatalf("InsertSandbox after holder stopped: %v", err)
	}
	// And the old holder cannot come back to life under it.
	holder.State = sandbox.StateRunning
	if err := put(ctx, s, holder); !isNameTaken(err) {
		t.Errorf("UpdateSandbox(revive holder) = %v, want name_taken", err)
	}
}

func ids(list []*sandbox.Sandbox) []string {
	out := []string{}
	for _, sb := range list {
		out = append(out, sb.ID)
	}
	return out
}

func TestListSandboxes(t *testing.T) {
	s, _ := openTest(t)
	ctx := t.Context()

	mk := func(id, owner string, minute int, state sandbox.State, name string, labels map[string]string) *sandbox.Sandbox {
		sb := newSandbox(id, owner, base.Add(time.Duration(minute)*time.Minute))
		sb.State, sb.Name, sb.Labels = state, name, labels
		return sb
	}
	mustInsert(t, s,
		mk("s1", "k1", 1, sandbox.StateRunning, "web", map[string]string{"env": "prod", "team": "a"}),
		mk("s2", "k1", 2, sandbox.StateStarting, "", map[string]string{"env": "dev"}),
		mk("s3", "k1", 3, sandbox.StateStopped, "web", map[string]string{"env": "prod"}),
		mk("s4", "k1", 4, sandbox.StateDeleted, "", map[string]string{"env": "prod"}),
		mk("s5", "k2", 5, sandbox.StateRunning, "web", map[string]string{"env": "prod", "team": "a"}),
		mk("s6", "k1", 6, sandbox.StateStopping, "db", nil),
		// Same instant as s6: the id breaks the tie.
		mk("s7", "k1", 6, sandbox.StateRunning, "", map[string]string{"team": "b"}),
	)

	for _, tc := range []struct {
		name string
		opts sandbox.ListOptions
		want []string
	}{
		{"all live", sandbox.ListOptions{}, []string{"s7", "s6", "s5", "s2", "s1"}},
		{"owner", sandbox.ListOptions{OwnerKeyID: "k1"}, []string{"s7", "s6", "s2", "s1"}},
		{"include stopped", sandbox.ListOptions{OwnerKeyID: "k1", IncludeStopped: true}, []string{"s7", "s6", "s3", "s2", "s1"}},
		{"states stopped", sandbox.ListOptions{States: []sandbox.State{sandbox.StateStopped}}, []string{"s3"}},
		{"states deleted", sandbox.ListOptions{States: []sandbox.State{sandbox.StateDeleted, sandbox.StateStarting}}, []string{"s4", "s2"}},
		{"name", sandbox.ListOptions{OwnerKeyID: "k1", Name: "web"}, []string{"s1"}},
		{"name include stopped", sandbox.ListOptions{OwnerKeyID: "k1", Name: "web", IncludeStopped: true}, []string{"s3", "s1"}},
		{"one label", sandbox.ListOptions{Labels: map[string]string{"env": "prod"}}, []string{"s5", "s1"}},
		{"two labels", sandbox.ListOptions{OwnerKeyID: "k1", Labels: map[string]string{"env": "prod", "team": "a"}}, []string{"s1"}},
		{"label mismatch", sandbox.ListOptions{Labels: map[string]string{"env": "prod", "team": "b"}}, []string{}},
		{"label key absent", sandbox.ListOptions{Labels: map[string]string{"nope": ""}}, []string{}},
		{"no match", sandbox.ListOptions{OwnerKeyID: "k3"}, []string{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, next, err := s.ListSandboxes(ctx, tc.opts)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, ids(got)); diff != "" {
				t.Errorf("ids (-want +got):\n%s", diff)
			}
			if next != "" {
				t.Errorf("next cursor = %q, want none", next)
			}
		})
	}

	for _, tc := range []struct {
		name string
		opts sandbox.ListOptions
	}{
		{"negative limit", sandbox.ListOptions{Limit: -1}},
		{"limit too big", sandbox.ListOptions{Limit: MaxListLimit + 1}},
		{"garbage cursor", sandbox.ListOptions{Cursor: "!!!"}},
		{"base64 garbage cursor", sandbox.ListOptions{Cursor: encodeCursor("yesterday", "s1")}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, _, err := s.ListSandboxes(ctx, tc.opts); !errdefs.IsInvalidArgument(err) {
				t.Errorf("ListSandboxes = %v, want invalid argument", err)
			}
		})
	}
}

func TestListPaging(t *testing.T) {
	s, _ := openTest(t)
	ctx := t.Context()

	// 8 matching sandboxes, pairs sharing an instant, interleaved with ones
	// a label filter must skip without disturbing the pages.
	var want []string
	for i := range 8 {
		sb := newSandbox(fmt.Sprintf("m%d", i), "k1", base.Add(time.Duration(i/2)*time.Millisecond))
		sb.Labels = map[string]string{"pick": "yes"}
		skip := newSandbox(fmt.Sprintf("x%d", i), "k1", sb.CreatedAt)
		skip.Labels = map[string]string{"pick": "no"}
		mustInsert(t, s, sb, skip)
		want = append([]string{sb.ID}, want...)
	}

	var (
		got    []string
		sizes  []int
		cursor string
	)
	for {
		page, next, err := s.ListSandboxes(ctx, sandbox.ListOptions{
			OwnerKeyID: "k1", Labels: map[string]string{"pick": "yes"}, Limit: 3, Cursor: cursor,
		})
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, ids(page)...)
		sizes = append(sizes, len(page))
		if next == "" {
			break
		}
		if len(sizes) > 10 {
			t.Fatal("paging does not end")
		}
		cursor = next
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("paged ids (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]int{3, 3, 2}, sizes); diff != "" {
		t.Errorf("page sizes (-want +got):\n%s", diff)
	}

	// An exactly full last page reports no next cursor.
	page, next, err := s.ListSandboxes(ctx, sandbox.ListOptions{Labels: map[string]string{"pick": "yes"}, Limit: 8})
	if err != nil {
		t.Fatal(err)
	}
	if len(page) != 8 || next != "" {
		t.Errorf("Limit 8: got %d rows, next %q; want 8 and none", len(page), next)
	}

	// The default limit is 50.
	for i := range 60 {
		mustInsert(t, s, newSandbox(fmt.Sprintf("d%02d", i), "k2", base))
	}
	page, next, err = s.ListSandboxes(ctx, sandbox.ListOptions{OwnerKeyID: "k2"})
	if err != nil {
		t.Fatal(err)
	}
	if len(page) != DefaultListLimit || next == "" {
		t.Errorf("default limit: got %d rows, next %q", len(page), next)
	}
}

func TestListLive(t *testing.T) {
	s, _ := openTest(t)
	var want []string
	for i, st := range []sandbox.State{
		sandbox.StateStarting, sandbox.StateStopped, sandbox.StateRunning,
		sandbox.StateDeleted, sandbox.StateStopping,
	} {
		sb := newSandbox(fmt.Sprintf("s%d", i), fmt.Sprintf("k%d", i%2), base.Add(time.Duration(i)*time.Second))
		sb.State = st
		mustInsert(t, s, sb)
		if !st.Terminal() {
			want = append(want, sb.ID)
		}
	}
	got, err := s.ListLive(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, ids(got)); diff != "" {
		t.Errorf("ListLive ids (-want +got):\n%s", diff)
	}
}

func TestKeys(t *testing.T) {
	s, path := openTest(t)
	ctx := t.Context()

	if n, err := s.CountKeys(ctx); err != nil || n != 0 {
		t.Fatalf("CountKeys = %d, %v; want 0", n, err)
	}
	k1, secret1, err := s.CreateKey(ctx, "admin")
	if err != nil {
		t.Fatal(err)
	}
	k2, secret2, err := s.CreateKey(ctx, "ci")
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`^key_[0-9a-f]{16}$`).MatchString(k1.ID) {
		t.Errorf("key id %q has the wrong form", k1.ID)
	}
	if !regexp.MustCompile(`^ebx_[A-Za-z0-9_-]{43}$`).MatchString(secret1) {
		t.Errorf("secret %q has the wrong form", secret1)
	}
	if k1.ID == k2.ID || secret1 == secret2 {
		t.Error("two keys share an id or secret")
	}

	for _, tc := range []struct {
		secret string
		want   Key
	}{{secret1, k1}, {secret2, k2}} {
		got, err := s.AuthenticateKey(ctx, tc.secret)
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(tc.want, got); diff != "" {
			t.Errorf("AuthenticateKey (-want +got):\n%s", diff)
		}
	}
	for _, bad := range []string{"", "ebx_", secret1[:len(secret1)-1], secret1 + "x", hashSecret(secret1)} {
		if _, err := s.AuthenticateKey(ctx, bad); !errdefs.IsNotFound(err) {
			t.Errorf("AuthenticateKey(%q) = %v, want not found", bad, err)
		}
	}

	keys, err := s.ListKeys(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]Key{k1, k2}, keys); diff != "" {
		t.Errorf("ListKeys (-want +got):\n%s", diff)
	}
	if n, err := s.CountKeys(ctx); err != nil || n != 2 {
		t.Errorf("CountKeys = %d, %v; want 2", n, err)
	}

	// Neither the secrets nor their random part appear anywhere on disk,
	// in the main file or the WAL; their hashes do. PostgreSQL's files are
	// the server's: there, every stored row is read as text instead.
	var disk []byte
	for _, p := range []string{path, path + "-wal"} {
		if s.Engine() == "postgres" {
			var rows string
			if err := s.db.QueryRowContext(ctx, `SELECT string_agg(k::text, ' ') FROM api_keys AS k`).Scan(&rows); err != nil {
				t.Fatal(err)
			}
			disk = []byte(rows)
			break
		}
		b, err := os.ReadFile(p)
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			t.Fatal(err)
		}
		disk = append(disk, b...)
	}
	for _, secret := range []string{secret1, secret2} {
		if bytes.Contains(disk, []byte(secret[len("ebx_"):])) {
			t.Errorf("secret %q is stored in clear", secret)
		}
		if !bytes.Contains(disk, []byte(hashSecret(secret))) {
			t.Errorf("hash of %q not found on disk; is the test reading the right file?", secret)
		}
	}
}

func TestIdempotency(t *testing.T) {
	s, _ := openTest(t)
	ctx := t.Context()
	now := base
	s.now = func() time.Time { return now }

	reserve := func(keyID, key, fp string) (*Idempotency, bool) {
		t.Helper()
		rec, ok, err := s.ReserveIdempotency(ctx, keyID, key, fp)
		if err != nil {
			t.Fatal(err)
		}
		return rec, ok
	}

	if rec, ok := reserve("k1", "idem", "fp1"); !ok || rec != nil {
		t.Fatalf("first reserve = %v, %v; want reserved", rec, ok)
	}
	// While the first request runs, others see the pending record.
	rec, ok := reserve("k1", "idem", "fp2")
	want := &Idempotency{KeyID: "k1", Key: "idem", Fingerprint: "fp1", CreatedAt: base}
	if ok {
		t.Fatal("second reserve succeeded")
	}
	if diff := cmp.Diff(want, rec); diff != "" {
		t.Errorf("pending record (-want +got):\n%s", diff)
	}
	// Another API key has its own namespace.
	if _, ok := reserve("k2", "idem", "fp1"); !ok {
		t.Error("reserve under another API key did not succeed")
	}

	body := []byte(`{"id":"sbx_1"}`)
	if err := s.CompleteIdempotency(ctx, "k1", "idem", 201, "application/json", body); err != nil {
		t.Fatal(err)
	}
	// Releasing a completed record is a no-op: replays keep working.
	if err := s.ReleaseIdempotency(ctx, "k1", "idem"); err != nil {
		t.Fatal(err)
	}
	now = base.Add(IdempotencyTTL - time.Second)
	rec, ok = reserve("k1", "idem", "fp1")
	want.Status, want.ContentType, want.Body = 201, "application/json", body
	if ok {
		t.Fatal("reserve of a completed key succeeded")
	}
	if diff := cmp.Diff(want, rec); diff != "" {
		t.Errorf("completed record (-want +got):\n%s", diff)
	}

	// After the TTL the key can be used afresh.
	now = base.Add(IdempotencyTTL)
	if rec, ok := reserve("k1", "idem", "fp3"); !ok {
		t.Fatalf("reserve after expiry = %+v, not reserved", rec)
	}
	rec, _ = reserve("k1", "idem", "fp1")
	if diff := cmp.Diff(&Idempotency{KeyID: "k1", Key: "idem", Fingerprint: "fp3", CreatedAt: now}, rec); diff != "" {
		t.Errorf("renewed record (-want +got):\n%s", diff)
	}

	// Releasing a pending reservation lets a retry run again.
	if err := s.ReleaseIdempotency(ctx, "k1", "idem"); err != nil {
		t.Fatal(err)
	}
	if _, ok := reserve("k1", "idem", "fp1"); !ok {
		t.Error("reserve after release did not succeed")
	}

	if err := s.CompleteIdempotency(ctx, "k1", "missing", 200, "", nil); !errdefs.IsNotFound(err) {
		t.Errorf("CompleteIdempotency(missing) = %v, want not found", err)
	}
	if err := s.ReleaseIdempotency(ctx, "k1", "missing"); err != nil {
		t.Errorf("ReleaseIdempotency(missing) = %v", err)
	}

	// k2/idem was created at base, k1/idem at base+TTL.
	n, err := s.PruneIdempotency(ctx, base.Add(time.Hour))
	if err != nil || n != 1 {
		t.Errorf("PruneIdempotency = %d, %v; want 1", n, err)
	}
	if _, ok := reserve("k2", "idem", "fp9"); !ok {
		t.Error("pruned key was not free")
	}
	if _, ok := reserve("k1", "idem", "fp9"); ok {
		t.Error("unpruned key was free")
	}
}

func TestEvents(t *testing.T) {
	s, _ := openTest(t)
	ctx := t.Context()
	now := base
	s.now = func() time.Time { now = now.Add(time.Millisecond); return now }

	mustInsert(t, s, newSandbox("sbx_1", "k1", base), newSandbox("sbx_2", "k1", base))
	data := map[string]any{"pid": float64(42), "args": []any{"a", "b"}, "ok": true}
	for _, e := range []struct {
		id, typ, msg string
		data         map[string]any
	}{
		{"sbx_1", "created", "created", nil},
		{"sbx_2", "created", "", nil},
		{"sbx_1", "ready", "vm booted", data},
		{"sbx_1", "stopped", "stopped by request", map[string]any{}},
	} {
		if err := s.AppendEvent(ctx, e.id, e.typ, e.msg, e.data); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.AppendEvent(ctx, "sbx_nope", "created", "", nil); !errdefs.IsNotFound(err) {
		t.Errorf("AppendEvent(unknown sandbox) = %v, want not found", err)
	}

	all := []Event{
		{ID: 1, SandboxID: "sbx_1", Type: "created", Message: "created", At: base.Add(1 * time.Millisecond)},
		{ID: 3, SandboxID: "sbx_1", Type: "ready", Message: "vm booted", Data: data, At: base.Add(3 * time.Millisecond)},
		{ID: 4, SandboxID: "sbx_1", Type: "stopped", Message: "stopped by request", Data: map[string]any{}, At: base.Add(4 * time.Millisecond)},
	}
	for _, tc := range []struct {
		limit int
		want  []Event
	}{
		{0, all},
		{10, all},
		{2, all[1:]},
		{1, all[2:]},
	} {
		got, err := s.ListEvents(ctx, "sbx_1", tc.limit)
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(tc.want, got); diff != "" {
			t.Errorf("ListEvents(limit %d) (-want +got):\n%s", tc.limit, diff)
		}
	}
	if got, err := s.ListEvents(ctx, "sbx_nope", 0); err != nil || len(got) != 0 {
		t.Errorf("ListEvents(unknown) = %v, %v; want none", got, err)
	}
}

func TestReopen(t *testing.T) {
	ctx := t.Context()
	path := newDSN(t)
	s, err := Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	key, secret, err := s.CreateKey(ctx, "admin")
	if err != nil {
		t.Fatal(err)
	}
	sb := newSandbox("sbx_1", key.ID, base)
	sb.Name, sb.Labels, sb.ReadyAt, sb.VM = "web", map[string]string{"a": "b"}, ptr(base.Add(time.Second)), []byte("{}")
	mustInsert(t, s, sb)
	if err := s.AppendEvent(ctx, sb.ID, "created", "hello", nil); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.ReserveIdempotency(ctx, key.ID, "idem", "fp"); err != nil {
		t.Fatal(err)
	}
	if err := s.CompleteIdempotency(ctx, key.ID, "idem", 200, "text/plain", []byte("ok")); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	s, err = Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if got, err := s.AuthenticateKey(ctx, secret); err != nil || got.ID != key.ID {
		t.Errorf("AuthenticateKey after reopen = %+v, %v", got, err)
	}
	got, err := s.GetSandbox(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(sb, got); diff != "" {
		t.Errorf("sandbox after reopen (-want +got):\n%s", diff)
	}
	if evs, err := s.ListEvents(ctx, sb.ID, 0); err != nil || len(evs) != 1 || evs[0].Message != "hello" {
		t.Errorf("events after reopen = %+v, %v", evs, err)
	}
	rec, reserved, err := s.ReserveIdempotency(ctx, key.ID, "idem", "fp")
	if err != nil || reserved || rec == nil || rec.Status != 200 || string(rec.Body) != "ok" {
		t.Errorf("idempotency after reopen = %+v, %v, %v", rec, reserved, err)
	}
}

// TestConcurrentWrites checks that writers on several goroutines, hence
// several pooled connections, wait for each other instead of failing with
// SQLITE_BUSY.
func TestConcurrentWrites(t *testing.T) {
	s, _ := openTest(t)
	ctx := context.Background()
	const workers, each = 8, 25

	var wg sync.WaitGroup
	errc := make(chan error, workers*each)
	for w := range workers {
		wg.Go(func() {
			for i := range each {
				sb := newSandbox(fmt.Sprintf("sbx_%d_%d", w, i), fmt.Sprintf("k%d", w), base.Add(time.Duration(i)*time.Millisecond))
				sb.Name = fmt.Sprintf("n%d", i)
				if err := s.InsertSandbox(ctx, sb, ""); err != nil {
					errc <- err
					continue
				}
				sb.State = sandbox.StateStopped
				if err := put(ctx, s, sb); err != nil {
					errc <- err
				}
				if err := s.AppendEvent(ctx, sb.ID, "stopped", "", nil); err != nil {
					errc <- err
				}
				if _, _, err := s.ReserveIdempotency(ctx, "k", fmt.Sprint(i), "fp"); err != nil {
					errc <- err
				}
				if _, _, err := s.ListSandboxes(ctx, sandbox.ListOptions{IncludeStopped: true, Limit: 5}); err != nil {
					errc <- err
				}
			}
		})
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Error(err)
	}
	var n int
	if err := s.db.QueryRowContext(ctx, `SELECT count(*) FROM sandboxes`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != workers*each {
		t.Errorf("%d sandboxes stored, want %d", n, workers*each)
	}
}

// put overwrites a sandbox's mutable fields with sb's.
func put(ctx context.Context, s *Store, sb *sandbox.Sandbox) error {
	_, err := s.UpdateSandbox(ctx, sb.ID, func(r *sandbox.Sandbox) bool { *r = *sb; return true })
	return err
}

// TestUpdateSandboxIsAtomic runs read-modify-writes of one record from many
// goroutines: none may be lost, as one would be if another write could come
// between an update's read and its write.
func TestUpdateSandboxIsAtomic(t *testing.T) {
	s, _ := openTest(t)
	ctx := t.Context()
	mustInsert(t, s, newSandbox("sbx_1", "key_1", base))
	const workers, each = 8, 20
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for range each {
				if _, err := s.UpdateSandbox(ctx, "sbx_1", func(sb *sandbox.Sandbox) bool {
					sb.TimeoutSeconds++
					return true
				}); err != nil {
					t.Error(err)
				}
			}
		})
	}
	wg.Wait()
	got, err := s.GetSandbox(ctx, "sbx_1")
	if err != nil {
		t.Fatal(err)
	}
	want := newSandbox("sbx_1", "key_1", base).TimeoutSeconds + workers*each
	if got.TimeoutSeconds != want {
		t.Errorf("TimeoutSeconds = %d after %d increments, want %d", got.TimeoutSeconds, workers*each, want)
	}
	// fn returning false writes nothing; a missing record is not found.
	if _, err := s.UpdateSandbox(ctx, "sbx_1", func(sb *sandbox.Sandbox) bool { sb.Name = "x"; return false }); err != nil {
		t.Fatal(err)
	}
	if got, _ := s.GetSandbox(ctx, "sbx_1"); got.Name == "x" {
		t.Error("an update whose fn returned false was written")
	}
	if _, err := s.UpdateSandbox(ctx, "sbx_nope", func(*sandbox.Sandbox) bool { return true }); !errdefs.IsNotFound(err) {
		t.Errorf("UpdateSandbox(missing) = %v, want not found", err)
	}
}

// TestUpdateSandboxImage: a switch of image rewrites the record's image
// and base disk, and the image's users follow it.
func TestUpdateSandboxImage(t *testing.T) {
	s, _ := openTest(t)
	ctx := t.Context()
	sb := newSandbox("sbx_1", "key_1", base)
	sb.ImageID, sb.Rootfs = "img_old", "/blobs/old/rootfs.img"
	mustInsert(t, s, sb)
	if _, err := s.UpdateSandbox(ctx, "sbx_1", func(r *sandbox.Sandbox) bool {
		r.ImageID, r.Rootfs = "img_new", "/blobs/new/rootfs.img"
		return true
	}); err != nil {
		t.Fatal(err)
	}
	got, err := s.GetSandbox(ctx, "sbx_1")
	if err != nil || got.ImageID != "img_new" || got.Rootfs != "/blobs/new/rootfs.img" {
		t.Fatalf("after the update: %+v, %v", got, err)
	}
	for id, want := range map[string]int{"img_old": 0, "img_new": 1} {
		if n, _, _, err := s.ImageUsers(ctx, id); err != nil || n != want {
			t.Errorf("ImageUsers(%s) = %d, %v; want %d", id, n, err, want)
		}
	}
}

// TestUpdateSandboxWritesItsEvents: the entries given to UpdateSandbox are
// appended with the change, with what fn filled in, and published to the
// feed; with no change there is no event, and an entry that cannot be
// written undoes the change.
func TestUpdateSandboxWritesItsEvents(t *testing.T) {
	s, _ := openTest(t)
	ctx := t.Context()
	mustInsert(t, s, newSandbox("sbx_1", "key_1", base))
	stopped := &sandbox.TrailEntry{Type: "stopped", Message: "sandbox stopped"}
	if _, err := s.UpdateSandbox(ctx, "sbx_1", func(sb *sandbox.Sandbox) bool {
		sb.State, sb.StopReason = sandbox.StateStopped, "user"
		stopped.Data = map[string]any{"reason": sb.StopReason}
		return true
	}, stopped); err != nil {
		t.Fatal(err)
	}
	trail, err := s.ListEvents(ctx, "sbx_1", 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(trail) != 1 || trail[0].Type != "stopped" || trail[0].Data["reason"] != "user" {
		t.Fatalf("trail after a stop with its entry = %+v, want one stopped event with reason user", trail)
	}
	feed, err := s.ListFeed(ctx, webhook.FeedQuery{Owner: "key_1"})
	if err != nil {
		t.Fatal(err)
	}
	if len(feed) != 1 || feed[0].Type != webhook.SandboxStopped {
		t.Errorf("feed after the stop = %+v, want one %s", feed, webhook.SandboxStopped)
	}

	// No change, no event.
	if _, err := s.UpdateSandbox(ctx, "sbx_1", func(*sandbox.Sandbox) bool { return false },
		&sandbox.TrailEntry{Type: "paused"}); err != nil {
		t.Fatal(err)
	}
	// An entry that cannot be encoded fails the update, which is undone.
	_, err = s.UpdateSandbox(ctx, "sbx_1", func(sb *sandbox.Sandbox) bool { sb.Name = "renamed"; return true },
		&sandbox.TrailEntry{Type: "odd", Data: map[string]any{"c": make(chan int)}})
	if err == nil {
		t.Fatal("an update whose entry cannot be encoded succeeded")
	}
	if got, _ := s.GetSandbox(ctx, "sbx_1"); got.Name == "renamed" {
		t.Error("the change was kept although its event was not written")
	}
	if trail, _ := s.ListEvents(ctx, "sbx_1", 10); len(trail) != 1 {
		t.Errorf("trail = %+v, want the one stopped event", trail)
	}
}
