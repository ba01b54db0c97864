package main

import (
	"errors"
	"path/filepath"
	"testing"

	"github.com/emberbox/emberbox/internal/secrets"
	"github.com/emberbox/emberbox/internal/store"
)

// TestClusterEgressCA: nodes with the same secrets key share one egress
// CA through the store; a node with another key cannot open it.
func TestClusterEgressCA(t *testing.T) {
	st, err := store.Open(t.Context(), filepath.Join(t.TempDir(), "emberbox.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	key := make([]byte, secrets.KeySize)
	sa, _ := secrets.NewSealer(key)
	sb, _ := secrets.NewSealer(key)
	a, err := clusterEgressCA(t.Context(), st, sa)
	if err != nil {
		t.Fatal(err)
	}
	b, err := clusterEgressCA(t.Context(), st, sb)
	if err != nil {
		t.Fatal(err)
	}
	if a.CertPEM() != b.CertPEM() {
		t.Error("two nodes made two egress CAs")
	}
	other := make([]byte, secrets.KeySize)
	other[0] = 1
	so, _ := secrets.NewSealer(other)
	if _, err := clusterEgressCA(t.Context(), st, so); !errors.Is(err, errOtherSecretsKey) {
		t.Error("a node with another secrets key opened the cluster's egress CA")
	}
	// The CA is not in the store in clear.
	v, err := st.ClusterSetting(t.Context(), "egress-ca", func() (string, error) { return "", nil })
	if err != nil || len(v) < 4 || v[:3] != "v1:" {
		t.Errorf("stored as %.20q (%v), want it sealed", v, err)
	}
}
