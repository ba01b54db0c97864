package api

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/emberbox/emberbox/internal/errdefs"
	"github.com/emberbox/emberbox/internal/guest"
	"github.com/emberbox/emberbox/internal/sandbox"
)

// fakeManager is an in-memory Manager that enforces owners like the real one.
type fakeManager struct {
	mu        sync.Mutex
	sandboxes map[string]*sandbox.Sandbox
	files     map[string][]byte // id + "\x00" + path
	n         int
	// mounts are the fake guests' attached volumes: attachment id → sandbox
	// id + "\x00" + path; volumeBusy refuses detaches.
	mounts     map[string]string
	volumeBusy bool
	freezes    int // FreezeVolume calls

	creates    int
	createErr  error
	createHook func()
	lastSpec   sandbox.CreateSpec
	waits      []waitCall
	listOpts   sandbox.ListOptions
	listNext   string
	lastExec   guest.ExecRequest
	execResult guest.ExecResult
	execEvents []guest.Event
	execErr    error
	execHook   func(onEvent func(guest.Event) error) error // replaces events when set
	outputReq  guest.ProcessRequest
	signal     string
	lastMode   uint32
	lastChmod  string // path and octal mode
	chmodErr   error
	restarts   int
	lastUpdate sandbox.UpdateSpec
	lastFork   sandbox.ForkSpec
	snaps      map[string]*sandbox.Snapshot
	usage      fakeUsage                   // fake_usage_test.go
	arch       fakeArchive                 // fake_archive_test.go
	watch      fakeWatch                   // fake_archive_test.go
	ports      map[string]string           // id:port → the address DialPort reaches (fake_ports_test.go)
	previews   map[string]*sandbox.Preview // id:port
	stdin      fakeStdin                   // fake_stdin_test.go
	// fake_checkpoints_test.go
	checkpoints map[string]*sandbox.Snapshot
	lastRestore string
}

type waitCall struct {
	id      string
	states  []sandbox.State
	timeout time.Duration // rounded to seconds
}

func newFakeManager() *fakeManager {
	return &fakeManager{sandboxes: map[string]*sandbox.Sandbox{}, files: map[string][]byte{}, snaps: map[string]*sandbox.Snapshot{},
		mounts: map[string]string{}}
}

func notFound(id string) error {
	return &errdefs.CodedError{Class: errdefs.ErrNotFound, Code: "not_found", Message: "no sandbox " + id}
}

func (m *fakeManager) getLocked(owner, id string) (*sandbox.Sandbox, error) {
	if id == "panic" {
		panic("boom")
	}
	if id == "broken" {
		return nil, fmt.Errorf("disk /var/secret/path failed: %w", errdefs.ErrInternal)
	}
	sb := m.sandboxes[id]
	if sb == nil || sb.OwnerKeyID != owner {
		return nil, notFound(id)
	}
	return sb, nil
}

// add puts a running sandbox of owner with a lease ending in lease.
func (m *fakeManager) add(owner, id string, state sandbox.State, lease time.Duration) *sandbox.Sandbox {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := time.Now()
	exp := now.Add(lease)
	sb := &sandbox.Sandbox{ID: id, OwnerKeyID: owner, State: state, CreatedAt: now, ExpiresAt: &exp,
		VCPU: 2, MemoryMiB: 4096, DiskMiB: 4096, TimeoutSeconds: 1800, OnLeaseEnd: "stop", Accel: "tcg", Driver: "qemu"}
	m.sandboxes[id] = sb
	return sb
}

func clone(sb *sandbox.Sandbox) *sandbox.Sandbox { c := *sb; return &c }

