package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/emberbox/emberbox/internal/admission"
	"github.com/emberbox/emberbox/internal/api"
	"github.com/emberbox/emberbox/internal/catalog"
	"github.com/emberbox/emberbox/internal/cluster"
	"github.com/emberbox/emberbox/internal/console"
	"github.com/emberbox/emberbox/internal/e2b"
	"github.com/emberbox/emberbox/internal/egress"
	"github.com/emberbox/emberbox/internal/envd"
	"github.com/emberbox/emberbox/internal/faultpoint"
	"github.com/emberbox/emberbox/internal/guestimage"
	"github.com/emberbox/emberbox/internal/interpreter"
	"github.com/emberbox/emberbox/internal/links"
	"github.com/emberbox/emberbox/internal/ociimport"
	"github.com/emberbox/emberbox/internal/pricing"
	"github.com/emberbox/emberbox/internal/recipebuild"
	"github.com/emberbox/emberbox/internal/sandbox"
	"github.com/emberbox/emberbox/internal/store"
	"github.com/emberbox/emberbox/internal/telemetry"
	"github.com/emberbox/emberbox/internal/tsc"
	"github.com/emberbox/emberbox/internal/upload"
	"github.com/emberbox/emberbox/internal/vmm/qemu"
	"github.com/emberbox/emberbox/internal/volumes"
)

const (
	dbName       = "emberbox.db"
	adminKeyFile = "admin.key"
)

type serveOptions struct {
	listen      string
	dataDir     string
	storeURL    string
	cluster     clusterOptions
	cacheDir    string
	agentBinary string
	bootTimeout time.Duration
	noKVM       bool
	logLevel    string
	memoryLimit string

	unconfined   bool
	uidBase      int
	uidCount     int
	cgroupParent string

	egressDefault        string
	egressOpen           []string
	egressResolve        []string
	diskRetention        time.Duration
	templates            bool
	imageTemplates       int
	imageBuilds          int
	registryAllowPrivate bool
	contextChunks        contextChunkOptions
	egressMax            []string
	egressDeny           []string
	extraCAFile          string

	limits limitOptions

	rates         pricing.Rates
	meterInterval time.Duration
	metricsListen string
	previewDomain string
	e2bDomain     string
}

// hostCABundle is passed to guests by default, so that they trust what the
// host trusts (a TLS-inspecting proxy's CA included).
const hostCABundle = "/etc/ssl/certs/ca-certificates.crt"

