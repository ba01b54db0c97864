package egress

import (
	"crypto/tls"
	"net/http"
	"testing"
	"time"
)

// trusting is a guest's client that trusts only the gate CAs cas (and the
// upstream's).
func (e *interceptEnv) trusting(cas ...*CA) *http.Client {
	tr := &http.Transport{Proxy: http.ProxyURL(e.proxyURL),
		TLSClientConfig: &tls.Config{RootCAs: pool(append(cas, e.upCA)...)}}
	return &http.Client{Transport: tr, Timeout: 10 * time.Second}
}

// TestRotationKeepsEveryGuestServed walks a rotation: a guest that has not
// learnt the new CA keeps being answered with the old one's leaves; one
// known to trust both gets the new one's; once the old is retired, the new
// one signs for every guest.
func TestRotationKeepsEveryGuestServed(t *testing.T) {
	e := newInterceptEnv(t)
	old := e.gateCA
	auth := e.gate.op.Intercept.Authority
	next := mustCA(t)
	signedBy := func(c *http.Client) *CA {
		t.Helper()
		resp, _ := get(t, c, e.url("api.test", "/echo"))
		leaf := resp.TLS.PeerCertificates[0]
		for _, ca := range []*CA{old, next} {
			if leaf.CheckSignatureFrom(ca.Certificate()) == nil {
				return ca
			}
		}
		t.Fatal("the leaf is signed by neither CA")
		return nil
	}
	oldOnly := e.trusting(old)
	if signedBy(oldOnly) != old {
		t.Fatal("before the rotation the old CA must sign")
	}

	auth.Set([]*CA{old, next})
	if got := auth.Bundle(); got != old.CertPEM()+next.CertPEM() {
		t.Fatalf("bundle during the rotation holds %d bytes, want both CAs", len(got))
	}
	// Nothing known of the guest: the oldest CA in force signs, and a
	// guest that never learnt the new one is still served.
	if signedBy(e.trusting(old)) != old {
		t.Fatal("a guest not known to trust the new CA was not answered by the old one")
	}
	// The guest is told of both: the new one signs from its next
	// connection on.
	e.gate.SetTrusted(auth.Bundle())
	if signedBy(e.trusting(next)) != next {
		t.Fatal("a guest known to trust the new CA was not answered by it")
	}
	if _, err := e.trusting(old).Get(e.url("api.test", "/echo")); err == nil {
		t.Fatal("a client trusting only the old CA accepted the new CA's leaf")
	}

	// Retired: the old CA is no longer in force, whatever the guest holds.
	e.gate.SetTrusted(old.CertPEM())
	auth.Set([]*CA{next})
	if signedBy(e.trusting(next)) != next {
		t.Fatal("after the old CA's retirement the new one must sign")
	}
}

func TestAuthoritySetKeepsLeafCaches(t *testing.T) {
	a, b := mustCA(t), mustCA(t)
	auth := NewAuthority(a)
	leaf, err := a.Leaf("api.test")
	if err != nil {
		t.Fatal(err)
	}
	again, err := LoadCA(a.PEM())
	if err != nil {
		t.Fatal(err)
	}
	auth.Set([]*CA{again, b})
	got := auth.CAs()
	if len(got) != 2 || got[0] != a || got[1] != b {
		t.Fatal("Set did not keep the CA already held")
	}
	if l, _ := got[0].Leaf("api.test"); l != leaf {
		t.Fatal("the held CA's leaf cache was lost")
	}
	if auth.Signer("") != a || auth.Signer(b.CertPEM()) != b || auth.Signer("junk") != a {
		t.Fatal("Signer does not pick the newest trusted CA, or the oldest")
	}
	if NewAuthority().Signer("") != nil {
		t.Fatal("an empty authority has a signer")
	}
}
