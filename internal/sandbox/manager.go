package sandbox

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/emberbox/emberbox/internal/admission"
	"github.com/emberbox/emberbox/internal/egress"
	"github.com/emberbox/emberbox/internal/errdefs"
	"github.com/emberbox/emberbox/internal/faultpoint"
	"github.com/emberbox/emberbox/internal/guest"
	"github.com/emberbox/emberbox/internal/pricing"
	"github.com/emberbox/emberbox/internal/vmm"
)

// Store is what the manager needs from durable storage.
type Store interface {
	// InsertSandbox records a new sandbox and, in the same transaction,
	// links it to the pending idempotencyKey record of its owner, if any,
	// and appends entries to its trail.
	InsertSandbox(ctx context.Context, sb *Sandbox, idempotencyKey string, entries ...*TrailEntry) error
	GetSandbox(ctx context.Context, id string) (*Sandbox, error)
	// UpdateSandbox applies fn to the committed record and writes it back
	// as one atomic step (see store.Store.UpdateSandbox); fn must not block.
	// When it writes, it appends entries (read after fn returns) to the
	// sandbox's trail in the same step.
	UpdateSandbox(ctx context.Context, id string, fn func(sb *Sandbox) bool, entries ...*TrailEntry) (*Sandbox, error)
	ListSandboxes(ctx context.Context, opts ListOptions) ([]*Sandbox, string, error)
	ListLive(ctx context.Context) ([]*Sandbox, error)
	AppendEvent(ctx context.Context, sandboxID, typ, message string, data map[string]any) error
	GetNetwork(ctx context.Context, sandboxID string) (*Network, error)
	PutNetwork(ctx context.Context, sandboxID string, n *Network) error
}

// TrailEntry is an entry of a sandbox's trail (its events) that is
// written with the change it reports (Store.UpdateSandbox), so that a
// client that sees the change also finds its event.
type TrailEntry struct {
	Type, Message string
	Data          map[string]any
}

// BootFiles are the image files every VM boots from.
type BootFiles struct {
	Kernel, Initrd, Rootfs string
	// Layer is the computer-use layer every VM gets read-only; "" none.
	Layer string
}