func newServeCommand() *cobra.Command {
	var o serveOptions
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Run the API server and the sandboxes' VMs",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return serve(cmd.Context(), o)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.listen, "listen", "127.0.0.1:8080", "address to serve the API on")
	f.StringVar(&o.dataDir, "data-dir", defaultDataDir(), "where the database, keys and sandbox disks live")
	f.StringVar(&o.storeURL, "store", "", storeUsage+"; a node of a cluster when it is PostgreSQL (docs/cluster.md)")
	addClusterFlags(f, &o.cluster)
	f.StringVar(&o.cacheDir, "cache-dir", "", "image cache directory (default ~/.cache/emberbox)")
	f.StringVar(&o.agentBinary, "agent-binary", "", "emberbox-agent binary to boot (default: beside this binary)")
	f.IntVar(&o.imageBuilds, "image-builds", 1, "image builds run at once (each in a sandbox VM)")
	f.BoolVar(&o.registryAllowPrivate, "registry-allow-private", false,
		"let image imports pull from registries on loopback, private and link-local addresses (refused by default: tenants name the registry)")
	f.Int64Var(&o.contextChunks.quotaMiB, "image-context-quota-mib", catalog.DefaultChunkBytesPerKey>>20,
		"MiB of uploaded image context and archive chunks one API key keeps (429 quota_exceeded past it)")
	f.IntVar(&o.contextChunks.quotaChunks, "image-context-quota-chunks", catalog.DefaultChunksPerKey,
		"image context and archive chunks (1 MiB each at most) one API key keeps (429 quota_exceeded past it)")
	f.Int64Var(&o.contextChunks.reserveMiB, "image-context-reserve-mib", upload.DefaultFreeReserve>>20,
		"free space a context chunk upload must leave on the data dir's filesystem (409 storage_full below it)")
	f.BoolVar(&o.templates, "templates", true, "create sandboxes by restoring a template of their shape (made once, from a booted guest) instead of booting each")
	f.IntVar(&o.imageTemplates, "image-templates", sandbox.DefaultImageTemplates,
		"custom images' templates kept (each made at the image's first create, a few hundred MiB; the least recently used unused one goes first); 0: custom images' creates boot")
	f.DurationVar(&o.bootTimeout, "boot-timeout", 90*time.Second, "bound on one boot attempt; a create makes at most two")
	f.BoolVar(&o.noKVM, "no-kvm", false, "use software emulation even where /dev/kvm works")
	addConfineFlags(f, &o)
	f.StringVar(&o.logLevel, "log-level", "info", "debug, info, warn or error")
	f.StringVar(&o.memoryLimit, "memory-limit", "", `the server's soft memory limit (Go's GOMEMLIMIT), e.g. 512MiB, or "off" (default: $GOMEMLIMIT, else a quarter of the host's memory, 256 MiB to 1 GiB)`)
	f.DurationVar(&o.diskRetention, "stopped-disk-retention", sandbox.DefaultStoppedDiskRetention,
		"how long a stopped sandbox keeps its disk before its files are removed (the record stays); negative: forever")
	f.StringVar(&o.egressDefault, "egress-default", "internet", `egress of sandboxes created without a network policy: "internet" (public addresses) or "off"`)
	f.StringArrayVar(&o.egressOpen, "egress-open", nil, "open a private address or CIDR to sandboxes (repeatable; e.g. a test range)")
	f.StringArrayVar(&o.egressResolve, "egress-resolve", nil, "resolve a name to addresses for sandboxes, name=ip[,ip] (repeatable; for tests)")
	f.StringSliceVar(&o.egressMax, "egress-max", nil, `ceiling of every sandbox's egress: rules a tenant policy is intersected with `+
		`(domain, *.domain, IP, CIDR; "!rule" denies; "off" for none; comma-separated or repeated)`)
	f.StringSliceVar(&o.egressDeny, "egress-deny-cidr", nil, "refuse an address or CIDR to every sandbox, even where --egress-open admits it (repeatable)")
	defCA := ""
	if _, err := os.Stat(hostCABundle); err == nil {
		defCA = hostCABundle
	}
	f.StringVar(&o.extraCAFile, "extra-ca-file", defCA, `PEM bundle every sandbox trusts besides its own roots ("" for none)`)
	addLimitFlags(cmd, &o.limits)
	o.rates = pricing.DefaultRates()
	f.StringVar(&o.rates.CPUPerVCPUHour, "price-cpu", o.rates.CPUPerVCPUHour, "dollars per busy vCPU-hour (docs/pricing.md)")
	f.StringVar(&o.rates.MemoryPerGiBHour, "price-memory", o.rates.MemoryPerGiBHour, "dollars per reserved GiB-hour while running")
	f.StringVar(&o.rates.CPUFloorVCPU, "price-cpu-floor", o.rates.CPUFloorVCPU, "vCPUs billed at least, per sandbox and hour running")
	f.StringVar(&o.rates.StoragePerGBMonth, "price-storage", o.rates.StoragePerGBMonth, "dollars per GB-month of kept disk (paused or stopped)")
	f.StringVar(&o.rates.SnapshotPerGiBHour, "price-snapshot", o.rates.SnapshotPerGiBHour, "dollars per GiB-hour of snapshots")
	f.StringVar(&o.rates.EgressPerGB, "price-egress", o.rates.EgressPerGB, "dollars per GB of egress past the monthly allowance")
	f.DurationVar(&o.meterInterval, "meter-interval", sandbox.DefaultMeterInterval, "how often running sandboxes' CPU and memory are read")
	f.StringVar(&o.previewDomain, "preview-domain", "", "serve each preview on its own host, <port>-<sandboxID>.<domain>: a domain with a wildcard DNS record "+
		"and certificate (https), or a URL with scheme and port (http://preview.test:8080); default: localhost on the server's port (no DNS needed)")
	f.StringVar(&o.e2bDomain, "e2b-domain", "", "also route E2B sandbox traffic by host name, {port}-{sandboxID}.<domain> (E2B_DOMAIN of the SDKs; needs wildcard DNS); the E2b-Sandbox-Id and E2b-Sandbox-Port headers always work")
	f.StringVar(&o.metricsListen, "metrics-listen", "", `also serve Prometheus metrics without a key at /metrics on this address, e.g. 127.0.0.1:9464 `+
		`(the API's /metrics needs an admin key)`)
	return cmd
}

