package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/emberbox/emberbox/internal/api"
	"github.com/emberbox/emberbox/internal/cluster"
	"github.com/emberbox/emberbox/internal/links"
	"github.com/emberbox/emberbox/internal/store"
)

// clusterOptions are the flags of a node of a cluster (--store
// postgres://…); docs/cluster.md.
type clusterOptions struct {
	nodeID    string
	listen    string
	advertise string
	heartbeat time.Duration
	timeout   time.Duration
	stopDrain time.Duration
	caCert    string
	caKey     string
}

func addClusterFlags(f *pflag.FlagSet, o *clusterOptions) {
	host, _ := os.Hostname()
	f.StringVar(&o.nodeID, "node-id", host, "this node's id in a cluster (default: the host name)")
	f.StringVar(&o.listen, "cluster-listen", ":7443", "address of the node-to-node channel (mutual TLS) in a cluster")
	f.StringVar(&o.advertise, "cluster-advertise", "", "host:port other nodes dial this node's channel at (default: the --cluster-listen address; its port with the host name's first address when it names no host)")
	f.DurationVar(&o.heartbeat, "node-heartbeat", 2*time.Second, "how often a node of a cluster says it is alive")
	f.DurationVar(&o.timeout, "node-timeout", 15*time.Second, "how long a node may be silent before the others declare it lost and stop its sandboxes (node_lost)")
	f.DurationVar(&o.stopDrain, "stop-drain-timeout", 10*time.Minute, "how long a node of a cluster asked to stop may take to move its running sandboxes to other nodes first (0: none move; they stop with it)")
	f.StringVar(&o.caCert, "cluster-ca-cert", "", "PEM certificate of the cluster's CA (with --cluster-ca-key; default: the first node makes one and keeps it in the store)")
	f.StringVar(&o.caKey, "cluster-ca-key", "", "PEM EC private key of the cluster's CA")
}

// clustered reports whether the store URL makes this server a node of a
// cluster: a store shared with other servers.
func clustered(storeURL string) bool {
	return strings.HasPrefix(storeURL, "postgres://") || strings.HasPrefix(storeURL, "postgresql://")
}

var nodeIDChars = func(r rune) bool {
	return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_' || r == '.')
}

// advertised is the address other nodes dial.
func (o clusterOptions) advertised() (string, error) {
	addr := o.advertise
	if addr == "" {
		addr = o.listen
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", fmt.Errorf("--cluster-advertise %q: %w", addr, err)
	}
	if host == "" || host == "0.0.0.0" || host == "::" {
		name, err := os.Hostname()
		if err != nil {
			return "", fmt.Errorf("--cluster-advertise: %w", err)
		}
		addrs, err := net.LookupHost(name)
		if err != nil || len(addrs) == 0 {
			return "", fmt.Errorf("--cluster-advertise: the host name %s has no address; give one", name)
		}
		host = addrs[0]
	}
	return net.JoinHostPort(host, port), nil
}

// clusterCA is the CA from the flags, else the one the store keeps (made
// by the first node that asks).
func clusterCA(ctx context.Context, o clusterOptions, st *store.Store) (*cluster.CA, error) {
	if (o.caCert == "") != (o.caKey == "") {
		return nil, errors.New("--cluster-ca-cert and --cluster-ca-key go together")
	}
	if o.caCert != "" {
		cert, err := os.ReadFile(o.caCert)
		if err != nil {
			return nil, fmt.Errorf("--cluster-ca-cert: %w", err)
		}
		key, err := os.ReadFile(o.caKey)
		if err != nil {
			return nil, fmt.Errorf("--cluster-ca-key: %w", err)
		}
		return cluster.ParseCA(append(append(cert, '\n'), key...))
	}
	pem, err := st.ClusterSetting(ctx, "ca", func() (string, error) {
		ca, err := cluster.NewCA()
		if err != nil {
			return "", err
		}
		return ca.PEM, nil
	})
	if err != nil {
		return nil, err
	}
	return cluster.ParseCA([]byte(pem))
}

// joinCluster registers this server as a node (before its manager
// recovers: what it recovers is this node's).
func joinCluster(ctx context.Context, o serveOptions, st *store.Store, adm admissionSettings, accel, digest string,
	fenced func(error), log *slog.Logger) (*cluster.Cluster, error) {
	co := o.cluster
	if co.nodeID == "" || len(co.nodeID) > 63 || strings.IndexFunc(co.nodeID, nodeIDChars) >= 0 {
		return nil, fmt.Errorf("--node-id %q: want 1 to 63 of a-z A-Z 0-9 - _ .", co.nodeID)
	}
	addr, err := co.advertised()
	if err != nil {
		return nil, err
	}
	ca, err := clusterCA(ctx, co, st)
	if err != nil {
		return nil, err
	}
	return cluster.Join(ctx, cluster.Config{
		Store: cluster.Store{Nodes: st, Sandboxes: st}, CA: ca, Heartbeat: co.heartbeat, Timeout: co.timeout, Logger: log, Fenced: fenced,
		Self: cluster.Node{ID: co.nodeID, Address: addr, APIURL: "http://" + o.listen,
			MemoryMiB: adm.capacity.MemoryMiB, OverheadMiB: adm.overhead, VCPUs: adm.capacity.VCPU,
			Accel: accel, Images: []string{digest}, Version: version},
	})
}

