package secrets

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/emberbox/emberbox/internal/errdefs"
)

// Store keeps secrets; *store.Store implements it.
type Store interface {
	// PutSecret inserts or replaces owner's secret name with what fn makes
	// of the stored one (nil: none), in one transaction.
	PutSecret(ctx context.Context, owner, name string, fn func(old *Secret) (*Secret, error)) (*Secret, error)
	DeleteSecret(ctx context.Context, owner, name string) (*Secret, error)
	// ListSecrets lists owner's secrets by name; "" lists every key's.
	ListSecrets(ctx context.Context, owner string) ([]*Secret, error)
	// SecretsStamp changes whenever a secret is stored or deleted.
	SecretsStamp(ctx context.Context) (string, error)
}

// Config configures a Service.
type Config struct {
	Store  Store
	Sealer *Sealer
	Logger *slog.Logger
	// Changed is told, after each change this process makes or sees, the
	// owners whose secrets changed: their sandboxes' placeholders are
	// brought up to date.
	Changed func(owners []string)
	Now     func() time.Time
}

// Service keeps egress secrets and holds their values, opened, in memory.
type Service struct {
	cfg Config
	log *slog.Logger

	mu      sync.RWMutex
	byOwner map[string][]*held
	stamp   string
}

// held is a secret with its value opened.
type held struct {
	*Secret
	value string
}

// New returns a Service; whoever makes it runs its Run and, before
// sandboxes use it, its Load.
func New(cfg Config) *Service {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Changed == nil {
		cfg.Changed = func([]string) {}
	}
	return &Service{cfg: cfg, log: cfg.Logger.With("component", "secrets"), byOwner: map[string][]*held{}}
}

// Spec is a secret as set: Value and Hosts are required. On a replace a
// nil Only or Env keeps the secret's scope or variable (a new value never
// widens who gets it), while Rules, Header and API are replaced as given.
type Spec struct {
	Value  string
	Hosts  []string
	Header string
	Format string
	Rules  []Rule
	Only   *Scope
	API    *APIPolicy
	Env    *string
}

func (sp *Spec) check(name string) error {
	for _, err := range []error{checkName(name), checkValue(sp.Value), checkHosts(sp.Hosts), checkHeader(sp.Header, sp.Format),
		checkRules(sp.Rules), checkScope(sp.Only), checkAPI(sp.API)} {
		if err != nil {
			return err
		}
	}
	if sp.Env != nil {
		return checkName(*sp.Env)
	}
	return nil
}

// Set stores or replaces owner's secret name. A replace keeps the
// placeholder and, unless given, the scope and the variable.
func (s *Service) Set(ctx context.Context, owner, name string, sp Spec) (*Secret, error) {
	if err := sp.check(name); err != nil {
		return nil, err
	}
	sc, err := s.cfg.Store.PutSecret(ctx, owner, name, func(old *Secret) (*Secret, error) {
		now := s.cfg.Now().UTC()
		sc := &Secret{Owner: owner, Name: name, Env: name, Placeholder: newPlaceholder(), Hosts: sp.Hosts,
			Header: sp.Header, Format: sp.Format, Rules: sp.Rules, Only: sp.Only, API: sp.API, CreatedAt: now, UpdatedAt: now}
		if old != nil {
			sc.Placeholder, sc.Env, sc.CreatedAt = old.Placeholder, old.Env, old.CreatedAt
			if sp.Only == nil {
				sc.Only = old.Only
			}
		} else if n, err := s.count(ctx, owner); err != nil || n >= MaxPerOwner {
			if err != nil {
				return nil, err
			}
			return nil, errdefs.New(errdefs.ErrConflict, "too_many_secrets", "this key has %d egress secrets, the most it may", n)
		}
		if sp.Env != nil {
			sc.Env = *sp.Env
		}
		if err := s.envFree(ctx, owner, name, sc.Env); err != nil {
			return nil, err
		}
		if sc.Format == "" && sc.Header != "" {
			sc.Format = "{value}"
		}
		sc.Sealed = s.cfg.Sealer.Seal(owner, name, sp.Value)
		return sc, nil
	})
	if err != nil {
		return nil, err
	}
	s.log.Info("egress secret stored", "owner", owner, "name", name, "hosts", sc.Hosts)
	s.changed(ctx, owner)
	return sc, nil
}

// envFree refuses a variable another of owner's secrets puts in sandboxes.
// Two secrets scoped apart could share one; refusing is simpler and safe.
func (s *Service) envFree(ctx context.Context, owner, name, env string) error {
	list, err := s.cfg.Store.ListSecrets(ctx, owner)
	if err != nil {
		return err
	}
	for _, o := range list {
		if o.Name != name && o.Env == env {
			return errdefs.New(errdefs.ErrConflict, "env_taken", "secret %s already puts %s in sandboxes", o.Name, env)
		}
	}
	return nil
}

func (s *Service) count(ctx context.Context, owner string) (int, error) {
	list, err := s.cfg.Store.ListSecrets(ctx, owner)
	return len(list), err
}

// SetScope changes which of owner's sandboxes get secret name; an empty
// scope is every sandbox of the key.
func (s *Service) SetScope(ctx context.Context, owner, name string, only Scope) (*Secret, error) {
	if err := checkScope(&only); err != nil {
		return nil, err
	}
	return s.change(ctx, owner, name, func(sc *Secret) error {
		sc.Only = &only
		if len(only.Labels) == 0 && len(only.Sandboxes) == 0 {
			sc.Only = nil
		}
		return nil
	})
}

