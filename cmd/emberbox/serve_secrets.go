package main

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/emberbox/emberbox/internal/egress"
	"github.com/emberbox/emberbox/internal/sandbox"
	"github.com/emberbox/emberbox/internal/secrets"
	"github.com/emberbox/emberbox/internal/store"
)

// Files of the egress secrets in the data dir, 0600: the key that seals
// their values (kept out of the database, so that a copy of it alone
// opens nothing) and the CA whose leaves the egress gate answers TLS with
// for a secret's hosts.
const (
	secretsKeyFile = "secrets.key"
	egressCACert   = "egress-ca.pem"
	egressCAKey    = "egress-ca.key"
)

// openSecrets makes the egress secrets: their sealing key, their values
// opened in memory, the CA every guest trusts for intercepted hosts. It
// runs before the manager, whose sandboxes get the placeholders and whose
// gates do the swap.
func (s *server) openSecrets(ctx context.Context) error {
	o := s.o
	keyPath := o.secretsKeyFile
	if keyPath == "" {
		keyPath = filepath.Join(o.dataDir, secretsKeyFile)
	}
	key, err := secrets.LoadOrCreateKey(keyPath)
	if err != nil {
		return err
	}
	sealer, err := secrets.NewSealer(key)
	if err != nil {
		return err
	}
	s.sealer = sealer // webhooks' signing secrets are sealed by it too
	s.secrets = secrets.New(secrets.Config{Store: s.st, Sealer: sealer, Logger: s.log,
		// Running sandboxes get the change within moments, off the
		// request that made it: a wedged guest holds up no answer.
		Changed: func(owners []string) {
			if mgr := s.fencedMgr.Load(); mgr != nil {
				go mgr.Secrets.Apply(context.Background(), owners)
			}
		}})
	if _, err := s.secrets.Load(ctx); err != nil {
		return fmt.Errorf("loading egress secrets: %w", err)
	}
	auth, err := s.openEgressCAs(ctx, sealer)
	if err != nil {
		return err
	}
	roots, err := upstreamRoots(o.egressUpstreamCAFile)
	if err != nil {
		return err
	}
	s.egress.op.Intercept = &egress.Interception{Authority: auth, Roots: roots}
	// Guests trust the operator's CAs and the egress CAs in force; a
	// boot is configured with those of the start, and a rotation sends
	// running guests the new set.
	operator := s.egress.cas
	s.egress.trust = func() string { return operator + auth.Bundle() }
	s.egress.cas = s.egress.trust()
	return nil
}

// openEgressCAs opens the egress CAs kept in the store (seeded, the first
// time, with the CA this server or cluster made before they were kept
// there). A node whose secrets key is not the one they were sealed under
// gets a CA of its own, which it cannot rotate.
func (s *server) openEgressCAs(ctx context.Context, sealer *secrets.Sealer) (*egress.Authority, error) {
	seed := func(ctx context.Context) (*egress.CA, error) {
		if s.isNode {
			return clusterEgressCA(ctx, s.st, sealer)
		}
		return loadOrCreateCA(s.o.dataDir)
	}
	cas, err := secrets.OpenCAs(ctx, secrets.CAConfig{Store: s.st, Sealer: sealer, Seed: seed, Logger: s.log,
		Changed: func() {
			if mgr := s.fencedMgr.Load(); mgr != nil {
				go mgr.Secrets.Apply(context.Background(), nil)
			}
		}})
	if err == nil {
		s.cas = cas
		return cas.Authority(), nil
	}
	if !errors.Is(err, secrets.ErrOtherKey) && !errors.Is(err, errOtherSecretsKey) {
		return nil, err
	}
	// Egress secrets need one key on every node anyway (their values are
	// sealed by it); without it this node's guests trust a CA of its own,
	// which a moved sandbox does not.
	s.log.Warn("egress secrets: this server's secrets key is not the one the egress CAs were sealed under; give every node the same --secrets-key-file", "err", err)
	ca, err := loadOrCreateCA(s.o.dataDir)
	if err != nil {
		return nil, err
	}
	return egress.NewAuthority(ca), nil
}

// loadOrCreateCA reads the egress CA in dataDir, or makes one there.
func loadOrCreateCA(dataDir string) (*egress.CA, error) {
	certPath, keyPath := filepath.Join(dataDir, egressCACert), filepath.Join(dataDir, egressCAKey)
	cert, cerr := os.ReadFile(certPath)
	key, kerr := os.ReadFile(keyPath)
	if cerr == nil && kerr == nil {
		ca, err := egress.LoadCA(cert, key)
		if err != nil {
			return nil, fmt.Errorf("egress CA in %s: %w", dataDir, err)
		}
		return ca, nil
	}
	if !errors.Is(cerr, os.ErrNotExist) && cerr != nil {
		return nil, fmt.Errorf("reading the egress CA: %w", cerr)
	}
	ca, err := egress.NewCA()
	if err != nil {
		return nil, err
	}
	cert, key = ca.PEM()
	// The key first: a crash between the two leaves no certificate, and
	// the next start makes both again.
	if err := writeFileAtomic(keyPath, key, 0o600); err != nil {
		return nil, fmt.Errorf("writing the egress CA: %w", err)
	}
	if err := writeFileAtomic(certPath, cert, 0o600); err != nil {
		return nil, fmt.Errorf("writing the egress CA: %w", err)
	}
	return ca, nil
}

