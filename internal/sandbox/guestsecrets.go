package sandbox

import (
	"context"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/emberbox/emberbox/internal/errdefs"
	"github.com/emberbox/emberbox/internal/guest"
)

// GuestSecrets keeps what running guests hold for egress secrets: the
// placeholders in their environment (Config.SecretEnv) and the CAs they
// trust (Config.Trust), whose newest one the sandbox's gate signs with
// once the guest is known to hold it. Both are sent before a sandbox is
// reported running (a boot, a wake, a copy) and again whenever they
// change: a key's secrets, the egress CAs (a rotation, a retirement).
type GuestSecrets struct {
	envOf     func(owner, id string, labels map[string]string) map[string]string
	trust     func() string
	booted    string // the CAs a guest is configured with at boot (Config.ExtraCAs)
	records   Store
	instances func() []*instance
	log       *slog.Logger

	mu      sync.Mutex
	sent    map[string]string // by sandbox: the placeholders last sent, encoded
	trusted map[string]string // by sandbox: the CA bundle its guest holds, if known
	// sending serializes the sends to one sandbox, so that a later set
	// never arrives before an earlier one.
	sending map[string]*sync.Mutex
}

func newGuestSecrets(m *Manager) *GuestSecrets {
	return &GuestSecrets{envOf: m.cfg.SecretEnv, trust: m.cfg.Trust, booted: m.cfg.ExtraCAs,
		records: m.cfg.Store, instances: m.instances, log: m.log,
		sent: map[string]string{}, trusted: map[string]string{}, sending: map[string]*sync.Mutex{}}
}

// guestSecretsTimeout bounds one send to a guest.
const guestSecretsTimeout = 10 * time.Second

func (gs *GuestSecrets) active() bool { return gs != nil && (gs.envOf != nil || gs.trust != nil) }

// lock takes the send lock of sandbox id.
func (gs *GuestSecrets) lock(id string) func() {
	gs.mu.Lock()
	l := gs.sending[id]
	if l == nil {
		l = &sync.Mutex{}
		gs.sending[id] = l
	}
	gs.mu.Unlock()
	l.Lock()
	return l.Unlock
}

// push brings sandbox in's guest up to date.
func (gs *GuestSecrets) push(ctx context.Context, in *instance, sb *Sandbox) {
	if !gs.active() {
		return
	}
	defer gs.lock(sb.ID)()
	c := in.guest()
	if c == nil {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, guestSecretsTimeout)
	defer cancel()
	gs.pushTrust(ctx, in, c)
	gs.pushEnv(ctx, sb, c)
}

// pushEnv sends sb's placeholders if they changed since the last send.
// With none to send and none sent, nothing is sent: a copy or a guest
// from before a restart may still hold placeholders of another moment,
// but a placeholder is worth something only to a sandbox its secret
// reaches now (the swap checks), so an empty set costs a wake or a copy
// no round trip. A guest whose agent predates placeholders is left as it
// is.
func (gs *GuestSecrets) pushEnv(ctx context.Context, sb *Sandbox, c *guest.Client) {
	if gs.envOf == nil {
		return
	}
	// Read under the send lock: what is sent is what holds now.
	env := gs.envOf(sb.OwnerKeyID, sb.ID, sb.Labels)
	enc := encodeEnv(env)
	gs.mu.Lock()
	prev, known := gs.sent[sb.ID]
	gs.mu.Unlock()
	if (known && prev == enc) || (!known && len(env) == 0) {
		return
	}
	if err := c.SetSecretEnv(ctx, env); err != nil {
		if errdefs.Code(err) != "unknown_method" {
			gs.log.Warn("sending egress secrets' placeholders", "sandbox_id", sb.ID, "err", err)
		}
		return
	}
	gs.mu.Lock()
	gs.sent[sb.ID] = enc
	gs.mu.Unlock()
}

// pushTrust sends the CAs in force to a guest not known to hold them. A
// guest whose agent predates trust.set keeps what it was configured with,
// and its gate signs with the oldest CA in force.
func (gs *GuestSecrets) pushTrust(ctx context.Context, in *instance, c *guest.Client) {
	id := in.id
	if gs.trust == nil {
		return
	}
	bundle := gs.trust()
	gs.mu.Lock()
	held, known := gs.trusted[id]
	gs.mu.Unlock()
	if known {
		// A gate made since (a wake's) learns what its guest holds.
		if g := in.egressGate(); g != nil {
			g.SetTrusted(held)
		}
		if held == bundle {
			return
		}
	}
	if err := c.SetTrust(ctx, bundle); err != nil {
		if errdefs.Code(err) != "unknown_method" {
			gs.log.Warn("sending the egress CAs", "sandbox_id", id, "err", err)
		}
		return
	}
	gs.holds(in, bundle)
}

// holds records that in's guest trusts bundle, and tells its gate.
func (gs *GuestSecrets) holds(in *instance, bundle string) {
	if gs == nil || gs.trust == nil {
		return
	}
	gs.mu.Lock()
	gs.trusted[in.id] = bundle
	gs.mu.Unlock()
	if g := in.egressGate(); g != nil {
		g.SetTrusted(bundle)
	}
}

// bootedWith records that in's guest was just configured with the CAs of a
// boot (Config.ExtraCAs), as a cold boot and a copy of the template are.
func (gs *GuestSecrets) bootedWith(in *instance) { gs.holds(in, gs.booted) }

// pushRecord is push for an instance whose record is read here.
func (gs *GuestSecrets) pushRecord(ctx context.Context, in *instance) {
	if !gs.active() {
		return
	}
	sb, err := gs.records.GetSandbox(ctx, in.id)
	if err != nil {
		return
	}
	gs.push(ctx, in, sb)
}

// Apply brings the running sandboxes of owners (nil: every key) up to
// date: their secrets, or the egress CAs, changed.
func (gs *GuestSecrets) Apply(ctx context.Context, owners []string) {
	if !gs.active() {
		return
	}
	for _, in := range gs.instances() {
		sb, err := gs.records.GetSandbox(ctx, in.id)
		if err != nil || sb.State != StateRunning || (owners != nil && !slices.Contains(owners, sb.OwnerKeyID)) {
			continue
		}
		gs.push(ctx, in, sb)
	}
}

// Trusted returns, for each running sandbox, the CA bundle its guest is
// known to trust ("" if nothing is known).
func (gs *GuestSecrets) Trusted(ctx context.Context) []string {
	if gs == nil {
		return nil
	}
	var out []string
	for _, in := range gs.instances() {
		sb, err := gs.records.GetSandbox(ctx, in.id)
		if err != nil || sb.State != StateRunning {
			continue
		}
		gs.mu.Lock()
		out = append(out, gs.trusted[in.id])
		gs.mu.Unlock()
	}
	return out
}

// forget drops what was sent to sandbox id: its next guest (a wake of a
// stopped VM, a restart) starts with none.
func (gs *GuestSecrets) forget(id string) {
	if gs == nil {
		return
	}
	gs.mu.Lock()
	delete(gs.sent, id)
	delete(gs.trusted, id)
	delete(gs.sending, id)
	gs.mu.Unlock()
}

func encodeEnv(env map[string]string) string {
	var b strings.Builder
	for _, k := range slices.Sorted(maps.Keys(env)) {
		b.WriteString(k)
		b.WriteByte('=')
		b.WriteString(env[k])
		b.WriteByte(0)
	}
	return b.String()
}