// Narrow replaces a secret's hosts or rules with strictly narrower ones:
// widening takes the value (Set).
func (s *Service) Narrow(ctx context.Context, owner, name string, hosts []string, rules []Rule) (*Secret, error) {
	if hosts == nil && rules == nil {
		return nil, invalid("invalid_request", "give hosts, rules or both")
	}
	if hosts != nil {
		if err := checkHosts(hosts); err != nil {
			return nil, err
		}
	}
	if err := checkRules(rules); err != nil {
		return nil, err
	}
	return s.change(ctx, owner, name, func(sc *Secret) error {
		if hosts != nil {
			if !hostsWithin(hosts, sc.Hosts) {
				return errdefs.New(errdefs.ErrInvalidArgument, "not_narrower", "hosts must be within the secret's: %v", sc.Hosts).
					WithHint("set the secret again, with its value, to widen it")
			}
			sc.Hosts = hosts
		}
		if rules != nil {
			if !rulesWithin(rules, sc.Rules) {
				return errdefs.New(errdefs.ErrInvalidArgument, "not_narrower", "rules must allow no request the secret's do not").
					WithHint("set the secret again, with its value, to widen it")
			}
			sc.Rules = rules
		}
		return nil
	})
}

// change applies fn to owner's existing secret name.
func (s *Service) change(ctx context.Context, owner, name string, fn func(sc *Secret) error) (*Secret, error) {
	sc, err := s.cfg.Store.PutSecret(ctx, owner, name, func(old *Secret) (*Secret, error) {
		if old == nil {
			return nil, errdefs.New(errdefs.ErrNotFound, "secret_not_found", "no egress secret named %s", name)
		}
		if err := fn(old); err != nil {
			return nil, err
		}
		old.UpdatedAt = s.cfg.Now().UTC()
		return old, nil
	})
	if err != nil {
		return nil, err
	}
	s.changed(ctx, owner)
	return sc, nil
}

// List lists owner's secrets by name: up to limit (0: all) after the name
// after.
func (s *Service) List(ctx context.Context, owner string, limit int, after string) ([]*Secret, error) {
	list, err := s.cfg.Store.ListSecrets(ctx, owner)
	if err != nil {
		return nil, err
	}
	if after != "" {
		i := slices.IndexFunc(list, func(sc *Secret) bool { return sc.Name > after })
		if i < 0 {
			i = len(list)
		}
		list = list[i:]
	}
	if limit > 0 && len(list) > limit {
		list = list[:limit]
	}
	return list, nil
}

// Delete erases owner's secret name; its placeholder stops working at
// once in this process, and within seconds on other nodes.
func (s *Service) Delete(ctx context.Context, owner, name string) (*Secret, error) {
	sc, err := s.cfg.Store.DeleteSecret(ctx, owner, name)
	if err != nil {
		return nil, err
	}
	s.log.Info("egress secret deleted", "owner", owner, "name", name)
	s.changed(ctx, owner)
	return sc, nil
}

// changed reloads the secrets after a change this process made.
func (s *Service) changed(ctx context.Context, owner string) {
	if _, err := s.Load(ctx); err != nil {
		s.log.Warn("reloading secrets", "err", err)
	}
	s.cfg.Changed([]string{owner})
}

// Load reads every secret and opens its value; a value this server's key
// does not open is left out (and logged by name). It answers the owners
// that had or have secrets.
func (s *Service) Load(ctx context.Context) ([]string, error) {
	stamp, err := s.cfg.Store.SecretsStamp(ctx)
	if err != nil {
		return nil, err
	}
	list, err := s.cfg.Store.ListSecrets(ctx, "")
	if err != nil {
		return nil, err
	}
	by := map[string][]*held{}
	for _, sc := range list {
		v, err := s.cfg.Sealer.Open(sc.Owner, sc.Name, sc.Sealed)
		if err != nil {
			s.log.Error("an egress secret does not open with this server's key", "owner", sc.Owner, "name", sc.Name)
			continue
		}
		by[sc.Owner] = append(by[sc.Owner], &held{Secret: sc, value: v})
	}
	s.mu.Lock()
	owners := slices.Collect(maps.Keys(by))
	for o := range s.byOwner {
		if by[o] == nil {
			owners = append(owners, o)
		}
	}
	s.byOwner, s.stamp = by, stamp
	s.mu.Unlock()
	return owners, nil
}

// pollEvery is how often Run looks for changes other processes made.
const pollEvery = 2 * time.Second

// Run reloads the secrets when another process on the store changed them
// (a node of a cluster), until ctx ends.
func (s *Service) Run(ctx context.Context) {
	t := time.NewTicker(pollEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		stamp, err := s.cfg.Store.SecretsStamp(ctx)
		s.mu.RLock()
		same := stamp == s.stamp
		s.mu.RUnlock()
		if err != nil || same {
			continue
		}
		owners, err := s.Load(ctx)
		if err != nil {
			s.log.Warn("reloading secrets", "err", err)
			continue
		}
		s.cfg.Changed(owners)
	}
}

// secretsOf returns owner's held secrets.
func (s *Service) secretsOf(owner string) []*held {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.byOwner[owner]
}

// Env returns the placeholders a sandbox of owner, with id and labels,
// has in its environment: variable to placeholder.
func (s *Service) Env(owner, id string, labels map[string]string) map[string]string {
	env := map[string]string{}
	for _, h := range s.secretsOf(owner) {
		if h.InScope(id, labels) {
			env[h.Env] = h.Placeholder
		}
	}
	return env
}

// Placeholder returns the placeholder of owner's secret name, if it
// reaches the sandbox with id and labels.
func (s *Service) Placeholder(owner, name, id string, labels map[string]string) (string, bool) {
	for _, h := range s.secretsOf(owner) {
		if h.Name == name && h.InScope(id, labels) {
			return h.Placeholder, true
		}
	}
	return "", false
}

func newPlaceholder() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return placeholderID + hex.EncodeToString(b[:])
}