func serve(ctx context.Context, o serveOptions) error {
	var level slog.Level
	if err := level.UnmarshalText([]byte(o.logLevel)); err != nil {
		return fmt.Errorf("--log-level: %w", err)
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	if err := checkDomains(o.previewDomain, o.e2bDomain); err != nil {
		return err
	}
	memLimit, err := setMemoryLimit(o.memoryLimit)
	if err != nil {
		return err
	}
	log.Info("memory limit", "bytes", memLimit)

	if err := os.MkdirAll(o.dataDir, 0o700); err != nil {
		return fmt.Errorf("creating data dir: %w", err)
	}
	dsn := storeDSN(o.storeURL, o.dataDir)
	isNode := clustered(dsn)
	st, err := store.Open(ctx, dsn)
	if err != nil {
		return err
	}
	defer st.Close()
	// A node the others declare lost stands down: its VMs end and serve
	// returns the cause.
	ctx, standDown := context.WithCancelCause(ctx)
	defer standDown(nil)
	if err := ensureAdminKey(ctx, st, o.dataDir, log); err != nil {
		return err
	}
	// A pending idempotency record now was left by a server that died
	// mid-request (no request of this one has started): a create that had
	// recorded its sandbox answers its retry with that sandbox, any other
	// key is freed for the retry to run.
	// In a cluster other nodes' requests are pending too: their records
	// are left to the hourly prune.
	if isNode {
	} else if resolved, released, err := st.ResolvePendingIdempotency(ctx); err != nil {
		return err
	} else if resolved+released > 0 {
		log.Info("settled idempotency keys left pending by the previous run", "creates_resolved", resolved, "released", released)
	}

	boot, err := bootFiles(ctx, o, log)
	if err != nil {
		return err
	}
	khz, err := tsc.KHz()
	if err != nil {
		log.Warn("could not measure the host TSC rate; TCG guests may boot slowly", "err", err)
	}
	drv, err := qemu.New(driverConfig(o, khz, boot.Kernel, boot.ProbeCache, log))
	if err != nil {
		return err
	}
	conf := drv.Confinement()
	log.Info("vm driver", "driver", drv.Name(), "accel", drv.Accel(), "tsc_khz", khz)
	if conf.Confined {
		log.Info("vms confined", "uids", conf.UIDRange, "cgroup_version", conf.Cgroup.Version,
			"cgroup_controllers", conf.Cgroup.Controllers, "seccomp", conf.Seccomp)
	} else {
		log.Warn("VMS RUN UNCONFINED (--unconfined): as root, without seccomp, namespaces, chroot or cgroups; a guest that escapes QEMU owns this host")
	}

	ecfg, err := egressConfig(o)
	if err != nil {
		return err
	}
	adm, err := o.limits.build(o.dataDir, log)
	if err != nil {
		return err
	}
	if err := o.rates.Validate(); err != nil {
		return fmt.Errorf("prices: %w", err)
	}
	if o.meterInterval < time.Second {
		return fmt.Errorf("--meter-interval must be at least 1s")
	}
	metrics := telemetry.New()
	// Volumes serve the manager (streams, create-time attaches) and use it
	// (guests): made first, told of the manager after.
	// Their sizes are held in the admission ledger beside sandboxes' disks.
	vols := volumes.New(volumes.Config{Store: st, Backups: st, DataDir: o.dataDir, Logger: log,
		Admission: adm.ledger, BackupQuota: o.limits.backupQuota, DiskReserveMiB: o.limits.diskReserveMiB,
		DiskFreeMiB: func() (int64, error) { return admission.DiskFreeMiB(o.dataDir) }})
	// A node of a cluster offers no volumes (their files would be on one
	// node); the store's are not this node's to hold.
	if !isNode {
		if err := vols.Recover(ctx); err != nil {
			return err
		}
	}
	if o.imageBuilds < 1 || o.imageBuilds > 16 {
		return fmt.Errorf("--image-builds must be from 1 to 16")
	}
	// The image catalog: its start commands run before a sandbox of an
	// image is running (a Preparer of the manager).
	chunks, err := o.contextChunks.limits()
	if err != nil {
		return err
	}
	imgs, err := catalog.New(catalog.Config{Store: catalog.Store{ImageRecords: st, ImageTags: st, ImageHolders: st, BuildLogs: st}, Events: st, DataDir: o.dataDir, Builds: o.imageBuilds, BuildsPerKey: o.limits.buildsPerKey, Logger: log,
		DiskFreeMiB: func() (int64, error) { return admission.DiskFreeMiB(o.dataDir) }, DiskReserveMiB: o.limits.diskReserveMiB,
		DefaultRootfs: boot.Rootfs, DefaultDigest: boot.RecipeHash, Chunks: chunks})
	if err != nil {
		return err
	}
	var cl *cluster.Cluster
	var fencedMgr atomic.Pointer[sandbox.Manager]
	fenced := func(err error) {
		if m := fencedMgr.Load(); m != nil {
			m.StandDown(context.WithoutCancel(ctx))
		}
		standDown(fmt.Errorf("this node was declared lost by the cluster and stood down: %w", err))
	}
	if isNode {
		if cl, err = joinCluster(ctx, o, st, adm, drv.Accel(), boot.RecipeHash, fenced, log); err != nil {
			return err
		}
	}
	mcfg := sandbox.Config{
		// Volumes attach before an image's start command runs, which may
		// use them.
		Volumes: vols, Preparers: []sandbox.Preparer{vols, imgs.Preparer()},
		Store: st, Driver: drv, Boot: boot.BootFiles, DataDir: o.dataDir, Logger: log, BootTimeout: o.bootTimeout,
		Egress: ecfg.op, EgressDefault: ecfg.def, ExtraCAs: ecfg.cas, StoppedDiskRetention: o.diskRetention,
		Templates: o.templates, ImageTemplates: imageTemplates(o.imageTemplates), MemoryFloorMiB: o.limits.memoryFloorMiB,
		Admission: adm.ledger, Limits: adm.limits,
		Rates: o.rates, MeterInterval: o.meterInterval, Observer: metrics,
	}
	if isNode {
		// Built images and volumes keep their files on the node that made
		// them, and the cluster places no sandbox by them yet: a node
		// offers neither (docs/cluster.md).
		mcfg.Volumes, mcfg.Preparers = nil, nil
	}
	mgr := sandbox.New(mcfg)
	imgs.SetTemplates(mgr)
	fencedMgr.Store(mgr)
	// On any way out: the background loops are stopped and waited for,
	// then the manager lets go of its sandboxes (they keep running), and
	// only then is the store closed (deferred above).
	defer mgr.Close()
	vols.SetGuests(mgr)
	if cl != nil {
		// VMs of sandboxes the other nodes declared lost while this node
		// was away end before anything else: none runs twice.
		lost, err := st.LostSandboxes(ctx)
		if err != nil {
			return err
		}
		if n := mgr.EndVMs(ctx, lost); n > 0 {
			log.Warn("ended vms of sandboxes the cluster declared lost", "count", n)
		}
		// Files of paused sandboxes a drain moved away just before this
		// node died.
		if _, err := mgr.RemoveMovedAway(ctx, st.MovedAway); err != nil {
			return err
		}
	}
	if err := mgr.Recover(ctx); err != nil {
		return err
	}
	bctx, stopBackground := context.WithCancel(ctx)
	var bg sync.WaitGroup
	defer bg.Wait()
	defer stopBackground()
	mgr.PrepareTemplate()
	// The builder runs builds in sandbox VMs of mgr. Its Recover clears
	// what a build cut short by a crash left (sandboxes, snapshots) before
	// the catalog queues builds again.
	// OCI images (a registry reference, an uploaded archive, a Dockerfile's
	// FROM) are unpacked in build VMs too; bases FROM names are kept in
	// images/imports for later builds.
	// Tenants name the registry, so pulls obey the egress rules' refusal
	// of private addresses unless the operator allows them.
	registryAllowed := func(a netip.Addr) bool { return o.registryAllowPrivate || !ecfg.op.Forbidden(a) }
	importer := &ociimport.Importer{Manager: mgr, Owner: recipebuild.Owner, BaseDir: filepath.Join(o.dataDir, "images", "imports"),
		Transport: ociimport.GuardedTransport(registryAllowed)}
	builder := recipebuild.New(recipebuild.Config{Manager: mgr, Cache: st, Import: importer, Logger: log, DefaultDigest: boot.RecipeHash})
	if !isNode {
		if err := builder.Recover(ctx); err != nil {
			return fmt.Errorf("image builder: %w", err)
		}
		imgs.SetBuilder(builder)
		if err := imgs.Recover(ctx); err != nil {
			return err
		}
		bg.Go(func() { imgs.Run(bctx) })
		bg.Go(func() { vols.Run(bctx) })
	}
	bg.Go(func() { _ = mgr.Run(bctx) })
	bg.Go(func() { pruneIdempotency(bctx, st, log) })
	bg.Go(func() { mgr.RunDiskRetention(bctx) })
	bg.Go(func() { mgr.RunMeter(bctx) })
	metrics.SetSources(telemetrySources(st, mgr))
	// Staging files a crash left behind are removed here, and expired
	// uploads by the sweep.
	uploads, err := api.NewUploads(upload.Config{Dir: filepath.Join(o.dataDir, "uploads"), Logger: log})
	if err != nil {
		return fmt.Errorf("upload staging: %w", err)
	}
	bg.Go(func() { uploads.Run(bctx) })
	// The key of signed file links is made once and kept: links stay
	// valid across restarts until they expire or are revoked. A cluster's
	// nodes share one, kept in the store, so any node opens any link.
	linkKey, err := signingKey(ctx, cl, st, filepath.Join(o.dataDir, "link.key"), "link-key")
	if err != nil {
		return err
	}
	signer, err := links.NewSigner(linkKey, st, nil)
	if err != nil {
		return err
	}

	// One interpreter service for the Runtime routes and E2B's port 49999
	// (interp.E2BHandler), so both see the same contexts.
	interp := interpreter.New(log)
	// One set of rate buckets for the Runtime API and E2B's front: a
	// caller's rate is one whichever protocol it speaks.
	limiter := api.NewRateLimiter(adm.rates)
	acfg := api.Config{
		Manager: api.Manager{Sandboxes: mgr, Power: mgr, Snapshots: mgr, Usage: mgr, Guests: mgr}, Keys: keyStore{st}, Idempotency: idempotencyStore{st}, Events: eventStore{st},
		Logger: log, Version: version, Accel: drv.Accel,
		Confinement: func() any { return drv.Confinement() },
		Uploads:     uploads, Limiter: limiter, ObserveRequest: metrics.ObserveRequest,
		Metrics: metrics.Handler(), PreviewDomain: o.previewDomain, Links: signer,
		Interpreter: interp, Volumes: vols, Images: imgs,
	}
	if isNode {
		acfg.Volumes, acfg.Images, acfg.Nodes = nil, nil, st
	}
	handler, previews := api.NewWithPreviews(acfg)
	if o.metricsListen != "" {
		mln, err := net.Listen("tcp", o.metricsListen)
		if err != nil {
			return fmt.Errorf("--metrics-listen: %w", err)
		}
		mux := http.NewServeMux()
		mux.Handle("GET /metrics", metrics.Handler())
		msrv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
		bg.Go(func() { _ = msrv.Serve(mln) })
		bg.Go(func() { <-bctx.Done(); _ = msrv.Close() })
		log.Info("metrics serving", "addr", "http://"+mln.Addr().String()+"/metrics")
	}
	ln, err := net.Listen("tcp", o.listen)
	if err != nil {
		return err
	}
	// No ReadTimeout or WriteTimeout: exec streams and transfers may run
	// for hours.
	// The web console is a client of the API, served beside it; /v1 and
	// everything else stay the API's, with its one error shape.
	root := http.NewServeMux()
	root.Handle(console.Prefix, console.Handler())
	root.Handle("/", handler)
	// E2B's protocol shares the listener: its sandbox traffic is told by
	// headers (or host names under --e2b-domain), its control plane by paths
	// that are not the Runtime API's. Its tokens' key, like the links',
	// is the cluster's in a cluster.
	e2bKey, err := signingKey(ctx, cl, st, filepath.Join(o.dataDir, "e2b.key"), "e2b-key")
	if err != nil {
		return err
	}
	tokens, err := e2b.NewTokens(e2bKey)
	if err != nil {
		return err
	}
	front := e2b.New(e2b.Config{
		Manager: mgr, Keys: keyStore{st}, Tokens: tokens, Limiter: limiter, Idempotency: idempotencyStore{st}, Domain: o.e2bDomain,
		EnvdVersion: envd.Version, Envd: envd.New(log), Interpreter: interp.E2BHandler(), Next: root, Logger: log,
	})
	// A preview's host is its own origin: nothing but the preview is served
	// there, and no preview anywhere else.
	local := previewFront(previews, front)
	var served http.Handler = local
	if cl != nil {
		// Any node answers any call: creates (the Runtime API's and
		// E2B's) are placed, calls for another node's sandbox (its
		// routes, E2B's traffic and control plane, its previews and
		// signed links) go there over the channel, which serves the
		// server itself (never routed again).
		routed := cl.Handler(front, front.Target, linkTarget(signer))
		served = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if id, ok := previews.Target(r); ok {
				cl.RouteSandbox(w, r, previews, id)
				return
			}
			routed.ServeHTTP(w, r)
		})
		cln, err := net.Listen("tcp", o.cluster.listen)
		if err != nil {
			return fmt.Errorf("--cluster-listen: %w", err)
		}
		bg.Go(func() {
			if err := cl.Serve(bctx, cln, local); err != nil {
				log.Error("node-to-node channel", "err", err)
			}
		})
		bg.Go(func() {
			cl.Run(bctx)
		})
		bg.Go(func() { cl.RunDrain(bctx, mgr) })
		// A Runtime API call is authenticated and rate-limited here, at
		// the node the client reached, before it is forwarded; the channel
		// carries the client's address, so the serving node's limits
		// count the client, not this node.
		cl.SetAdmit(api.Admit(handler))
	}
	// HTTP/2 without TLS (prior knowledge) too, for gRPC and Connect
	// clients of envd; HTTP/1.1 stays the common case.
	protocols := new(http.Protocols)
	protocols.SetHTTP1(true)
	protocols.SetUnencryptedHTTP2(true)
	srv := &http.Server{Handler: served, Protocols: protocols, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute,
		ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn)}
	log.Info("emberbox serving", "addr", "http://"+ln.Addr().String(), "console", "http://"+ln.Addr().String()+console.Prefix,
		"data_dir", o.dataDir, "version", version)
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	if cause := context.Cause(ctx); cause != nil && !errors.Is(cause, context.Canceled) {
		_ = srv.Close()
		return cause
	}
	// Sandboxes keep running: the next start reattaches to them.
	log.Info("shutting down; sandboxes keep running and are reattached on the next start")
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err = srv.Shutdown(sctx)
	if err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
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

