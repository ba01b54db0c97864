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
)

// SecretEnv keeps the placeholders of egress secrets in the environment
// of running sandboxes: sent before a sandbox is reported running (a boot,
// a wake, a copy) and again whenever its key's secrets change. What is
// sent is Config.SecretEnv's; nil sends nothing.
type SecretEnv struct {
	envOf     func(owner, id string, labels map[string]string) map[string]string
	records   Store
	instances func() []*instance
	log       *slog.Logger

	mu   sync.Mutex
	sent map[string]string // by sandbox: the placeholders last sent, encoded
	// sending serializes the sends to one sandbox, so that a later set of
	// placeholders never arrives before an earlier one.
	sending map[string]*sync.Mutex
}

func newSecretEnv(m *Manager) *SecretEnv {
	return &SecretEnv{envOf: m.cfg.SecretEnv, records: m.cfg.Store, instances: m.instances, log: m.log,
		sent: map[string]string{}, sending: map[string]*sync.Mutex{}}
}

// secretEnvTimeout bounds one send to a guest.
const secretEnvTimeout = 10 * time.Second

// push sends sandbox in's placeholders if they changed since the last
// send. With none to send and none sent, nothing is sent: a copy or a
// guest from before a restart may still hold placeholders of another
// moment, but a placeholder is worth something only to a sandbox its
// secret reaches now (the swap checks), so an empty set costs a wake or a
// copy no round trip. A guest whose agent predates placeholders is left
// as it is.
func (se *SecretEnv) push(ctx context.Context, in *instance, sb *Sandbox) {
	if se == nil || se.envOf == nil {
		return
	}
	se.mu.Lock()
	lock := se.sending[sb.ID]
	if lock == nil {
		lock = &sync.Mutex{}
		se.sending[sb.ID] = lock
	}
	se.mu.Unlock()
	lock.Lock()
	defer lock.Unlock()
	// Read under the lock: what is sent is what holds now.
	env := se.envOf(sb.OwnerKeyID, sb.ID, sb.Labels)
	enc := encodeEnv(env)
	se.mu.Lock()
	prev, known := se.sent[sb.ID]
	se.mu.Unlock()
	if known && prev == enc {
		return
	}
	if !known && len(env) == 0 {
		return
	}
	c := in.guest()
	if c == nil {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, secretEnvTimeout)
	defer cancel()
	if err := c.SetSecretEnv(ctx, env); err != nil {
		if errdefs.Code(err) != "unknown_method" {
			se.log.Warn("sending egress secrets' placeholders", "sandbox_id", sb.ID, "err", err)
		}
		return
	}
	se.mu.Lock()
	se.sent[sb.ID] = enc
	se.mu.Unlock()
}

// pushRecord is push for an instance whose record is read here.
func (se *SecretEnv) pushRecord(ctx context.Context, in *instance) {
	if se == nil || se.envOf == nil {
		return
	}
	sb, err := se.records.GetSandbox(ctx, in.id)
	if err != nil {
		return
	}
	se.push(ctx, in, sb)
}

// Apply brings the placeholders of the running sandboxes of owners (nil:
// every key) up to date: the secrets changed.
func (se *SecretEnv) Apply(ctx context.Context, owners []string) {
	if se == nil || se.envOf == nil {
		return
	}
	for _, in := range se.instances() {
		sb, err := se.records.GetSandbox(ctx, in.id)
		if err != nil || sb.State != StateRunning || (owners != nil && !slices.Contains(owners, sb.OwnerKeyID)) {
			continue
		}
		se.push(ctx, in, sb)
	}
}

// forget drops what was sent to sandbox id: its next guest (a wake of a
// stopped VM, a restart) starts with none.
func (se *SecretEnv) forget(id string) {
	if se == nil {
		return
	}
	se.mu.Lock()
	delete(se.sent, id)
	delete(se.sending, id)
	se.mu.Unlock()
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
