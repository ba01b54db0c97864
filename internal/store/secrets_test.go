package store

import (
	"testing"
	"time"

	"github.com/emberbox/emberbox/internal/errdefs"
	"github.com/emberbox/emberbox/internal/secrets"
)

// TestSecretRows: a secret is stored, replaced in one transaction,
// listed by key and name, stamped on every change, and deleted.
func TestSecretRows(t *testing.T) {
	s, _ := openTest(t)
	ctx := t.Context()
	put := func(owner, name, placeholder string, at time.Time) {
		t.Helper()
		_, err := s.PutSecret(ctx, owner, name, func(old *secrets.Secret) (*secrets.Secret, error) {
			sc := &secrets.Secret{Owner: owner, Name: name, Env: name, Placeholder: placeholder, Sealed: "v1:sealed",
				Hosts: []string{"api.example.com"}, Rules: []secrets.Rule{{Methods: []string{"GET"}, Paths: []string{"/v1/*"}}},
				Only: &secrets.Scope{Sandboxes: []string{"sbx_1"}}, CreatedAt: at, UpdatedAt: at}
			if old != nil {
				sc.Placeholder, sc.CreatedAt = old.Placeholder, old.CreatedAt
			}
			return sc, nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	stamp0, err := s.SecretsStamp(ctx)
	if err != nil {
		t.Fatal(err)
	}
	put("k", "B", "p-b", base)
	put("k", "A", "p-a", base)
	put("other", "A", "p-oa", base)
	stamp1, _ := s.SecretsStamp(ctx)
	put("k", "A", "ignored", base.Add(time.Second))
	stamp2, _ := s.SecretsStamp(ctx)
	if stamp0 == stamp1 || stamp1 == stamp2 {
		t.Errorf("stamps %q, %q, %q: want a change at each write", stamp0, stamp1, stamp2)
	}
	list, err := s.ListSecrets(ctx, "k")
	if err != nil || len(list) != 2 || list[0].Name != "A" || list[1].Name != "B" {
		t.Fatalf("ListSecrets(k): %+v, %v", list, err)
	}
	a := list[0]
	if a.Placeholder != "p-a" || !a.UpdatedAt.Equal(base.Add(time.Second)) || !a.CreatedAt.Equal(base) ||
		len(a.Rules) != 1 || a.Rules[0].Paths[0] != "/v1/*" || a.Only == nil || a.Only.Sandboxes[0] != "sbx_1" {
		t.Errorf("replaced secret: %+v", a)
	}
	if all, _ := s.ListSecrets(ctx, ""); len(all) != 3 {
		t.Errorf("every key's secrets: %d, want 3", len(all))
	}
	if _, err := s.DeleteSecret(ctx, "other", "B"); !errdefs.IsNotFound(err) {
		t.Errorf("deleting another key's secret: %v", err)
	}
	if _, err := s.DeleteSecret(ctx, "k", "A"); err != nil {
		t.Fatal(err)
	}
	if stamp3, _ := s.SecretsStamp(ctx); stamp3 == stamp2 {
		t.Error("a delete left the stamp as it was")
	}
	// A placeholder is one secret's alone.
	_, err = s.PutSecret(ctx, "k", "C", func(*secrets.Secret) (*secrets.Secret, error) {
		return &secrets.Secret{Owner: "k", Name: "C", Env: "C", Placeholder: "p-b", Sealed: "x", Hosts: []string{"h"}, CreatedAt: base, UpdatedAt: base}, nil
	})
	if err == nil {
		t.Error("two secrets share a placeholder")
	}
}
