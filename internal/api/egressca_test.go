package api

import (
	"context"
	"encoding/json"
	"net/http"
	"path/filepath"
	"testing"

	"github.com/emberbox/emberbox/internal/egress"
	"github.com/emberbox/emberbox/internal/secrets"
	"github.com/emberbox/emberbox/internal/store"
)

// caView is what the tests read of an egressCAJSON.
type caView struct {
	ID       string
	RetireAt *string
	Newest   bool
}

// TestEgressCARoutes: an admin key sees and rotates the egress CAs; a
// tenant key may not; a server without them answers 501.
func TestEgressCARoutes(t *testing.T) {
	st, err := store.Open(t.Context(), filepath.Join(t.TempDir(), "emberbox.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	sealer, _ := secrets.NewSealer(make([]byte, secrets.KeySize))
	seed, _ := egress.NewCA()
	cas, err := secrets.OpenCAs(t.Context(), secrets.CAConfig{Store: st, Sealer: sealer,
		Seed: func(context.Context) (*egress.CA, error) { return seed, nil }})
	if err != nil {
		t.Fatal(err)
	}
	m := newFakeManager()
	e := &testEnv{t: t, m: m, idem: newFakeIdem(), s: newServer(Config{Manager: rolesOf(m), Keys: fakeKeys{}, Version: "test",
		EgressCAs: guestlessCAs{cas}})}
	admin := []string{"Authorization", "Bearer secret-admin"}

	if got := errorOf(t, e.do("GET", "/v1/egress-ca", "")); got.Code != "admin_only" {
		t.Errorf("a tenant key's list: %+v", got)
	}
	if got := errorOf(t, e.do("POST", "/v1/egress-ca:rotate", `{}`)); got.Code != "admin_only" {
		t.Errorf("a tenant key's rotation: %+v", got)
	}
	var list struct{ CAs []caView }
	w := e.do("GET", "/v1/egress-ca", "", admin...)
	if w.Code != http.StatusOK || json.Unmarshal(w.Body.Bytes(), &list) != nil || len(list.CAs) != 1 ||
		list.CAs[0].ID != seed.ID() || !list.CAs[0].Newest || list.CAs[0].RetireAt != nil {
		t.Fatalf("list: %d %s", w.Code, w.Body)
	}
	for _, body := range []string{`{"keepPreviousSeconds":-1}`, `{"keepPreviousSeconds":99999999}`, `{"keepPreviousSeconds":"x"}`} {
		if got := errorOf(t, e.do("POST", "/v1/egress-ca:rotate", body, admin...)); got.Status != http.StatusBadRequest {
			t.Errorf("rotate %s: %+v", body, got)
		}
	}
	var rot struct {
		New      caView
		Previous []caView
	}
	w = e.do("POST", "/v1/egress-ca:rotate", `{"keepPreviousSeconds":3600}`, admin...)
	if w.Code != http.StatusOK || json.Unmarshal(w.Body.Bytes(), &rot) != nil || !rot.New.Newest || rot.New.ID == seed.ID() ||
		len(rot.Previous) != 1 || rot.Previous[0].ID != seed.ID() || rot.Previous[0].RetireAt == nil {
		t.Fatalf("rotate: %d %s", w.Code, w.Body)
	}
	if w := e.do("GET", "/v1/egress-ca", "", admin...); json.Unmarshal(w.Body.Bytes(), &list) != nil || len(list.CAs) != 2 {
		t.Errorf("list after the rotation: %s", w.Body)
	}

	none := &testEnv{t: t, m: m, idem: newFakeIdem(), s: newServer(Config{Manager: rolesOf(m), Keys: fakeKeys{}, Version: "test"})}
	if got := errorOf(t, none.do("GET", "/v1/egress-ca", "", admin...)); got.Code != "egress_ca_unavailable" || got.Status != http.StatusNotImplemented {
		t.Errorf("a server without egress CAs: %+v", got)
	}
}
