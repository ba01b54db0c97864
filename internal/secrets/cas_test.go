package secrets_test

import (
	"context"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/emberbox/emberbox/internal/egress"
	"github.com/emberbox/emberbox/internal/errdefs"
	"github.com/emberbox/emberbox/internal/secrets"
	"github.com/emberbox/emberbox/internal/store"
)

// casNode is one server's CAs over a shared store, with its own clock.
type casNode struct {
	cas     *secrets.CAs
	now     atomic.Pointer[time.Time]
	changed atomic.Int64
}

func openCAs(t *testing.T, st *store.Store, sealer *secrets.Sealer, seed *egress.CA) *casNode {
	t.Helper()
	n := &casNode{}
	start := time.Now()
	n.now.Store(&start)
	cas, err := secrets.OpenCAs(t.Context(), secrets.CAConfig{Store: st, Sealer: sealer,
		Seed:    func(context.Context) (*egress.CA, error) { return seed, nil },
		Changed: func() { n.changed.Add(1) },
		Now:     func() time.Time { return *n.now.Load() }})
	if err != nil {
		t.Fatal(err)
	}
	n.cas = cas
	return n
}

func (n *casNode) advance(d time.Duration) {
	t := n.now.Load().Add(d)
	n.now.Store(&t)
}

func TestCARotation(t *testing.T) {
	dir := t.TempDir()
	st, err := store.Open(t.Context(), filepath.Join(dir, "emberbox.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	key, _ := secrets.LoadOrCreateKey(filepath.Join(dir, "secrets.key"))
	sealer, _ := secrets.NewSealer(key)
	seed, err := egress.NewCA()
	if err != nil {
		t.Fatal(err)
	}
	a := openCAs(t, st, sealer, seed)
	other, _ := egress.NewCA()
	b := openCAs(t, st, sealer, other) // a second node: the stored CA wins over its seed
	if a.cas.Authority().Bundle() != seed.CertPEM() || b.cas.Authority().Bundle() != seed.CertPEM() {
		t.Fatal("the nodes do not both trust the seeded CA alone")
	}

	rot, err := a.cas.Rotate(t.Context(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if len(rot.Previous) != 1 || rot.Previous[0].ID != seed.ID() || rot.Previous[0].RetireAt == nil || !rot.New.Newest {
		t.Fatalf("rotation = %+v, want the seed kept with a retirement and a new newest CA", rot)
	}
	bundle := a.cas.Authority().Bundle()
	if bundle != seed.CertPEM()+rot.New.CertPEM || a.changed.Load() != 1 {
		t.Fatalf("after the rotation node a trusts %d bytes (changed %d times)", len(bundle), a.changed.Load())
	}
	// A guest not yet told keeps the old signer; one told gets the new.
	if a.cas.Authority().Signer("").ID() != seed.ID() || a.cas.Authority().Signer(bundle).ID() != rot.New.ID {
		t.Fatal("the signers during the rotation are wrong")
	}

	// Node b learns of it on its next refresh.
	runOnce(t, b)
	if b.cas.Authority().Bundle() != bundle || b.changed.Load() != 1 {
		t.Fatal("node b did not take the rotation up")
	}
	st1 := b.cas.Status([]string{bundle, seed.CertPEM(), ""})
	if len(st1) != 2 || st1[0].Guests != 2 || st1[0].NotGuests != 1 || st1[1].Guests != 1 || st1[1].NotGuests != 2 {
		t.Fatalf("status = %+v", st1)
	}

	// The grace period ends: the old CA is retired on both.
	a.advance(time.Hour + time.Second)
	b.advance(time.Hour + time.Second)
	runOnce(t, a)
	runOnce(t, b)
	if a.cas.Authority().Bundle() != rot.New.CertPEM || b.cas.Authority().Bundle() != rot.New.CertPEM {
		t.Fatal("the old CA is still trusted after its retirement")
	}

	// Two nodes rotate from one reading: one of them is refused.
	// And 0 retires at once.
	rot2, err := b.cas.Rotate(t.Context(), 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(rot2.Previous) != 0 || b.cas.Authority().Bundle() != rot2.New.CertPEM {
		t.Fatal("a rotation keeping nothing left the old CA trusted")
	}
	if _, err := a.cas.Rotate(t.Context(), -time.Second); !errdefs.IsInvalidArgument(err) {
		t.Errorf("a negative keep: %v", err)
	}
	if _, err := a.cas.Rotate(t.Context(), secrets.MaxCAKeep+time.Second); !errdefs.IsInvalidArgument(err) {
		t.Errorf("a keep past the maximum: %v", err)
	}

	// Another key cannot open them.
	otherKey, _ := secrets.LoadOrCreateKey(filepath.Join(dir, "other.key"))
	otherSealer, _ := secrets.NewSealer(otherKey)
	_, err = secrets.OpenCAs(t.Context(), secrets.CAConfig{Store: st, Sealer: otherSealer,
		Seed: func(context.Context) (*egress.CA, error) { return seed, nil }})
	if err != secrets.ErrOtherKey && !strings.Contains(err.Error(), secrets.ErrOtherKey.Error()) {
		t.Errorf("opening with another key: %v, want ErrOtherKey", err)
	}
}

// runOnce lets n's Run check the store once.
func runOnce(t *testing.T, n *casNode) {
	t.Helper()
	if err := n.cas.Refresh(t.Context()); err != nil {
		t.Fatal(err)
	}
}