func (m *fakeManager) Create(ctx context.Context, owner string, spec sandbox.CreateSpec) (*sandbox.Sandbox, error) {
	if m.createHook != nil {
		m.createHook()
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.creates++
	m.lastSpec = spec
	if m.createErr != nil {
		return nil, m.createErr
	}
	m.n++
	id := fmt.Sprintf("sbx_%d", m.n)
	sb := &sandbox.Sandbox{ID: id, OwnerKeyID: owner, Name: spec.Name, Labels: spec.Labels, State: sandbox.StateStarting,
		VCPU: spec.VCPU, MemoryMiB: spec.MemoryMiB, DiskMiB: spec.DiskMiB, TimeoutSeconds: spec.TimeoutSeconds,
		OnLeaseEnd: spec.OnLeaseEnd, CreatedAt: time.Date(2026, 11, 1, 12, 0, 0, 123456789, time.UTC),
		AutoWake: spec.AutoWake == nil || *spec.AutoWake, IdlePauseSeconds: spec.IdlePauseSeconds, Persistent: spec.Persistent,
		SnapshotID: spec.SnapshotID}
	for k := range spec.Env {
		sb.EnvNames = append(sb.EnvNames, k)
	}
	m.sandboxes[id] = sb
	return clone(sb), nil
}

func (m *fakeManager) Get(ctx context.Context, owner, id string) (*sandbox.Sandbox, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	sb, err := m.getLocked(owner, id)
	if err != nil {
		return nil, err
	}
	return clone(sb), nil
}

func (m *fakeManager) List(ctx context.Context, opts sandbox.ListOptions) ([]*sandbox.Sandbox, string, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.listOpts = opts
	var out []*sandbox.Sandbox
	for _, sb := range m.sandboxes {
		if (sb.OwnerKeyID == opts.OwnerKeyID || (opts.OwnerKeyID == "" && opts.AllOwners)) && (opts.Name == "" || sb.Name == opts.Name) {
			out = append(out, clone(sb))
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, m.listNext, nil
}

// WaitFor records the wait and moves the sandbox to the first state asked.
func (m *fakeManager) WaitFor(ctx context.Context, owner, id string, states ...sandbox.State) (*sandbox.Sandbox, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	sb, err := m.getLocked(owner, id)
	if err != nil {
		return nil, err
	}
	dl, _ := ctx.Deadline()
	m.waits = append(m.waits, waitCall{id: id, states: states, timeout: time.Until(dl).Round(time.Second)})
	sb.State = states[0]
	return clone(sb), nil
}

func (m *fakeManager) Stop(ctx context.Context, owner, id string) (*sandbox.Sandbox, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	sb, err := m.getLocked(owner, id)
	if err != nil {
		return nil, err
	}
	sb.State = sandbox.StateStopping
	return clone(sb), nil
}

func (m *fakeManager) Delete(ctx context.Context, owner, id string) (*sandbox.Sandbox, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	sb, err := m.getLocked(owner, id)
	if err != nil {
		return nil, err
	}
	now := time.Date(2026, 11, 1, 13, 0, 0, 0, time.UTC)
	sb.State, sb.DeletedAt = sandbox.StateDeleted, &now
	return clone(sb), nil
}

func (m *fakeManager) Extend(ctx context.Context, owner, id string, d time.Duration) (*sandbox.Sandbox, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	sb, err := m.getLocked(owner, id)
	if err != nil {
		return nil, err
	}
	exp := time.Now().Add(d)
	sb.ExpiresAt = &exp
	return clone(sb), nil
}

func (g fakeGuest) Exec(ctx context.Context, req guest.ExecRequest, onEvent func(guest.Event) error) (*guest.ExecResult, error) {
	m, owner, id := g.m, g.owner, g.id
	m.mu.Lock()
	_, err := m.getLocked(owner, id)
	m.lastExec = req
	events, res, execErr, hook := m.execEvents, m.execResult, m.execErr, m.execHook
	m.mu.Unlock()
	if err != nil {
		return nil, err
	}
	if hook != nil {
		return &res, hook(onEvent)
	}
	if req.Stream {
		for _, ev := range events {
			if err := onEvent(ev); err != nil {
				return &res, err
			}
		}
	}
	if execErr != nil {
		return nil, execErr
	}
	return &res, nil
}

func (g fakeGuest) Spawn(ctx context.Context, req guest.ExecRequest) (*guest.ProcessInfo, error) {
	m, owner, id := g.m, g.owner, g.id
	if _, err := m.Get(ctx, owner, id); err != nil {
		return nil, err
	}
	m.mu.Lock()
	m.lastExec = req
	m.mu.Unlock()
	if req.Pty != nil {
		return m.stdin.spawnTTY(req), nil
	}
	return &guest.ProcessInfo{ID: "p1", State: "running", Command: req.Command, StartedAt: time.Unix(0, 0),
		StdinOpen: req.StdinPipe}, nil
}

func (g fakeGuest) Processes(ctx context.Context) ([]guest.ProcessInfo, error) {
	m, owner, id := g.m, g.owner, g.id
	if _, err := m.Get(ctx, owner, id); err != nil {
		return nil, err
	}
	return []guest.ProcessInfo{{ID: "p1", State: "running"}}, nil
}

func (g fakeGuest) Process(ctx context.Context, pid string) (*guest.ProcessInfo, error) {
	m, owner, id := g.m, g.owner, g.id
	if _, err := m.Get(ctx, owner, id); err != nil {
		return nil, err
	}
	if pid == fakeTTYID {
		return m.stdin.ttyInfo(), nil
	}
	if pid != "p1" {
		return nil, errdefs.New(errdefs.ErrNotFound, "process_not_found", "no process %s", pid)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return &guest.ProcessInfo{ID: "p1", State: "running", OutputEncoding: m.lastExec.OutputEncoding}, nil
}

func (g fakeGuest) ProcessOutput(ctx context.Context, req guest.ProcessRequest, onEvent func(guest.Event) error) error {
	m, owner, id := g.m, g.owner, g.id
	if _, err := m.Get(ctx, owner, id); err != nil {
		return err
	}
	if req.ID == fakeTTYID {
		return m.stdin.ttyOutput(ctx, req, onEvent)
	}
	m.mu.Lock()
	m.outputReq = req
	events := m.execEvents
	m.mu.Unlock()
	for _, ev := range events {
		if err := onEvent(ev); err != nil {
			return err
		}
	}
	return nil
}

func (g fakeGuest) Signal(ctx context.Context, pid, signal string) (*guest.ProcessInfo, error) {
	m, owner, id := g.m, g.owner, g.id
	if _, err := m.Get(ctx, owner, id); err != nil {
		return nil, err
	}
	m.mu.Lock()
	m.signal = signal
	m.mu.Unlock()
	return &guest.ProcessInfo{ID: pid, State: "killed"}, nil
}

func (m *fakeManager) entry(p string, size int64) *guest.FileEntry {
	return &guest.FileEntry{Name: p[strings.LastIndexByte(p, '/')+1:], Path: p, Type: "file", Size: size, Mode: "644",
		ModifiedAt: time.Unix(0, 0)}
}

func (g fakeGuest) ReadFile(ctx context.Context, p string) (*guest.FileEntry, io.ReadCloser, error) {
	m, owner, id := g.m, g.owner, g.id
	if _, err := m.Get(ctx, owner, id); err != nil {
		return nil, nil, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	data, ok := m.files[id+"\x00"+p]
	if !ok {
		return nil, nil, errdefs.New(errdefs.ErrNotFound, "file_not_found", "%s: no such file", p)
	}
	return m.entry(p, int64(len(data))), io.NopCloser(bytes.NewReader(data)), nil
}

func (g fakeGuest) WriteFile(ctx context.Context, p string, mode uint32, size int64, r io.Reader) (*guest.FileEntry, error) {
	m, owner, id := g.m, g.owner, g.id
	if _, err := m.Get(ctx, owner, id); err != nil {
		return nil, err
	}
	data, err := io.ReadAll(r)
	if err != nil {
		return nil, err
	}
	if int64(len(data)) != size {
		return nil, errors.New("size mismatch")
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.files[id+"\x00"+p] = data
	m.lastMode = mode
	return m.entry(p, size), nil
}

func (g fakeGuest) List(ctx context.Context, req guest.FileRequest) ([]guest.FileEntry, error) {
	m, owner, id := g.m, g.owner, g.id
	if _, err := m.Get(ctx, owner, id); err != nil {
		return nil, err
	}
	return []guest.FileEntry{*m.entry(req.Path+"/a", 1)}, nil
}

func (g fakeGuest) Stat(ctx context.Context, p string) (*guest.FileEntry, error) {
	m, owner, id := g.m, g.owner, g.id
	if _, err := m.Get(ctx, owner, id); err != nil {
		return nil, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	data, ok := m.files[id+"\x00"+p]
	if !ok {
		return nil, fmt.Errorf("stat %s: %w", p, errdefs.ErrNotFound) // a bare class, as the interface allows
	}
	return m.entry(p, int64(len(data))), nil
}

func (g fakeGuest) Mkdir(ctx context.Context, p string, parents bool) (*guest.FileEntry, error) {
	m, owner, id := g.m, g.owner, g.id
	if _, err := m.Get(ctx, owner, id); err != nil {
		return nil, err
	}
	e := m.entry(p, 0)
	e.Type = "directory"
	return e, nil
}

func (g fakeGuest) Remove(ctx context.Context, p string, recursive bool) (bool, error) {
	m, owner, id := g.m, g.owner, g.id
	if _, err := m.Get(ctx, owner, id); err != nil {
		return false, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	_, ok := m.files[id+"\x00"+p]
	delete(m.files, id+"\x00"+p)
	return ok, nil
}

func (g fakeGuest) Chmod(ctx context.Context, p string, mode uint32) (*guest.FileEntry, error) {
	m, owner, id := g.m, g.owner, g.id
	if _, err := m.Get(ctx, owner, id); err != nil {
		return nil, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.lastChmod = fmt.Sprintf("%s %o", p, mode)
	if m.chmodErr != nil {
		return nil, m.chmodErr
	}
	data, ok := m.files[id+"\x00"+p]
	if !ok {
		return nil, errdefs.New(errdefs.ErrNotFound, "file_not_found", "%s: no such file or directory", p)
	}
	e := m.entry(p, int64(len(data)))
	e.Mode = fmt.Sprintf("%o", mode)
	return e, nil
}

// fakeGuest is the guest of one of fakeManager's sandboxes.
type fakeGuest struct {
	m         *fakeManager
	owner, id string
}

// Guest refuses as the real manager does, from the same state table.
func (m *fakeManager) Guest(ctx context.Context, owner, id string) (*sandbox.Sandbox, guest.Handle, error) {
	sb, err := m.Get(ctx, owner, id)
	if err != nil {
		return nil, guest.Handle{}, err
	}
	if err := sandbox.Refusal(sb); err != nil {
		return nil, guest.Handle{}, err
	}
	g := fakeGuest{m: m, owner: owner, id: id}
	return sb, guest.Handle{ProcessRunner: g, FileSystem: g, Watcher: g, PortDialer: g, Volumes: g}, nil
}

// fakeKeys knows secrets "secret-a" (key_a), "secret-b" (key_b) and
// "secret-admin" (key_admin, an admin); "secret-revoked" and
// "secret-expired" are refused as the store refuses them.
type fakeKeys struct{}

func (fakeKeys) Authenticate(ctx context.Context, secret string) (Key, error) {
	switch secret {
	case "secret-a":
		return Key{ID: "key_a", Role: RoleTenant}, nil
	case "secret-b":
		return Key{ID: "key_b", Role: RoleTenant}, nil
	case "secret-admin":
		return Key{ID: "key_admin", Role: RoleAdmin}, nil
	case "secret-revoked":
		return Key{}, errdefs.New(errdefs.ErrNotFound, "key_revoked", "revoked")
	case "secret-expired":
		return Key{}, errdefs.New(errdefs.ErrNotFound, "key_expired", "expired")
	}
	return Key{}, fmt.Errorf("key: %w", errdefs.ErrNotFound)
}

func (fakeKeys) ListKeys(ctx context.Context) ([]KeyInfo, error) {
	t := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	return []KeyInfo{{ID: "key_admin", Name: "admin", Role: RoleAdmin, CreatedAt: t},
		{ID: "key_a", Name: "a", Role: RoleTenant, CreatedAt: t}, {ID: "key_b", Name: "b", Role: RoleTenant, CreatedAt: t}}, nil
}

// fakeIdem is an in-memory Idempotency store.
type fakeIdem struct {
	mu       sync.Mutex
	recs     map[string]*IdempotentResult
	released int
	maxBody  int // like the store's limit: larger answers are not kept; 0: no limit
}

func newFakeIdem() *fakeIdem { return &fakeIdem{recs: map[string]*IdempotentResult{}} }

func (f *fakeIdem) Reserve(ctx context.Context, keyID, key, fp string) (*IdempotentResult, bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if rec, ok := f.recs[keyID+"/"+key]; ok {
		c := *rec
		return &c, false, nil
	}
	f.recs[keyID+"/"+key] = &IdempotentResult{Fingerprint: fp}
	return nil, true, nil
}

func (f *fakeIdem) Complete(ctx context.Context, keyID, key string, status int, ct string, body []byte) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	rec := f.recs[keyID+"/"+key]
	rec.Status, rec.ContentType, rec.Body = status, ct, bytes.Clone(body)
	if f.maxBody > 0 && len(body) > f.maxBody {
		rec.Body, rec.Omitted = nil, int64(len(body))
	}
	return nil
}

func (f *fakeIdem) Release(ctx context.Context, keyID, key string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.recs, keyID+"/"+key)
	f.released++
	return nil
}

var errInternalSecret = fmt.Errorf("agent socket /run/secret broke: %w", errdefs.ErrInternal)

func errdefsConflict(code string) error {
	return errdefs.New(errdefs.ErrConflict, code, "refused: %s", code)
}

func (m *fakeManager) Pause(ctx context.Context, owner, id string) (*sandbox.Sandbox, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	sb, err := m.getLocked(owner, id)
	if err != nil {
		return nil, err
	}
	switch sb.State {
	case sandbox.StatePaused, sandbox.StatePausing:
	case sandbox.StateRunning:
		now := time.Date(2026, 11, 1, 13, 0, 0, 0, time.UTC)
		sb.State, sb.PausedAt, sb.ExpiresAt = sandbox.StatePausing, &now, nil
	default:
		return nil, sandbox.Refusal(sb)
	}
	return clone(sb), nil
}

func (m *fakeManager) Wake(ctx context.Context, owner, id string, timeout *int) (*sandbox.Sandbox, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	sb, err := m.getLocked(owner, id)
	if err != nil {
		return nil, err
	}
	switch sb.State {
	case sandbox.StatePaused:
		sb.State, sb.PausedAt = sandbox.StateResuming, nil
		if timeout != nil {
			sb.TimeoutSeconds = *timeout
		}
	case sandbox.StateRunning, sandbox.StateStarting:
		return nil, errdefsConflict("not_paused")
	default:
		return nil, sandbox.Refusal(sb)
	}
	return clone(sb), nil
}

func (m *fakeManager) SwitchImage(ctx context.Context, owner, id string, img *sandbox.ImageRef) (*sandbox.Sandbox, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	sb, err := m.getLocked(owner, id)
	if err != nil {
		return nil, err
	}
	sb.ImageID, sb.Rootfs = "", ""
	if img != nil {
		sb.ImageID, sb.Rootfs = img.ID, img.Rootfs
	}
	sb.State = sandbox.StateRunning
	return clone(sb), nil
}

func (m *fakeManager) Restart(ctx context.Context, owner, id string) (*sandbox.Sandbox, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	sb, err := m.getLocked(owner, id)
	if err != nil {
		return nil, err
	}
	if sb.State == sandbox.StateStopped {
		m.restarts++
		sb.State, sb.StopReason = sandbox.StateStarting, ""
	}
	return clone(sb), nil
}

func (m *fakeManager) Update(ctx context.Context, owner, id string, u sandbox.UpdateSpec) (*sandbox.Sandbox, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	sb, err := m.getLocked(owner, id)
	if err != nil {
		return nil, err
	}
	m.lastUpdate = u
	if u.Name != nil {
		sb.Name = *u.Name
	}
	if u.Labels != nil {
		sb.Labels = u.Labels
	}
	if u.AutoWake != nil {
		sb.AutoWake = *u.AutoWake
	}
	if u.IdlePauseSeconds != nil {
		sb.IdlePauseSeconds = *u.IdlePauseSeconds
	}
	if u.Persistent != nil {
		sb.Persistent = *u.Persistent
	}
	if u.TimeoutSeconds != nil {
		sb.TimeoutSeconds = *u.TimeoutSeconds
	}
	if u.OnLeaseEnd != nil {
		sb.OnLeaseEnd = *u.OnLeaseEnd
	}
	return clone(sb), nil
}

func (m *fakeManager) snapshotLocked(owner, id string) (*sandbox.Snapshot, error) {
	sn := m.snaps[id]
	if sn == nil || sn.OwnerKeyID != owner || sn.State == sandbox.SnapshotDeleted {
		return nil, &errdefs.CodedError{Class: errdefs.ErrNotFound, Code: "snapshot_not_found", Message: "no snapshot " + id}
	}
	return sn, nil
}

func (m *fakeManager) Snapshot(ctx context.Context, owner, id string, spec sandbox.SnapshotSpec) (*sandbox.Snapshot, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	sb, err := m.getLocked(owner, id)
	if err != nil {
		return nil, err
	}
	if sb.State != sandbox.StateRunning && sb.State != sandbox.StatePaused {
		return nil, sandbox.Refusal(sb)
	}
	if spec.Mode == "" {
		spec.Mode = sandbox.SnapshotModeMemory
	}
	m.n++
	now := time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC)
	sn := &sandbox.Snapshot{ID: fmt.Sprintf("snap_%d", m.n), OwnerKeyID: owner, Name: spec.Name, Labels: spec.Labels,
		SourceSandboxID: id, Mode: spec.Mode, State: sandbox.SnapshotReady, VCPU: sb.VCPU, MemoryMiB: sb.MemoryMiB,
		DiskMiB: sb.DiskMiB, RetentionDays: spec.RetentionDays, CreatedAt: now, ReadyAt: &now, SizeBytes: 1 << 20}
	m.snaps[sn.ID] = sn
	c := *sn
	return &c, nil
}

func (m *fakeManager) Fork(ctx context.Context, owner, id string, spec sandbox.ForkSpec) ([]*sandbox.Sandbox, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	src, err := m.getLocked(owner, id)
	if err != nil {
		return nil, err
	}
	m.lastFork = spec
	var out []*sandbox.Sandbox
	for i := range spec.Count {
		c := clone(src)
		c.ID, c.Name, c.Labels, c.SnapshotID = fmt.Sprintf("%s_copy%d", id, i+1), spec.Name, spec.Labels, "snap_fork"
		m.sandboxes[c.ID] = c
		out = append(out, clone(c))
	}
	return out, nil
}

func (m *fakeManager) GetSnapshot(ctx context.Context, owner, id string) (*sandbox.Snapshot, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	sn, err := m.snapshotLocked(owner, id)
	if err != nil {
		return nil, err
	}
	c := *sn
	return &c, nil
}

func (m *fakeManager) ListSnapshots(ctx context.Context, opts sandbox.SnapshotListOptions) ([]*sandbox.Snapshot, string, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []*sandbox.Snapshot
	for _, sn := range m.snaps {
		if sn.OwnerKeyID == opts.OwnerKeyID && sn.State != sandbox.SnapshotDeleted &&
			(opts.SourceSandboxID == "" || sn.SourceSandboxID == opts.SourceSandboxID) {
			c := *sn
			out = append(out, &c)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, "", nil
}

func (m *fakeManager) UpdateSnapshot(ctx context.Context, owner, id string, u sandbox.SnapshotUpdate) (*sandbox.Snapshot, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	sn, err := m.snapshotLocked(owner, id)
	if err != nil {
		return nil, err
	}
	if u.Name != nil {
		sn.Name = *u.Name
	}
	if u.Labels != nil {
		sn.Labels = u.Labels
	}
	c := *sn
	return &c, nil
}

func (m *fakeManager) DeleteSnapshot(ctx context.Context, owner, id string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	sn, err := m.snapshotLocked(owner, id)
	if err != nil {
		return err
	}
	sn.State = sandbox.SnapshotDeleted
	return nil
}

func (m *fakeManager) ExtendSnapshot(ctx context.Context, owner, id string, days int) (*sandbox.Snapshot, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	sn, err := m.snapshotLocked(owner, id)
	if err != nil {
		return nil, err
	}
	sn.RetentionDays = days
	c := *sn
	return &c, nil
}

// rolesOf returns the Manager whose every role is m.
func rolesOf(m *fakeManager) Manager {
	return Manager{Sandboxes: m, Power: m, Switcher: m, Snapshots: m, Usage: m, Guests: m, Checkpoints: m}
}