func addConfineFlags(f *pflag.FlagSet, o *serveOptions) {
	f.BoolVar(&o.unconfined, "unconfined", false, "run VMs without confinement (own uid, seccomp, namespaces, chroot, cgroup): only where the host cannot confine them")
	f.IntVar(&o.uidBase, "vm-uid-base", qemu.DefaultUIDBase, "first host uid (and gid) VMs run as, one per VM")
	f.IntVar(&o.uidCount, "vm-uid-count", qemu.DefaultUIDCount, "number of host uids VMs may run as")
	f.StringVar(&o.cgroupParent, "cgroup-parent", "", `cgroup the VMs' groups are made in, from the hierarchy's root (default: "emberbox" under the server's own)`)
}

// driverConfig is the QEMU driver's configuration from the flags.
func driverConfig(o serveOptions, khz int64, kernel, probeCache string, log *slog.Logger) qemu.Config {
	return qemu.Config{
		TSCkHz: khz, DisableKVM: o.noKVM, ProbeKernel: kernel, ProbeCache: probeCache, Logger: log,
		Unconfined: o.unconfined, UIDBase: o.uidBase, UIDCount: o.uidCount, CgroupParent: o.cgroupParent,
	}
}

type egressSettings struct {
	op  *egress.Operator
	def egress.Policy
	cas string
}