// Config configures a Manager.
type Config struct {
	Store   Store
	Driver  vmm.Driver
	Boot    BootFiles
	DataDir string // sandboxes live in DataDir/sandboxes/<id>
	Logger  *slog.Logger
	// BootTimeout bounds one boot attempt, from starting the VM to the
	// agent answering. A create makes at most two attempts.
	BootTimeout time.Duration
	// Now is the clock; tests replace it.
	Now func() time.Time
	// Egress is the operator's egress configuration; nil means a default
	// one (nothing private opened, the host's resolver).
	Egress *egress.Operator
	// EgressDefault is the policy of sandboxes created without one.
	EgressDefault egress.Policy
	// ExtraCAs is a PEM bundle every guest trusts besides its own roots,
	// as it is configured at boot (and built into the template).
	ExtraCAs string
	// Trust, if set, is the bundle guests are to trust now, in place of
	// ExtraCAs: the egress CAs change with a rotation. Running guests are
	// sent it (Secrets.Apply) and gates sign with the newest egress CA
	// their guest is known to hold.
	Trust func() string
	// SecretEnv, if set, says which egress secrets' placeholders a
	// sandbox of owner has in its environment (variable to placeholder).
	SecretEnv func(owner, id string, labels map[string]string) map[string]string
	// Swapper, if set, makes the egress secrets' side of sandbox id's gate;
	// event records a use or refusal of a secret on the sandbox.
	Swapper func(id string, event func(typ, msg string, data map[string]any)) egress.Swapper
	// Admission holds what each sandbox was promised, from its create
	// until it is stopped or deleted, and refuses creates it has no room
	// for; nil admits everything.
	Admission *admission.Ledger
	// Limits bound the size and the lifetime of one sandbox.
	Limits Limits
	// MemoryFloorMiB, if positive, is the host memory available (the
	// kernel's MemAvailable) below which the server pauses the running
	// sandbox idle longest, one a second, until there is more
	// (pressure.go). MemAvailable reads it; nil reads /proc/meminfo.
	MemoryFloorMiB int64
	MemAvailable   func() (int64, error)
	// DiskFloorMiB, if positive, is the free space of the data dir's
	// filesystem below which the server pauses every running sandbox
	// whose files are growing (diskpressure.go). DiskFree reads it; nil
	// reads the data dir's filesystem.
	DiskFloorMiB int64
	DiskFree     func() (int64, error)
	// Templates turns on fast creates from templates (templates.go): the
	// default image's, and custom images' made at their first create.
	Templates bool
	// ImageTemplates caps how many custom images' templates are kept (the
	// least recently used one no sandbox uses goes first); 0 means
	// DefaultImageTemplates, < 0 none (custom images' creates boot).
	ImageTemplates int
	// Meter keeps usage (meter.go); store.Store implements it.
	Meter MeterStore
	// Volumes attaches volumes (internal/volumes); nil refuses creates
	// that ask for them.
	Volumes Volumes
	// MeterInterval is how often running sandboxes are read; 0 means
	// DefaultMeterInterval.
	MeterInterval time.Duration
	// Observer is told of lifecycle outcomes, for monitoring; nil tells
	// no one.
	Observer Observer
	// Rates price the usage; the zero value means pricing.DefaultRates.
	Rates pricing.Rates
	// Preparers run, in order, on every sandbox whose agent first answers
	// (prepare.go), before it is running.
	Preparers []Preparer
	// StoppedDiskRetention is how long a stopped sandbox keeps its disk
	// (RunDiskRetention); 0 means DefaultStoppedDiskRetention, < 0 forever.
	StoppedDiskRetention time.Duration
	// Checkpoints bounds the checkpoints of sandboxes (checkpoints.go);
	// zero fields take their defaults.
	Checkpoints CheckpointLimits
	// Copied, if set, is told of each sandbox made from a memory snapshot
	// of another (a fork's copy, a checkpoint's branch), as it is
	// created: what keeps state about a sandbox's processes beside the
	// manager (the interpreter's contexts) carries it over.
	Copied func(src, dst string)
	// FetchSnapshot, in a cluster, writes the files of a snapshot another
	// node holds into an empty directory here, so that a sandbox placed
	// here can be a copy of it (snapshotfetch.go). Nil: copies are made
	// only where their snapshot is.
	FetchSnapshot SnapshotFetcher
}

// reconnectWait is how long a call waits for a running sandbox's guest
// connection to come back before answering guest_busy.
const reconnectWait = 15 * time.Second

// A reconnect to a running guest tries for reconnectTry, then again after
// reconnectPause. The tries are short because a fresh connection can be
// lost: the agent's previous session may still be reading the port when
// the new Hello arrives, take it for its own traffic and end, so that Hello
// is never answered; the agent then waits for the next one.
const (
	reconnectTry   = 5 * time.Second
	reconnectPause = time.Second
)

// Manager owns every sandbox's lifecycle.
type Manager struct {
	cfg Config
	log *slog.Logger

	// closing is set by Close: a boot interrupted by it leaves its VM
	// running for the next server process to resume, as after a crash.
	closing atomic.Bool

	// ctx is the base of every goroutine the manager starts; Close cancels
	// it and waits for wg.
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu     sync.Mutex
	closed bool                 // no goroutine starts once set
	live   map[string]*instance // sandboxes with a VM (starting, running, stopping)
	ops    map[string]*opLock   // per sandbox whose VM is being changed (pause.go)

	waiters  *waiters     // WaitFor's
	envs     *envMemory   // env values per sandbox, memory only (lifecycle.go)
	files    sandboxFiles // files.go
	outcomes outcomes     // observe.go
	volumes  volumeHooks  // volumes.go
	gates    *gates       // the per-VM egress gates; network.go
	conduct  conduct      // guestsafety.go
	link     guestLink    // boot.go
	calls    guestCalls   // guest.go

	// The collaborators that serve callers beside the state machine; New
	// sets them and nothing replaces them.
	Meter       *Meter        // observes transitions to charge usage (meter.go)
	Previews    *Previews     // previews.go
	Moves       *Moves        // move.go, fence.go
	Snapshots   *Snapshots    // snapshots.go
	Checkpoints *Checkpoints  // checkpoints.go
	Reaper      *Reaper       // lease.go, pressure.go, retention.go
	Secrets     *GuestSecrets // guestsecrets.go: egress secrets' placeholders and CAs in guests
	Switcher    *Switcher     // switch.go
	Networks    *Networks     // network.go
	Templates   *Templates    // templates.go

	// Test hooks (export_test.go): testHookBeforeUpdate runs as an update
	// begins; testHookUpdate inside every update that changes something,
	// between its read and its write.
	testHookBeforeUpdate atomic.Pointer[func(id string)]
	testHookUpdate       atomic.Pointer[func(id string, sb *Sandbox)]
}

