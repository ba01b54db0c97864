package secrets

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/emberbox/emberbox/internal/egress"
	"github.com/emberbox/emberbox/internal/errdefs"
)

// The egress CAs (the gate's, for intercepted hosts) are kept in the
// store as one shared setting, sealed under the secrets key, so that every
// node of a cluster holds the same set and a rotation made on one reaches
// all of them. A rotation is done with care: the new CA is added to what
// every guest trusts, a gate signs with it only for a guest known to have
// installed it (egress.Authority.Signer), and the old one stays trusted
// for a grace period before it is retired.

// CASettings is what the CAs need of the store: one shared setting.
type CASettings interface {
	ClusterSetting(ctx context.Context, name string, put func() (string, error)) (string, error)
	ReadClusterSetting(ctx context.Context, name string) (string, error)
	SwapClusterSetting(ctx context.Context, name, prev, next string) error
}

const (
	caSetting = "egress-cas"
	caOwner   = "cluster" // the sealing's owner: no key's
	// DefaultCAKeep is how long a rotated-out CA stays trusted by
	// default; MaxCAKeep bounds what an operator may ask for.
	DefaultCAKeep = 24 * time.Hour
	MaxCAKeep     = 30 * 24 * time.Hour
)

// ErrOtherKey: the stored CAs were sealed under another secrets key than
// this server's.
var ErrOtherKey = errors.New("the stored egress CAs do not open with this server's secrets key")

// storedCA is one CA as the setting keeps it.
type storedCA struct {
	Cert     string     `json:"cert"`
	Key      string     `json:"key"`
	AddedAt  time.Time  `json:"addedAt"`
	RetireAt *time.Time `json:"retireAt,omitempty"` // nil: in force until rotated out
}

// CAInfo describes a CA in force.
type CAInfo struct {
	ID        string     // SHA-256 fingerprint of the certificate
	CertPEM   string     // what guests trust
	NotAfter  time.Time  // the certificate's end
	AddedAt   time.Time  // when it was made
	RetireAt  *time.Time // when guests stop trusting it; nil for the newest
	Newest    bool       // it signs for every guest known to trust it
	Guests    int        // running guests known to trust it (CAs.Status's trusted)
	NotGuests int        // running guests not known to trust it
}

// CAConfig configures the CAs.
type CAConfig struct {
	Store  CASettings
	Sealer *Sealer
	// Seed is the first CA, when the store holds none yet: the one a
	// server made before its CAs were kept in the store, so that its
	// guests keep trusting it.
	Seed func(ctx context.Context) (*egress.CA, error)
	// Changed is called after the CAs in force change (a rotation here or
	// on another node, a retirement): running guests are to be given the
	// new bundle.
	Changed func()
	Logger  *slog.Logger
	Now     func() time.Time // tests move it; nil is time.Now
}

// CAs keeps the egress CAs in force. Its methods are safe for concurrent use.
type CAs struct {
	cfg  CAConfig
	auth *egress.Authority

	mu      sync.Mutex
	applied string      // the stored value last applied
	next    time.Time   // the next retirement due (zero: none)
	list    []*storedCA // the stored CAs still in force, oldest first
}

// OpenCAs reads the egress CAs from the store, seeding it if it holds
// none. ErrOtherKey if they were sealed under another key.
func OpenCAs(ctx context.Context, cfg CAConfig) (*CAs, error) {
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	c := &CAs{cfg: cfg, auth: egress.NewAuthority()}
	raw, err := cfg.Store.ClusterSetting(ctx, caSetting, func() (string, error) {
		ca, err := cfg.Seed(ctx)
		if err != nil {
			return "", err
		}
		cert, key := ca.PEM()
		return c.seal([]*storedCA{{Cert: string(cert), Key: string(key), AddedAt: cfg.Now().UTC()}})
	})
	if err != nil {
		return nil, fmt.Errorf("egress CAs: %w", err)
	}
	if _, err := c.apply(raw); err != nil {
		return nil, err
	}
	return c, nil
}

// Authority is the CAs in force, for the gates.
func (c *CAs) Authority() *egress.Authority { return c.auth }

func (c *CAs) seal(list []*storedCA) (string, error) {
	b, err := json.Marshal(list)
	if err != nil {
		return "", err
	}
	return c.cfg.Sealer.Seal(caOwner, caSetting, string(b)), nil
}

func (c *CAs) open(raw string) ([]*storedCA, error) {
	opened, err := c.cfg.Sealer.Open(caOwner, caSetting, raw)
	if err != nil {
		return nil, ErrOtherKey
	}
	var list []*storedCA
	if err := json.Unmarshal([]byte(opened), &list); err != nil || len(list) == 0 {
		return nil, fmt.Errorf("egress CAs: the stored set is unreadable (%v)", err)
	}
	return list, nil
}

// inForce is list without the CAs whose retirement has come; the newest
// is never retired.
func inForce(list []*storedCA, now time.Time) []*storedCA {
	out := make([]*storedCA, 0, len(list))
	for i, s := range list {
		if i == len(list)-1 || s.RetireAt == nil || now.Before(*s.RetireAt) {
			out = append(out, s)
		}
	}
	return out
}