// egressConfig reads the egress flags.
func egressConfig(o serveOptions) (egressSettings, error) {
	var es egressSettings
	switch o.egressDefault {
	case "internet":
		es.def = egress.Policy{Internet: true}
	case "off":
		es.def = egress.Policy{Internet: false}
	default:
		return es, fmt.Errorf(`--egress-default: want "internet" or "off", not %q`, o.egressDefault)
	}
	var op egress.Operator
	for _, s := range o.egressOpen {
		p, err := egress.ParseOpen(s)
		if err != nil {
			return es, fmt.Errorf("--egress-open: %w", err)
		}
		op.Open = append(op.Open, p)
	}
	// The server's own API is never a sandbox's destination, even where
	// --egress-open admits its address.
	if ap, err := netip.ParseAddrPort(o.listen); err == nil {
		op.Closed = append(op.Closed, ap)
	} else if _, port, err := net.SplitHostPort(o.listen); err == nil {
		if p, err := strconv.Atoi(port); err == nil {
			op.Closed = append(op.Closed, netip.AddrPortFrom(netip.IPv6Unspecified(), uint16(p)))
		}
	}
	for _, s := range o.egressDeny {
		p, err := egress.ParseOpen(s)
		if err != nil {
			return es, fmt.Errorf("--egress-deny-cidr: %w", err)
		}
		op.Deny = append(op.Deny, p)
	}
	if len(o.egressMax) > 0 {
		ceiling := egress.Policy{Internet: true}
		for _, r := range o.egressMax {
			switch {
			case r == "off":
				ceiling.Internet = false
			case strings.HasPrefix(r, "!"):
				ceiling.Deny = append(ceiling.Deny, r[1:])
			default:
				ceiling.Allow = append(ceiling.Allow, r)
			}
		}
		c, err := egress.Compile(ceiling)
		if err != nil {
			return es, fmt.Errorf("--egress-max: %w", err)
		}
		op.Max = c
	}
	op.Resolve = map[string][]netip.Addr{}
	for _, s := range o.egressResolve {
		name, addrs, err := egress.ParseResolve(s)
		if err != nil {
			return es, fmt.Errorf("--egress-resolve: %w", err)
		}
		op.Resolve[name] = append(op.Resolve[name], addrs...)
	}
	es.op = egress.NewOperator(op)
	if o.extraCAFile != "" {
		b, err := os.ReadFile(o.extraCAFile)
		if err != nil {
			return es, fmt.Errorf("--extra-ca-file: %w", err)
		}
		if !bytes.Contains(b, []byte("-----BEGIN CERTIFICATE-----")) {
			return es, fmt.Errorf("--extra-ca-file: %s holds no PEM certificate", o.extraCAFile)
		}
		if len(b) > 2<<20 {
			return es, fmt.Errorf("--extra-ca-file: %s is larger than 2 MiB", o.extraCAFile)
		}
		es.cas = string(b)
	}
	return es, nil
}