// instance is a sandbox whose VM this process manages.
type instance struct {
	id       string
	ctx      context.Context    // ends when the sandbox is being stopped
	cancel   context.CancelFunc // ends boot and watch loops
	bootDone chan struct{}      // closed when booting (or resuming a boot) has returned

	mu      sync.Mutex
	machine vmm.Machine
	client  *guest.Client

	gate *egress.Gate // the sandbox's egress; set before the VM starts

	safety guestSafety // what the guest did wrong; guestsafety.go

	active atomic.Int64 // unix nanoseconds (of m.now) of the last API call to it, for idle pause
	// busy counts the API calls into the guest still in flight (an exec,
	// an attached process, a terminal, a tunnel, a transfer, a watch): a
	// sandbox with work under way is never idle (hold).
	busy atomic.Int64

	// guestCPU is the guest's busy time as it last reported it (ns);
	// egressOut and egressIn the gate's totals once it is closed.
	guestCPU, egressOut, egressIn atomic.Int64
	// oomSeen is one more than the guest's count of OOM kills at its
	// last reading; 0 before the first, which is the baseline.
	oomSeen atomic.Int64
	// oomScored is the VM whose OOM score was last set, and oomScore
	// that score (oomrank.go): a new VM (a wake, a restart) is scored
	// afresh. Guarded by mu.
	oomScored vmm.Machine
	oomScore  int

	// steps times the phases of this instance's way to running
	// (timeline.go); nil for an instance that was never started here.
	steps *timeline

	// saving is held while the guest is detached for a memory snapshot:
	// the watcher reconnects only once the snapshot is taken, so that the
	// saved agent waits for a Hello (detach.go).
	saving   sync.Mutex
	detached atomic.Bool // the session's end was asked for by the host
}

// newInstance returns the instance of sandbox id, whose context ends with
// parent's.
func newInstance(parent context.Context, id string) *instance {
	ctx, cancel := context.WithCancel(parent)
	return &instance{id: id, ctx: ctx, cancel: cancel, bootDone: make(chan struct{})}
}

// vm is the instance's machine; nil while it boots.
func (in *instance) vm() vmm.Machine {
	in.mu.Lock()
	defer in.mu.Unlock()
	return in.machine
}

// instances is a copy of the live instances, to range over without m.mu.
func (m *Manager) instances() []*instance {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Collect(maps.Values(m.live))
}

func (in *instance) guest() *guest.Client {
	in.mu.Lock()
	defer in.mu.Unlock()
	return in.client
}

