package main

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"time"

	"github.com/emberbox/emberbox/internal/api"
	"github.com/emberbox/emberbox/internal/apistore"
	"github.com/emberbox/emberbox/internal/computer"
	"github.com/emberbox/emberbox/internal/console"
	"github.com/emberbox/emberbox/internal/e2b"
	"github.com/emberbox/emberbox/internal/envd"
	"github.com/emberbox/emberbox/internal/links"
	"github.com/emberbox/emberbox/internal/upload"
)

// openUploads makes the API's upload staging. Staging files a crash left
// behind are removed here, and expired uploads by the sweep.
func (s *server) openUploads(context.Context) error {
	uploads, err := api.NewUploads(upload.Config{Dir: filepath.Join(s.o.dataDir, "uploads"), Logger: s.log})
	if err != nil {
		return fmt.Errorf("upload staging: %w", err)
	}
	s.uploads = uploads
	s.bg.run(uploads.Run)
	return nil
}

// openLinks makes the signer of file links. Its key is made once and
// kept: links stay valid across restarts until they expire or are
// revoked. A cluster's nodes share one, kept in the store, so any node
// opens any link.
func (s *server) openLinks(ctx context.Context) error {
	linkKey, err := signingKey(ctx, s.cl, s.st, filepath.Join(s.o.dataDir, "link.key"), "link-key")
	if err != nil {
		return err
	}
	s.signer, err = links.NewSigner(linkKey, s.st, nil)
	return err
}

// buildAPI makes the Runtime API's handler and its previews.
func (s *server) buildAPI(context.Context) error {
	// One set of rate buckets for the Runtime API and E2B's front: a
	// caller's rate is one whichever protocol it speaks.
	s.limiter = api.NewRateLimiter(s.adm.rates)
	drv, metrics := s.drv, s.metrics
	acfg := api.Config{
		Manager: api.Manager{Sandboxes: s.mgr, Power: s.mgr, Switcher: s.mgr.Switcher, Snapshots: s.mgr.Snapshots, Checkpoints: s.mgr.Checkpoints,
			Usage: s.mgr.Meter, Guests: s.mgr, Previews: s.mgr.Previews, Network: s.mgr.Networks},
		Keys: apistore.Keys{Store: s.st}, Idempotency: apistore.Idempotency{Store: s.st}, Events: apistore.Events{Store: s.st},
		Logger: s.log, Version: version, Accel: drv.Accel,
		Confinement: func() any { return drv.Confinement() },
		Uploads:     s.uploads, Limiter: s.limiter, ObserveRequest: metrics.ObserveRequest,
		Metrics: metrics.Handler(), PreviewDomain: s.o.previewDomain, Links: s.signer,
		Interpreter: s.interp, Computer: computer.New(s.log), Volumes: s.vols, Images: s.imgs, Webhooks: s.hooks, Secrets: s.secrets,
	}
	if s.cas != nil {
		acfg.EgressCAs = egressCAs{cas: s.cas, mgr: s.mgr}
	}
	if s.isNode {
		acfg.Volumes, acfg.Images, acfg.Nodes = nil, nil, s.st
		if s.cl != nil {
			acfg.Nodes = s.cl // the store's view, with this node's suspicions
		}
	}
	s.handler, s.previews = api.NewWithPreviews(acfg)
	return nil
}

// serveMetrics serves the metrics without a key on --metrics-listen, if
// given.
func (s *server) serveMetrics(context.Context) error {
	if s.o.metricsListen == "" {
		return nil
	}
	mln, err := net.Listen("tcp", s.o.metricsListen)
	if err != nil {
		return fmt.Errorf("--metrics-listen: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", s.metrics.Handler())
	msrv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	s.bg.run(func(context.Context) { _ = msrv.Serve(mln) })
	s.bg.run(func(ctx context.Context) { <-ctx.Done(); _ = msrv.Close() })
	s.log.Info("metrics serving", "addr", "http://"+mln.Addr().String()+"/metrics")
	return nil
}

// listen opens the API's listener.
func (s *server) listen(context.Context) error {
	ln, err := net.Listen("tcp", s.o.listen)
	if err != nil {
		return err
	}
	s.ln = ln
	return nil
}

// buildFront puts the web console beside the API and E2B's front before
// both.
func (s *server) buildFront(ctx context.Context) error {
	// No ReadTimeout or WriteTimeout: exec streams and transfers may run
	// for hours.
	// The web console is a client of the API, served beside it; /v1 and
	// everything else stay the API's, with its one error shape.
	root := http.NewServeMux()
	root.Handle(console.Prefix, console.Handler())
	root.Handle("/", s.handler)
	// E2B's protocol shares the listener: its sandbox traffic is told by
	// headers (or host names under --e2b-domain), its control plane by paths
	// that are not the Runtime API's. Its tokens' key, like the links',
	// is the cluster's in a cluster.
	e2bKey, err := signingKey(ctx, s.cl, s.st, filepath.Join(s.o.dataDir, "e2b.key"), "e2b-key")
	if err != nil {
		return err
	}
	tokens, err := e2b.NewTokens(e2bKey)
	if err != nil {
		return err
	}
	log := s.log
	s.front = e2b.New(e2b.Config{
		Manager: s.mgr, Network: s.mgr.Networks, Keys: apistore.Keys{Store: s.st}, Tokens: tokens, Limiter: s.limiter, Idempotency: apistore.Idempotency{Store: s.st}, Domain: s.o.e2bDomain,
		EnvdVersion: envd.Version, Envd: envd.New(log), Interpreter: s.interp.E2BHandler(), Next: root, Logger: log,
	})
	return nil
}

// checkDomains checks --preview-domain, and that it and --e2b-domain are
// not one under the other: each serves every host name below it.
func checkDomains(previewDomain, e2bDomain string) error {
	p, err := api.PreviewDomainName(previewDomain)
	if err != nil {
		return fmt.Errorf("--preview-domain: %w", err)
	}
	e := strings.ToLower(strings.TrimSuffix(e2bDomain, "."))
	if e != "" && (e == p || strings.HasSuffix(e, "."+p) || strings.HasSuffix(p, "."+e)) {
		return fmt.Errorf("--e2b-domain %q and the preview domain %q overlap: give each a domain of its own", e2bDomain, p)
	}
	return nil
}

// previewFront serves the hosts of previews with previews, everything
// else with next.
func previewFront(previews api.Previews, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, ok := previews.Target(r); ok {
			previews.ServeHTTP(w, r)
			return
		}
		next.ServeHTTP(w, r)
	})
}