// ensureAdminKey creates the first key on a fresh data dir and writes it to
// admin.key (0600), the only place its secret is kept.
func ensureAdminKey(ctx context.Context, st *store.Store, dataDir string, log *slog.Logger) error {
	n, err := st.CountKeys(ctx)
	if err != nil || n > 0 {
		return err
	}
	// The file is written, whole, before the key is recorded: a crash in
	// between leaves no keys, and the next start makes a new one; the other
	// order could leave a key whose secret nobody has.
	k, secret, err := st.NewKey("admin")
	if err != nil {
		return err
	}
	k.Role = store.RoleAdmin
	path := filepath.Join(dataDir, adminKeyFile)
	if err := writeFileAtomic(path, []byte(secret+"\n"), 0o600); err != nil {
		return fmt.Errorf("writing admin key: %w", err)
	}
	faultpoint.Hit("admin_key.written")
	if err := st.InsertKey(ctx, k, secret); err != nil {
		return err
	}
	log.Info("created admin API key", "key_id", k.ID, "path", path)
	fmt.Fprintf(os.Stderr, "\nAdmin API key written to %s\n\n", path)
	return nil
}

// writeFileAtomic replaces path with data: a temporary file beside it is
// written and synced, then renamed over it, so that path holds either the
// old content or all of the new.
func writeFileAtomic(path string, data []byte, perm os.FileMode) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	defer os.Remove(tmp) // fails harmlessly once renamed
	if err := f.Chmod(perm); err != nil {
		f.Close()
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		return err
	}
	// Make the rename itself durable.
	if d, err := os.Open(filepath.Dir(path)); err == nil {
		_ = d.Sync()
		d.Close()
	}
	return nil
}