// New returns a Manager. Call Recover before serving requests and
// Reaper.Run to enforce leases.
func New(cfg Config) *Manager {
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Egress == nil {
		cfg.Egress = egress.NewOperator(egress.Operator{})
	}
	if cfg.BootTimeout == 0 {
		cfg.BootTimeout = 90 * time.Second
	}
	if cfg.Admission == nil {
		cfg.Admission = admission.New(admission.Config{})
	}
	if cfg.Observer == nil {
		cfg.Observer = noObserver{}
	}
	if cfg.Rates == (pricing.Rates{}) {
		cfg.Rates = pricing.DefaultRates()
	}
	if cfg.Meter == nil {
		if ms, ok := cfg.Store.(MeterStore); ok {
			cfg.Meter = ms
		} else {
			panic("sandbox.New: Config.Meter is required when the Store does not meter")
		}
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	ctx, cancel := context.WithCancel(context.Background())
	m := &Manager{cfg: cfg, log: log, ctx: ctx, cancel: cancel, files: sandboxFiles{dataDir: cfg.DataDir, boot: cfg.Boot},
		live: map[string]*instance{}, ops: map[string]*opLock{},
		waiters: &waiters{changed: map[string]chan struct{}{}}, envs: &envMemory{envs: map[string]map[string]string{}}}
	m.outcomes = outcomes{obs: cfg.Observer}
	m.volumes = volumeHooks{vols: cfg.Volumes, log: log}
	m.gates = &gates{host: m, egress: cfg.Egress, egressDefault: cfg.EgressDefault, records: cfg.Store,
		obs: cfg.Observer, vols: cfg.Volumes, swapper: cfg.Swapper, log: log}
	m.conduct = conduct{host: m, log: log}
	m.link = guestLink{conduct: m.conduct, gates: m.gates}
	m.calls = guestCalls{host: m, records: cfg.Store, bootTimeout: cfg.BootTimeout}
	m.Meter = newMeter(m)
	m.Previews = &Previews{host: m, records: cfg.Store}
	m.Snapshots = newSnapshots(m)
	m.Moves = newMoves(m)
	m.calls.moving = m.Moves.moving
	m.Checkpoints = newCheckpoints(m)
	m.Reaper = newReaper(m)
	m.Secrets = newGuestSecrets(m)
	m.Switcher = &Switcher{host: m, volumes: cfg.Volumes, bootTimeout: cfg.BootTimeout, outcomes: m.outcomes, envs: m.envs}
	m.Networks = &Networks{host: m, records: cfg.Store, egress: cfg.Egress, egressDefault: cfg.EgressDefault}
	m.Templates = newTemplates(ctx, &m.cfg, log, m.spawn, m.bootGuest)
	return m
}

// spawn runs f in a goroutine the manager owns: Close waits for it. After
// Close nothing new starts, and spawn reports false.
func (m *Manager) spawn(f func()) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return false
	}
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		f()
	}()
	return true
}

func (m *Manager) now() time.Time { return m.cfg.Now().UTC().Truncate(time.Millisecond) }

// waiters wakes those who wait for a sandbox to change (WaitFor).
type waiters struct {
	mu      sync.Mutex
	changed map[string]chan struct{} // per sandbox, closed when it changes; only while someone waits
}

// notify wakes the waiters of sandbox id.
func (w *waiters) notify(id string) {
	w.mu.Lock()
	if ch, ok := w.changed[id]; ok {
		close(ch)
		delete(w.changed, id)
	}
	w.mu.Unlock()
}

// changes returns a channel closed at the next change of sandbox id.
func (w *waiters) changes(id string) <-chan struct{} {
	w.mu.Lock()
	defer w.mu.Unlock()
	ch, ok := w.changed[id]
	if !ok {
		ch = make(chan struct{})
		w.changed[id] = ch
	}
	return ch
}

func notFound(id string) error {
	return errdefs.New(errdefs.ErrNotFound, "not_found", "no sandbox %q", id)
}

// get loads a sandbox and checks its owner.
func (m *Manager) get(ctx context.Context, owner, id string) (*Sandbox, error) {
	sb, err := m.cfg.Store.GetSandbox(ctx, id)
	if errdefs.IsNotFound(err) || (err == nil && sb.OwnerKeyID != owner) {
		return nil, notFound(id)
	}
	return sb, err
}

// update applies fn to the stored record and saves it, atomically: fn sees
// the committed record and no other change comes between its read and the
// write. Every transition goes through here, so the store always holds the
// truth and two transitions never interleave. The entries, which fn may
// fill in, are the change's events: they commit with it (D23), so whoever
// is woken by the change finds them.
func (m *Manager) update(ctx context.Context, id string, fn func(sb *Sandbox) bool, entries ...*TrailEntry) (*Sandbox, error) {
	if h := m.testHookBeforeUpdate.Load(); h != nil {
		(*h)(id)
	}
	changed, entered := false, false
	sb, err := m.cfg.Store.UpdateSandbox(ctx, id, func(sb *Sandbox) bool {
		before := sb.State
		changed = fn(sb)
		entered = changed && sb.State != before
		if h := m.testHookUpdate.Load(); changed && h != nil {
			(*h)(id, sb)
		}
		return changed
	}, entries...)
	if err != nil {
		return nil, fmt.Errorf("saving sandbox %s: %w", id, err)
	}
	// The ledger first: a waiter woken by the change may create at once.
	account(m.cfg.Admission, sb, entered)
	if changed {
		m.waiters.notify(id)
	}
	return sb, nil
}

