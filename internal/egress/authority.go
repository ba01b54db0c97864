package egress

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"
	"sync"
)

// Authority is the set of egress CAs in force: every one of them is
// given to guests to trust, and a gate signs with the newest one its
// guest is known to trust. A rotation adds a CA and, later, retires the
// old one; in between a guest that has not yet learnt the new CA (a
// wedged one, one paused, one whose agent predates rotation) is still
// answered with a leaf it trusts. Its methods are safe for concurrent use.
type Authority struct {
	mu  sync.RWMutex
	cas []*CA // oldest first
}

// NewAuthority makes an authority of cas, oldest first.
func NewAuthority(cas ...*CA) *Authority {
	a := &Authority{}
	a.Set(cas)
	return a
}

// Set puts cas (oldest first) in force. A CA already held keeps its
// cache of leaves.
func (a *Authority) Set(cas []*CA) {
	a.mu.Lock()
	defer a.mu.Unlock()
	held := map[string]*CA{}
	for _, ca := range a.cas {
		held[ca.ID()] = ca
	}
	next := make([]*CA, 0, len(cas))
	for _, ca := range cas {
		if h, ok := held[ca.ID()]; ok {
			ca = h
		}
		next = append(next, ca)
	}
	a.cas = next
}

// CAs returns the CAs in force, oldest first.
func (a *Authority) CAs() []*CA {
	a.mu.RLock()
	defer a.mu.RUnlock()
	return append([]*CA(nil), a.cas...)
}

// Bundle is the PEM bundle of every CA in force, oldest first: what a
// guest is given to trust.
func (a *Authority) Bundle() string {
	a.mu.RLock()
	defer a.mu.RUnlock()
	var b strings.Builder
	for _, ca := range a.cas {
		b.Write(ca.certPEM)
	}
	return b.String()
}

// Signer is the CA to sign a leaf with for a guest that trusts the PEM
// bundle trusted: the newest CA in force that the bundle holds; with none
// of them in it (or nothing known of the guest, ""), the oldest in force,
// which every guest configured before a rotation trusts. Nil if there is
// none.
func (a *Authority) Signer(trusted string) *CA {
	a.mu.RLock()
	defer a.mu.RUnlock()
	if len(a.cas) == 0 {
		return nil
	}
	for i := len(a.cas) - 1; i >= 0; i-- {
		if trusted != "" && strings.Contains(trusted, string(a.cas[i].certPEM)) {
			return a.cas[i]
		}
	}
	return a.cas[0]
}

// ID names a CA: the hex SHA-256 of its certificate, as `openssl x509
// -fingerprint -sha256` shows it (without the colons).
func (ca *CA) ID() string {
	sum := sha256.Sum256(ca.cert.Raw)
	return hex.EncodeToString(sum[:])
}