// bootFiles builds the image if it is missing and the initramfs that
// carries the agent.
type bootConfig struct {
	sandbox.BootFiles
	ProbeCache string // where the KVM probe's verdict is remembered
	RecipeHash string // the guest image's, the default image's digest
}

func bootFiles(ctx context.Context, o serveOptions, log *slog.Logger) (bootConfig, error) {
	img, err := guestimage.Ensure(ctx, guestimage.Config{CacheDir: o.cacheDir, Progress: os.Stderr, Logger: log})
	if err != nil {
		return bootConfig{}, fmt.Errorf("guest image: %w", err)
	}
	agentBin := o.agentBinary
	if agentBin == "" {
		exe, err := os.Executable()
		if err != nil {
			return bootConfig{}, err
		}
		agentBin = filepath.Join(filepath.Dir(exe), "emberbox-agent")
	}
	if _, err := os.Stat(agentBin); err != nil {
		return bootConfig{}, fmt.Errorf("agent binary: %w (build it with `make build`, or pass --agent-binary)", err)
	}
	initrd, err := guestimage.BuildInitrd(img, agentBin, filepath.Join(filepath.Dir(img.Dir), "initrd"))
	if err != nil {
		return bootConfig{}, fmt.Errorf("building initramfs: %w", err)
	}
	log.Info("guest image", "image", img.RecipeHash, "kernel", img.KernelVersion, "initrd", initrd)
	return bootConfig{
		BootFiles:  sandbox.BootFiles{Kernel: img.Kernel, Initrd: initrd, Rootfs: img.Rootfs},
		ProbeCache: filepath.Join(filepath.Dir(img.Dir), "kvm-probe"),
		RecipeHash: img.RecipeHash,
	}, nil
}