func (m *Manager) event(id, typ, msg string, data map[string]any) {
	if err := m.cfg.Store.AppendEvent(context.Background(), id, typ, msg, data); err != nil {
		m.log.Warn("recording event", "sandbox_id", id, "err", err)
	}
}

// watch follows a running sandbox: if its VM exits on its own the sandbox
// is stopped; if only the guest connection drops, it reconnects, backing off
// while attempts fail or sessions end right after their handshake.
func (m *Manager) watch(in *instance) {
	in.mu.Lock()
	mach, c := in.machine, in.client
	in.mu.Unlock()
	if sb, err := m.cfg.Store.GetSandbox(in.ctx, in.id); err == nil && sb.State == StateRunning {
		m.Meter.vmRunning(in, mach, sb)
	}
	var failures int    // attempts in a row that failed or did not last
	var since time.Time // when the session in c began (zero: at boot)
	for {
		if c == nil {
			in.saving.Lock()
			ctx, cancel := context.WithTimeout(in.ctx, reconnectTry)
			nc, err := m.link.connect(ctx, in, mach, nil)
			cancel()
			in.saving.Unlock()
			if err == nil {
				in.mu.Lock()
				in.client = nc
				in.mu.Unlock()
				c, since = nc, time.Now()
			} else {
				failures++
				m.conduct.warn(in, "connecting to guest", "err", err, "attempt", failures)
			}
		}
		var cdone <-chan struct{}
		var retry <-chan time.Time
		if c != nil {
			cdone = c.Done()
		} else {
			retry = time.After(max(reconnectPause, backoff(failures)))
		}
		select {
		case <-in.ctx.Done():
			return // a stop or delete owns the rest
		case <-mach.Done():
			if c != nil {
				c.Close()
			}
			if in.ctx.Err() != nil {
				return // ended by a stop, delete or pause, which records it
			}
			m.Meter.vmEnded(in, mach)
			m.finish(in, ReasonVMExited)
			return
		case <-cdone:
			in.mu.Lock()
			in.client = nil
			in.mu.Unlock()
			c = nil
			if in.detached.Swap(false) {
				continue // the host detached it for a snapshot
			}
			if !since.IsZero() && time.Since(since) < minSessionLife {
				// The VM may be exiting; if not, this guest drops its
				// sessions on purpose.
				select {
				case <-mach.Done():
					continue
				case <-time.After(100 * time.Millisecond):
				}
				failures++
				m.conduct.violation(in, guest.Violation{Method: "session", Problem: "ended right after the handshake"})
				m.conduct.warn(in, "guest connection lost right after the handshake; reconnecting", "attempt", failures)
				select {
				case <-in.ctx.Done():
				case <-time.After(backoff(failures)):
				}
				continue
			}
			failures = 0
			m.conduct.warn(in, "guest connection lost; reconnecting")
		case <-retry:
		}
	}
}

// finish records that a sandbox's VM has ended, unless a stop or delete got
// there first, and forgets the instance.
func (m *Manager) finish(in *instance, reason string) {
	m.gates.close(in)
	m.Secrets.forget(in.id)
	m.mu.Lock()
	if m.live[in.id] == in {
		delete(m.live, in.id)
	}
	m.mu.Unlock()
	m.markStopped(in.id, reason)
}

// markStopped records that a sandbox's VM has ended, with reason unless a
// stop under way already gave its own, and records one "stopped" event.
func (m *Manager) markStopped(id, reason string) {
	now := m.now()
	changed := false
	stopped := &TrailEntry{Type: "stopped", Message: "sandbox stopped"}
	_, err := m.update(context.Background(), id, func(s *Sandbox) bool {
		if s.State.Terminal() || s.State == StateDeleting {
			return false // a delete under way records the end itself
		}
		if s.State != StateStopping || s.StopReason == "" {
			s.StopReason = reason
		}
		s.State, s.EndedAt = StateStopped, &now
		stopped.Data, changed = map[string]any{"reason": s.StopReason}, true
		return true
	}, stopped)
	if err != nil {
		m.log.Error("recording stopped sandbox", "sandbox_id", id, "err", err)
	}
	if changed {
		m.volumes.release(id)
	}
}