// apply puts the stored value raw in force, reporting whether the
// bundle guests trust changed.
func (c *CAs) apply(raw string) (bool, error) {
	list, err := c.open(raw)
	if err != nil {
		return false, err
	}
	now := c.cfg.Now()
	list = inForce(list, now)
	cas := make([]*egress.CA, 0, len(list))
	var next time.Time
	for _, s := range list {
		ca, err := egress.LoadCA([]byte(s.Cert), []byte(s.Key))
		if err != nil {
			return false, fmt.Errorf("egress CAs: %w", err)
		}
		cas = append(cas, ca)
		if s.RetireAt != nil && (next.IsZero() || s.RetireAt.Before(next)) {
			next = *s.RetireAt
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	before := c.auth.Bundle()
	c.auth.Set(cas)
	c.applied, c.next, c.list = raw, next, list
	return c.auth.Bundle() != before, nil
}

// Rotation is what a rotation did.
type Rotation struct {
	New      CAInfo
	Previous []CAInfo // the CAs kept, with their retirement
}

// Rotate makes a new CA and puts it in force beside the current ones,
// which guests keep trusting for keep (0: retire them now, as for a key
// that may have leaked). A conflict error if another node rotated at the
// same moment.
func (c *CAs) Rotate(ctx context.Context, keep time.Duration) (*Rotation, error) {
	if keep < 0 || keep > MaxCAKeep {
		return nil, errdefs.New(errdefs.ErrInvalidArgument, "invalid_keep", "the old CA may be kept 0 to %d seconds, not %d",
			int(MaxCAKeep/time.Second), int(keep/time.Second))
	}
	raw, err := c.cfg.Store.ReadClusterSetting(ctx, caSetting)
	if err != nil {
		return nil, fmt.Errorf("egress CAs: %w", err)
	}
	list, err := c.open(raw)
	if err != nil {
		return nil, err
	}
	now := c.cfg.Now().UTC()
	ca, err := egress.NewCA()
	if err != nil {
		return nil, err
	}
	retire := now.Add(keep)
	var kept []*storedCA
	for _, s := range inForce(list, now) {
		if keep == 0 {
			continue
		}
		if s.RetireAt == nil || s.RetireAt.After(retire) {
			s.RetireAt = &retire
		}
		kept = append(kept, s)
	}
	cert, key := ca.PEM()
	kept = append(kept, &storedCA{Cert: string(cert), Key: string(key), AddedAt: now})
	next, err := c.seal(kept)
	if err != nil {
		return nil, err
	}
	if err := c.cfg.Store.SwapClusterSetting(ctx, caSetting, raw, next); err != nil {
		return nil, fmt.Errorf("egress CAs: %w", err)
	}
	c.cfg.Logger.Info("egress CA rotated", "new", ca.ID(), "kept", len(kept)-1, "retire_at", retire)
	if _, err := c.apply(next); err != nil {
		return nil, err
	}
	if c.cfg.Changed != nil {
		c.cfg.Changed()
	}
	infos := c.Status(nil)
	return &Rotation{New: infos[len(infos)-1], Previous: infos[:len(infos)-1]}, nil
}

// Status describes the CAs in force, oldest first. trusted, if set, are
// the bundles the running guests are known to trust ("" for a guest of
// which nothing is known), to count per CA.
func (c *CAs) Status(trusted []string) []CAInfo {
	c.mu.Lock()
	list := slices.Clone(c.list)
	c.mu.Unlock()
	out := make([]CAInfo, 0, len(list))
	for i, s := range list {
		ca, err := egress.LoadCA([]byte(s.Cert), []byte(s.Key))
		if err != nil {
			continue
		}
		info := CAInfo{ID: ca.ID(), CertPEM: ca.CertPEM(), NotAfter: ca.Certificate().NotAfter, AddedAt: s.AddedAt,
			RetireAt: s.RetireAt, Newest: i == len(list)-1}
		for _, b := range trusted {
			if b != "" && strings.Contains(b, info.CertPEM) {
				info.Guests++
			} else {
				info.NotGuests++
			}
		}
		out = append(out, info)
	}
	return out
}

// Run keeps the CAs in force up to date until ctx is done: a rotation
// made on another node, a retirement that has come. It checks every
// interval.
func (c *CAs) Run(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if err := c.Refresh(ctx); err != nil && ctx.Err() == nil {
			c.cfg.Logger.Warn("egress CAs: reading the stored set", "err", err)
		}
	}
}

// Refresh applies the stored CAs if they changed or a retirement came.
func (c *CAs) Refresh(ctx context.Context) error {
	raw, err := c.cfg.Store.ReadClusterSetting(ctx, caSetting)
	if err != nil {
		return err
	}
	c.mu.Lock()
	due := raw != c.applied || (!c.next.IsZero() && !c.cfg.Now().Before(c.next))
	c.mu.Unlock()
	if !due {
		return nil
	}
	changed, err := c.apply(raw)
	if err != nil {
		return err
	}
	if changed && c.cfg.Changed != nil {
		c.cfg.Changed()
	}
	return nil
}