// caRefresh is how often a server reads the egress CAs for a rotation
// made on another node, or a retirement come.
const caRefresh = 5 * time.Second

// errOtherSecretsKey: the cluster's egress CA was sealed under another
// secrets key than this node's.
var errOtherSecretsKey = errors.New("the cluster's egress CA does not open with this node's secrets key")

// clusterEgressCA is the egress CA of a cluster's nodes, shared through
// the store sealed under the secrets key, so that a sandbox moved to
// another node still trusts the leaves its gate answers with. A node
// whose key differs cannot open it (errOtherSecretsKey): every node needs
// the same --secrets-key-file.
func clusterEgressCA(ctx context.Context, st *store.Store, sealer *secrets.Sealer) (*egress.CA, error) {
	const owner, name = "cluster", "egress-ca"
	sealed, err := st.ClusterSetting(ctx, name, func() (string, error) {
		ca, err := egress.NewCA()
		if err != nil {
			return "", err
		}
		cert, key := ca.PEM()
		b, err := json.Marshal(map[string]string{"cert": string(cert), "key": string(key)})
		if err != nil {
			return "", err
		}
		return sealer.Seal(owner, name, string(b)), nil
	})
	if err != nil {
		return nil, fmt.Errorf("the cluster's egress CA: %w", err)
	}
	opened, err := sealer.Open(owner, name, sealed)
	if err != nil {
		return nil, errOtherSecretsKey
	}
	var pems map[string]string
	if err := json.Unmarshal([]byte(opened), &pems); err != nil {
		return nil, fmt.Errorf("the cluster's egress CA: %w", err)
	}
	return egress.LoadCA([]byte(pems["cert"]), []byte(pems["key"]))
}

// upstreamRoots are the host's roots and --egress-upstream-ca-file's,
// which verify the far end of an intercepted connection.
func upstreamRoots(file string) (*x509.CertPool, error) {
	if file == "" {
		return nil, nil
	}
	pool, err := x509.SystemCertPool()
	if err != nil {
		pool = x509.NewCertPool()
	}
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("--egress-upstream-ca-file: %w", err)
	}
	if !pool.AppendCertsFromPEM(b) {
		return nil, fmt.Errorf("--egress-upstream-ca-file: %s holds no PEM certificate", file)
	}
	return pool, nil
}

// secretsOfSandboxes is what the manager's sandboxes get of the egress
// secrets: the placeholders, and each gate's swapper.
func (s *server) secretsOfSandboxes(cfg *sandbox.Config) {
	svc, st := s.secrets, s.st
	cfg.SecretEnv = svc.Env
	cfg.Swapper = func(id string, event func(typ, msg string, data map[string]any)) egress.Swapper {
		lookup := func(ctx context.Context, id string) (string, map[string]string, error) {
			sb, err := st.GetSandbox(ctx, id)
			if err != nil {
				return "", nil, err
			}
			return sb.OwnerKeyID, sb.Labels, nil
		}
		return svc.Swapper(id, lookup, func(u secrets.Use) {
			data := map[string]any{"secret": u.Name, "host": u.Host, "method": u.Method, "path": u.Path}
			if u.Used {
				event("secret_used", "egress secret "+u.Name+" sent to "+u.Host, data)
				return
			}
			data["reason"] = u.Reason
			why := "its rules do not allow the request"
			if u.Reason == "budget" {
				why = "this sandbox's budget for the hour is spent"
			}
			event("secret_refused", "egress secret "+u.Name+" withheld from "+u.Host+": "+why, data)
		})
	}
}

// egressCAs are the egress CAs as the API serves them: a rotation is sent
// to this node's running guests before it is answered (other nodes' take
// it up within caRefresh), and the status counts this node's guests.
type egressCAs struct {
	cas *secrets.CAs
	mgr *sandbox.Manager
}

func (e egressCAs) Status(ctx context.Context) []secrets.CAInfo {
	return e.cas.Status(e.mgr.Secrets.Trusted(ctx))
}

func (e egressCAs) Rotate(ctx context.Context, keep time.Duration) (*secrets.Rotation, error) {
	rot, err := e.cas.Rotate(ctx, keep)
	if err != nil {
		return nil, err
	}
	e.mgr.Secrets.Apply(ctx, nil)
	if st := e.Status(ctx); len(st) > 0 {
		rot.New, rot.Previous = st[len(st)-1], st[:len(st)-1]
	}
	return rot, nil
}