// Close lets go of every sandbox without stopping it: watchers and boots
// end and guest connections close, while the VMs keep running for the next
// process of the server to reattach (see Recover). It returns once every
// goroutine the manager started has ended.
func (m *Manager) Close() {
	m.closing.Store(true)
	m.mu.Lock()
	m.closed = true
	live := m.live
	m.live = map[string]*instance{}
	m.mu.Unlock()
	m.cancel()
	for _, in := range live {
		in.cancel()
		m.gates.close(in)
		if c := in.guest(); c != nil {
			c.Close()
		}
	}
	m.wg.Wait()
}

// Get implements api.Manager.Get. A deleted sandbox is not found, as the
// SDKs expect after a delete.
func (m *Manager) Get(ctx context.Context, owner, id string) (*Sandbox, error) {
	sb, err := m.get(ctx, owner, id)
	if err == nil && sb.State == StateDeleted {
		return nil, notFound(id)
	}
	return sb, err
}

// List implements api.Manager.List.
func (m *Manager) List(ctx context.Context, opts ListOptions) ([]*Sandbox, string, error) {
	if opts.OwnerKeyID == "" && !opts.AllOwners {
		// Every caller is a key; an unscoped listing would show everyone's
		// unless asked for (an admin key's).
		return nil, "", errdefs.New(errdefs.ErrInternal, "internal", "listing sandboxes without an owner")
	}
	return m.cfg.Store.ListSandboxes(ctx, opts)
}

// WaitFor implements api.Manager.WaitFor.
func (m *Manager) WaitFor(ctx context.Context, owner, id string, states ...State) (*Sandbox, error) {
	for {
		ch := m.waiters.changes(id)
		sb, err := m.get(ctx, owner, id)
		if err != nil {
			return nil, err
		}
		if slices.Contains(states, sb.State) || sb.State == StateDeleted ||
			(sb.State == StateStopped && !slices.Contains(states, StateDeleted)) {
			return sb, nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return sb, nil
		}
	}
}

// Stop implements api.Manager.Stop.
func (m *Manager) Stop(ctx context.Context, owner, id string) (_ *Sandbox, err error) {
	defer func() { m.outcomes.op("stop", err) }()
	if _, err := m.get(ctx, owner, id); err != nil {
		return nil, err
	}
	return m.stop(ctx, id, ReasonRequested, false)
}

// stop moves a sandbox to stopping and ends its VM in the background (or,
// with wait, before returning).
func (m *Manager) stop(ctx context.Context, id, reason string, wait bool) (*Sandbox, error) {
	sb, err := m.update(ctx, id, func(s *Sandbox) bool {
		if s.State.Terminal() || s.State == StateStopping || s.State == StateDeleting {
			return false
		}
		s.State, s.StopReason = StateStopping, reason
		return true
	})
	if err != nil || sb.State != StateStopping {
		return sb, err // already stopped, or being deleted: that path ends the VM
	}
	done := make(chan struct{})
	if !m.spawn(func() {
		defer close(done)
		m.endVM(id)
		m.markStopped(id, reason)
	}) {
		// Shutting down: the record says stopping, and the next start
		// finishes the stop (Recover).
		return sb, nil
	}
	if wait {
		select {
		case <-done:
		case <-ctx.Done():
		}
		return m.cfg.Store.GetSandbox(context.Background(), id)
	}
	return sb, nil
}

// endVM ends the VM of sandbox id if this process runs one, and forgets
// it: a boot in progress is cancelled first, then the guest connection, the
// egress gate and the VM itself go. It returns once the VM has exited (or
// its stop failed, which is logged).
func (m *Manager) endVM(id string) {
	unlock := m.lockOp(id) // a pause or wake under way finishes first
	defer unlock()
	m.mu.Lock()
	in := m.live[id]
	m.mu.Unlock()
	if in == nil {
		return
	}
	in.cancel()
	// A boot in progress returns promptly once cancelled; only then is
	// in.machine the VM to stop (or nil, already stopped).
	<-in.bootDone
	in.mu.Lock()
	mach, c := in.machine, in.client
	in.mu.Unlock()
	if c != nil {
		m.Meter.guestClosing(in) // the guest's last word on its busy time
		m.volumes.sync(id, c)
		c.Close()
	}
	m.gates.close(in)
	m.Secrets.forget(id)
	if mach != nil {
		sctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		if err := mach.Stop(sctx); err != nil {
			m.log.Error("stopping vm", "sandbox_id", id, "err", err)
		}
		cancel()
		m.Meter.vmEnded(in, mach)
	}
	m.mu.Lock()
	if m.live[id] == in {
		delete(m.live, id)
	}
	m.mu.Unlock()
}