// signingKey is the key of signed links or E2B's tokens: kept at path on
// a server of its own, and shared through the store (setting name) by a
// cluster's nodes, so that what one node signs any node opens.
func signingKey(ctx context.Context, cl *cluster.Cluster, st *store.Store, path, name string) ([]byte, error) {
	if cl == nil {
		return links.LoadKey(path)
	}
	v, err := st.ClusterSetting(ctx, name, func() (string, error) {
		key := make([]byte, links.KeyBytes)
		if _, err := rand.Read(key); err != nil {
			return "", err
		}
		return hex.EncodeToString(key), nil
	})
	if err != nil {
		return nil, fmt.Errorf("the cluster's %s: %w", name, err)
	}
	key, err := hex.DecodeString(v)
	if err != nil || len(key) < links.KeyBytes {
		return nil, fmt.Errorf("the cluster's %s is not %d hex-encoded bytes", name, links.KeyBytes)
	}
	return key, nil
}

// linkTarget names the sandbox of a signed link, /v1/links/{token}, from
// its checked claims.
func linkTarget(signer *links.Signer) cluster.Target {
	return func(r *http.Request) (string, bool) {
		token, ok := strings.CutPrefix(r.URL.Path, "/v1/links/")
		if !ok || token == "" {
			return "", false
		}
		c, err := signer.Open(r.Context(), token)
		if err != nil {
			return "", false // the API answers it
		}
		return c.SandboxID, false
	}
}

// joinIfNode joins the cluster when the store makes this server a node:
// before the manager recovers, since what it recovers is this node's.
func (s *server) joinIfNode(ctx context.Context) error {
	if !s.isNode {
		return nil
	}
	fenced := func(err error) {
		if m := s.fencedMgr.Load(); m != nil {
			m.Moves.StandDown(context.WithoutCancel(ctx))
		}
		s.standDown(fmt.Errorf("this node was declared lost by the cluster and stood down: %w", err))
	}
	cl, err := joinCluster(ctx, s.o, s.st, s.adm, s.drv.Accel(), s.boot.RecipeHash, fenced, s.log)
	if err != nil {
		return err
	}
	s.cl = cl
	return nil
}

// endLostVMs ends, on a node, the VMs of sandboxes the other nodes
// declared lost while it was away, before anything else: none runs twice.
func (s *server) endLostVMs(ctx context.Context) error {
	if s.cl == nil {
		return nil
	}
	lost, err := s.st.LostSandboxes(ctx)
	if err != nil {
		return err
	}
	if n := s.mgr.Moves.EndVMs(ctx, lost); n > 0 {
		s.log.Warn("ended vms of sandboxes the cluster declared lost", "count", n)
	}
	// Files of paused sandboxes a drain moved away just before this
	// node died.
	if _, err := s.mgr.Moves.RemoveMovedAway(ctx, s.st.MovedAway); err != nil {
		return err
	}
	return nil
}

// routeCluster serves previews on their own hosts and, on a node, routes
// each call to the node of its sandbox and serves the node-to-node
// channel.
func (s *server) routeCluster(context.Context) error {
	// A preview's host is its own origin: nothing but the preview is served
	// there, and no preview anywhere else.
	local := previewFront(s.previews, s.front)
	s.served = local
	cl, previews := s.cl, s.previews
	if cl == nil {
		return nil
	}
	// Any node answers any call: creates (the Runtime API's and
	// E2B's) are placed, calls for another node's sandbox (its
	// routes, E2B's traffic and control plane, its previews and
	// signed links) go there over the channel, which serves the
	// server itself (never routed again).
	routed := cl.Handler(s.front, s.front.Target, linkTarget(s.signer))
	s.served = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if id, ok := previews.Target(r); ok {
			cl.RouteSandbox(w, r, previews, id)
			return
		}
		routed.ServeHTTP(w, r)
	})
	cln, err := net.Listen("tcp", s.o.cluster.listen)
	if err != nil {
		return fmt.Errorf("--cluster-listen: %w", err)
	}
	log := s.log
	s.bg.run(func(ctx context.Context) {
		if err := cl.Serve(ctx, cln, local); err != nil {
			log.Error("node-to-node channel", "err", err)
		}
	})
	s.bg.run(cl.Run)
	mgr := s.mgr
	cl.SetSnapshots(mgr.Snapshots)
	s.bg.run(func(ctx context.Context) { cl.RunDrain(ctx, mgr.Moves) })
	// A Runtime API call is authenticated and rate-limited here, at
	// the node the client reached, before it is forwarded; the channel
	// carries the client's address, so the serving node's limits
	// count the client, not this node.
	cl.SetAdmit(api.Admit(s.handler))
	return nil
}