func pruneIdempotency(ctx context.Context, st *store.Store, log *slog.Logger) {
	t := time.NewTicker(time.Hour)
	defer t.Stop()
	for {
		if n, err := st.PruneIdempotency(ctx, time.Now().Add(-store.IdempotencyTTL)); err != nil && ctx.Err() == nil {
			log.Warn("pruning idempotency records", "err", err)
		} else if n > 0 {
			log.Debug("pruned idempotency records", "count", n)
		}
		// Give what the prunes and the rings freed back to the disk.
		if err := st.Compact(ctx); err != nil && ctx.Err() == nil {
			log.Warn("compacting the store", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// eventStore adapts the store to api.Events.
type eventStore struct{ st *store.Store }

func (e eventStore) ListEvents(ctx context.Context, sandboxID string, before int64, limit int) ([]api.Event, error) {
	evs, err := e.st.ListEventsBefore(ctx, sandboxID, before, limit)
	if err != nil {
		return nil, err
	}
	out := make([]api.Event, len(evs))
	for i, ev := range evs {
		out[i] = api.Event{ID: ev.ID, Type: ev.Type, Message: ev.Message, Data: ev.Data, At: ev.At}
	}
	return out, nil
}

// keyStore adapts the store to api.Keys.
type keyStore struct{ st *store.Store }

func (k keyStore) Authenticate(ctx context.Context, secret string) (api.Key, error) {
	key, err := k.st.AuthenticateKey(ctx, secret)
	if err != nil {
		return api.Key{}, err
	}
	return api.Key{ID: key.ID, Role: key.Role, Generation: store.SecretGeneration(secret)}, nil
}

func (k keyStore) Generations(ctx context.Context, id string) ([]string, error) {
	return k.st.KeyGenerations(ctx, id)
}

func (k keyStore) ListKeys(ctx context.Context) ([]api.KeyInfo, error) {
	keys, err := k.st.ListKeys(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]api.KeyInfo, len(keys))
	for i, key := range keys {
		out[i] = api.KeyInfo{ID: key.ID, Name: key.Name, Role: key.Role, CreatedAt: key.CreatedAt,
			ExpiresAt: key.ExpiresAt, RevokedAt: key.RevokedAt}
	}
	return out, nil
}

// idempotencyStore adapts the store to api.Idempotency.
type idempotencyStore struct{ st *store.Store }

func (s idempotencyStore) Reserve(ctx context.Context, keyID, key, fingerprint string) (*api.IdempotentResult, bool, error) {
	rec, reserved, err := s.st.ReserveIdempotency(ctx, keyID, key, fingerprint)
	if err != nil || rec == nil {
		return nil, reserved, err
	}
	return &api.IdempotentResult{Fingerprint: rec.Fingerprint, Status: rec.Status, ContentType: rec.ContentType,
		Body: rec.Body, SandboxID: rec.SandboxID, Omitted: rec.Omitted}, reserved, nil
}

func (s idempotencyStore) Complete(ctx context.Context, keyID, key string, status int, contentType string, body []byte) error {
	return s.st.CompleteIdempotency(ctx, keyID, key, status, contentType, body)
}

func (s idempotencyStore) Release(ctx context.Context, keyID, key string) error {
	return s.st.ReleaseIdempotency(ctx, keyID, key)
}

// telemetrySources reads the store and the manager at each scrape.
func telemetrySources(st *store.Store, mgr *sandbox.Manager) telemetry.Sources {
	return telemetry.Sources{
		SandboxStates: st.CountSandboxes,
		Sandboxes: func(ctx context.Context) ([]telemetry.SandboxReading, error) {
			rs, err := mgr.Readings(ctx)
			if err != nil {
				return nil, err
			}
			out := make([]telemetry.SandboxReading, 0, len(rs))
			for _, r := range rs {
				out = append(out, telemetry.SandboxReading{ID: r.ID, Owner: r.Owner,
					CPUSeconds: float64(r.Usage.ActiveCPUNs) / 1e9, GuestCPUSeconds: float64(r.Usage.GuestCPUNs) / 1e9,
					MemoryBytes: r.RSSBytes, EgressBytes: r.Usage.EgressBytes, ChargedMicros: r.Usage.Charge.TotalMicros})
			}
			return out, nil
		},
	}
}

// imageTemplates is --image-templates as sandbox.Config.ImageTemplates,
// where 0 means the default and none is negative.
func imageTemplates(n int) int {
	if n <= 0 {
		return -1
	}
	return n
}

// contextChunkOptions bound the image context chunks each key keeps.
type contextChunkOptions struct {
	quotaMiB    int64
	quotaChunks int
	reserveMiB  int64
}

func (o contextChunkOptions) limits() (catalog.ChunkLimits, error) {
	if o.quotaMiB < 1 || o.quotaChunks < 1 || o.reserveMiB < 0 {
		return catalog.ChunkLimits{}, fmt.Errorf("--image-context-quota-mib and --image-context-quota-chunks must be at least 1, --image-context-reserve-mib at least 0")
	}
	// A zero reserve is ChunkLimits' default; 1 byte is as good as none.
	return catalog.ChunkLimits{BytesPerKey: o.quotaMiB << 20, PerKey: o.quotaChunks, FreeReserve: max(o.reserveMiB<<20, 1)}, nil
}