// Delete implements api.Manager.Delete.
func (m *Manager) Delete(ctx context.Context, owner, id string) (_ *Sandbox, err error) {
	defer func() { m.outcomes.op("delete", err) }()
	sb, err := m.get(ctx, owner, id)
	if err != nil {
		return nil, err
	}
	if sb.State == StateDeleted {
		return sb, nil
	}
	return m.delete(ctx, id, ReasonDeleted)
}

// delete records the sandbox as deleting before it removes anything, so
// that a crash at any later step is finished by the next start (Recover),
// then ends its VM, removes its files and records it deleted.
func (m *Manager) delete(ctx context.Context, id, reason string) (*Sandbox, error) {
	if kept, err := m.cfg.Store.GetSandbox(ctx, id); err == nil {
		m.Meter.accrueKept(ctx, kept, m.now()) // a paused or stopped one's disk, up to its end
	}
	sb, err := m.update(ctx, id, func(s *Sandbox) bool {
		if s.State == StateDeleted || s.State == StateDeleting {
			return false
		}
		if !s.State.Terminal() && s.State != StateStopping {
			s.StopReason = reason // it was running: this delete ends it
		}
		s.State = StateDeleting
		return true
	})
	if err != nil {
		return nil, err
	}
	if sb.State == StateDeleted {
		return sb, nil
	}
	faultpoint.Hit("delete.recorded")
	return m.finishDelete(context.WithoutCancel(ctx), id)
}

// finishDelete ends the VM and removes the files of a sandbox recorded as
// deleting, and records it deleted. It is safe to repeat: two deletes at
// once, or a restart part-way, end the same way.
func (m *Manager) finishDelete(ctx context.Context, id string) (*Sandbox, error) {
	m.endVM(id)
	faultpoint.Hit("delete.vm_ended")
	if err := removeAll(m.files.dir(id)); err != nil {
		// The record stays deleting, and the next start tries again.
		return nil, fmt.Errorf("removing the files of sandbox %s: %w", id, err)
	}
	faultpoint.Hit("delete.files_removed")
	m.Snapshots.dropCheckpoints(ctx, id)
	m.envs.remember(id, nil)
	m.volumes.release(id)
	if ps, ok := m.cfg.Store.(PreviewStore); ok {
		// Its URLs are refused already (OpenPreview); this drops the rows.
		if err := ps.DeletePreviews(ctx, id, 0); err != nil {
			m.log.Warn("removing the previews of a deleted sandbox", "sandbox_id", id, "err", err)
		}
	}
	now := m.now()
	changed := false
	deleted := &TrailEntry{Type: "deleted", Message: "sandbox deleted"}
	sb, err := m.update(ctx, id, func(s *Sandbox) bool {
		if s.State == StateDeleted {
			return false
		}
		s.State, s.DeletedAt, s.VM = StateDeleted, &now, nil
		if s.EndedAt == nil {
			s.EndedAt = &now
		}
		deleted.Data, changed = map[string]any{"reason": s.StopReason}, true
		return true
	}, deleted)
	if changed {
		if sb.SnapshotID != "" {
			m.Snapshots.RemoveUnusedSnapshots(ctx)                    // it may have been the last user of a deleted snapshot
			m.Snapshots.removeElsewhere(ctx, []string{sb.SnapshotID}) // or of one fetched from another node
		}
	}
	return sb, err
}

// removeAll removes dir, trying again a few times: a file can appear while
// it is being emptied (a late log line of a VM that has just ended), which
// makes the final rmdir fail with ENOTEMPTY.
func removeAll(dir string) error {
	var err error
	for range 5 {
		if err = os.RemoveAll(dir); err == nil {
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return err
}
