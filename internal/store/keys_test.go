package store

import (
	"testing"
	"time"

	"github.com/emberbox/emberbox/internal/errdefs"
)

// Revoked and expired keys do not authenticate; a rotated key keeps its id
// and its old secret works only during the grace period.
func TestKeyLifecycle(t *testing.T) {
	s, _ := openTest(t)
	ctx := t.Context()
	now := base
	s.now = func() time.Time { return now }

	admin, adminSecret, err := s.NewKey("admin")
	if err != nil {
		t.Fatal(err)
	}
	admin.Role = RoleAdmin
	if err := s.InsertKey(ctx, admin, adminSecret); err != nil {
		t.Fatal(err)
	}
	if k, err := s.AuthenticateKey(ctx, adminSecret); err != nil || k.Role != RoleAdmin {
		t.Errorf("admin key: %+v, %v", k, err)
	}
	bad := admin
	bad.ID, bad.Role = "key_bad", "root"
	if err := s.InsertKey(ctx, bad, "x"); !errdefs.IsInvalidArgument(err) {
		t.Errorf("InsertKey(role root) = %v, want invalid", err)
	}

	// Expiry.
	exp, expSecret, _ := s.NewKey("ci")
	until := now.Add(time.Hour)
	exp.ExpiresAt = &until
	if err := s.InsertKey(ctx, exp, expSecret); err != nil {
		t.Fatal(err)
	}
	if k, err := s.AuthenticateKey(ctx, expSecret); err != nil || k.Role != RoleTenant {
		t.Errorf("before expiry: %+v, %v", k, err)
	}
	now = now.Add(time.Hour)
	if _, err := s.AuthenticateKey(ctx, expSecret); !errdefs.IsNotFound(err) || errdefs.Code(err) != "key_expired" {
		t.Errorf("after expiry: %v, want key_expired", err)
	}
	if _, err := s.SetKeyExpiry(ctx, exp.ID, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := s.AuthenticateKey(ctx, expSecret); err != nil {
		t.Errorf("expiry lifted: %v", err)
	}

	// Rotation with a grace period, then revocation.
	k, newSecret, err := s.RotateKey(ctx, exp.ID, 10*time.Minute)
	if err != nil || k.ID != exp.ID || newSecret == expSecret {
		t.Fatalf("RotateKey = %+v, %v", k, err)
	}
	for _, sec := range []string{expSecret, newSecret} {
		if k, err := s.AuthenticateKey(ctx, sec); err != nil || k.ID != exp.ID {
			t.Errorf("in grace: %+v, %v", k, err)
		}
	}
	now = now.Add(10 * time.Minute)
	if _, err := s.AuthenticateKey(ctx, expSecret); !errdefs.IsNotFound(err) {
		t.Errorf("old secret after grace: %v, want not found", err)
	}
	if _, err := s.AuthenticateKey(ctx, newSecret); err != nil {
		t.Errorf("new secret: %v", err)
	}
	if _, second, err := s.RotateKey(ctx, exp.ID, 0); err != nil {
		t.Fatal(err)
	} else if _, err := s.AuthenticateKey(ctx, newSecret); !errdefs.IsNotFound(err) {
		t.Errorf("rotation without grace: old secret %v, want not found", err)
	} else {
		newSecret = second
	}
	if k, err := s.RevokeKey(ctx, exp.ID); err != nil || k.RevokedAt == nil {
		t.Fatalf("RevokeKey = %+v, %v", k, err)
	}
	if _, err := s.AuthenticateKey(ctx, newSecret); errdefs.Code(err) != "key_revoked" {
		t.Errorf("revoked: %v, want key_revoked", err)
	}
	if _, _, err := s.RotateKey(ctx, exp.ID, 0); !errdefs.IsConflict(err) {
		t.Errorf("rotating a revoked key: %v, want conflict", err)
	}
	if _, err := s.RevokeKey(ctx, "key_nope"); !errdefs.IsNotFound(err) {
		t.Errorf("revoking an unknown key: %v, want not found", err)
	}
	// Both keys were made at the same instant, so their order is their
	// random ids': look the revoked one up by id.
	keys, err := s.ListKeys(ctx)
	revoked := 0
	for _, k := range keys {
		if k.ID == exp.ID && k.RevokedAt != nil {
			revoked++
		}
	}
	if err != nil || len(keys) != 2 || revoked != 1 {
		t.Errorf("ListKeys = %+v, %v; want 2 keys, %s revoked", keys, err, exp.ID)
	}
}

// KeyGenerations follows the key's secrets: a rotation adds the new
// secret's generation and keeps the old one for the grace only; expiry and
// revocation leave none.
func TestKeyGenerations(t *testing.T) {
	s, _ := openTest(t)
	ctx := t.Context()
	now := base
	s.now = func() time.Time { return now }
	gens := func(id string) []string {
		t.Helper()
		g, err := s.KeyGenerations(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		return g
	}
	same := func(what string, got []string, want ...string) {
		t.Helper()
		if len(got) != len(want) {
			t.Errorf("%s: %d generations, want %d", what, len(got), len(want))
			return
		}
		for i := range want {
			if got[i] != want[i] {
				t.Errorf("%s: generation %d differs", what, i)
			}
		}
	}

	k, first, err := s.CreateKey(ctx, "e2b")
	if err != nil {
		t.Fatal(err)
	}
	same("new key", gens(k.ID), SecretGeneration(first))
	same("unknown key", gens("key_nope"))

	_, second, err := s.RotateKey(ctx, k.ID, 10*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	same("in grace", gens(k.ID), SecretGeneration(second), SecretGeneration(first))
	now = now.Add(10 * time.Minute)
	same("after grace", gens(k.ID), SecretGeneration(second))
	_, third, err := s.RotateKey(ctx, k.ID, 0)
	if err != nil {
		t.Fatal(err)
	}
	same("rotated without grace", gens(k.ID), SecretGeneration(third))

	until := now.Add(time.Minute)
	if _, err := s.SetKeyExpiry(ctx, k.ID, &until); err != nil {
		t.Fatal(err)
	}
	same("before expiry", gens(k.ID), SecretGeneration(third))
	now = until
	same("expired", gens(k.ID))
	if _, err := s.SetKeyExpiry(ctx, k.ID, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := s.RevokeKey(ctx, k.ID); err != nil {
		t.Fatal(err)
	}
	same("revoked", gens(k.ID))
}
