package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"sync/atomic"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/emberbox/emberbox/internal/api"
	"github.com/emberbox/emberbox/internal/catalog"
	"github.com/emberbox/emberbox/internal/cluster"
	"github.com/emberbox/emberbox/internal/console"
	"github.com/emberbox/emberbox/internal/e2b"
	"github.com/emberbox/emberbox/internal/interpreter"
	"github.com/emberbox/emberbox/internal/links"
	"github.com/emberbox/emberbox/internal/pricing"
	"github.com/emberbox/emberbox/internal/sandbox"
	"github.com/emberbox/emberbox/internal/secrets"
	"github.com/emberbox/emberbox/internal/store"
	"github.com/emberbox/emberbox/internal/telemetry"
	"github.com/emberbox/emberbox/internal/upload"
	"github.com/emberbox/emberbox/internal/vmm/qemu"
	"github.com/emberbox/emberbox/internal/volumes"
	"github.com/emberbox/emberbox/internal/webhook"
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
	webhookAllowPrivate  bool
	secretsKeyFile       string
	egressUpstreamCAFile string
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
	f.StringVar(&o.secretsKeyFile, "secrets-key-file", "",
		"the key that seals egress secrets' values (default <data-dir>/secrets.key, made at the first start); every node of a cluster needs the same one")
	f.StringVar(&o.egressUpstreamCAFile, "egress-upstream-ca-file", "",
		"PEM roots the egress gate trusts, beside the host's, for the far end of a connection it intercepts for an egress secret")
	f.BoolVar(&o.webhookAllowPrivate, "webhook-allow-private", false,
		"let webhooks send to loopback, private and link-local addresses (refused by default: tenants name the URL)")
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

// serve builds the server's subsystems in the order they depend on each
// other, serves until ctx ends, and takes them down in reverse.
func serve(ctx context.Context, o serveOptions) error {
	log, err := newLogger(o.logLevel)
	if err != nil {
		return err
	}
	if err := checkDomains(o.previewDomain, o.e2bDomain); err != nil {
		return err
	}
	memLimit, err := setMemoryLimit(o.memoryLimit)
	if err != nil {
		return err
	}
	log.Info("memory limit", "bytes", memLimit)
	protectFromOOM(log)

	s := &server{o: o, log: log}
	// Serving outlives the stop signal by the drain a node of a cluster
	// does before it stops (stopdrain.go); a signal before the server is
	// built ends it at once.
	stopAsked := ctx
	ctx, endServing := context.WithCancel(context.WithoutCancel(ctx))
	defer endServing()
	var built atomic.Bool
	go func() {
		select {
		case <-stopAsked.Done():
			if built.Load() {
				s.drainBeforeStop(ctx)
			}
			endServing()
		case <-ctx.Done():
		}
	}()
	// On any way out: the background loops are stopped and waited for,
	// then the manager lets go of its sandboxes (they keep running), and
	// only then is the store closed.
	defer s.cleanup.run()
	if err := s.openStore(ctx); err != nil {
		return err
	}
	// A node the others declare lost stands down: its VMs end and serve
	// returns the cause.
	ctx, s.standDown = context.WithCancelCause(ctx)
	s.cleanup.push(func() { s.standDown(nil) })
	for _, build := range []func(context.Context) error{
		s.settleStore,
		s.startDriver,
		s.readEgress,
		s.openSecrets,
		s.admit,
		s.newMetrics,
		s.openVolumes,
		s.openCatalog,
		s.joinIfNode,
		s.startManager,
		s.endLostVMs,
		s.recoverManager,
		s.startBackground,
		s.startBuilds,
		s.startLoops,
		s.openWebhooks,
		s.openUploads,
		s.openLinks,
		s.buildAPI,
		s.serveMetrics,
		s.listen,
		s.buildFront,
		s.routeCluster,
		s.undrainAfterStop,
	} {
		if err := build(ctx); err != nil {
			return err
		}
	}
	built.Store(true)
	return s.serveHTTP(ctx)
}

// server is what serve builds: each subsystem is made by one method, from
// the flags and the subsystems made before it, and pushes on cleanup what
// undoes it.
type server struct {
	o       serveOptions
	log     *slog.Logger
	cleanup cleanupStack

	st        *store.Store
	isNode    bool // the store is shared with other servers: a node of a cluster
	standDown context.CancelCauseFunc

	boot    bootConfig
	drv     *qemu.Driver
	egress  egressSettings
	adm     admissionSettings
	metrics *telemetry.Metrics
	vols    *volumes.Service
	hooks   *webhook.Service
	secrets *secrets.Service
	sealer  *secrets.Sealer
	cas     *secrets.CAs // the egress CAs; nil if this node cannot rotate them
	imgs    *catalog.Service
	cl      *cluster.Cluster // nil unless isNode
	mgr     *sandbox.Manager
	// fencedMgr is mgr for the cluster's fence, which may fire before
	// the manager is made.
	fencedMgr atomic.Pointer[sandbox.Manager]
	bg        background

	uploads  *api.Uploads
	signer   *links.Signer
	interp   *interpreter.Service
	limiter  *api.RateLimiter
	handler  http.Handler
	previews api.Previews
	ln       net.Listener
	front    *e2b.Handler
	served   http.Handler
}

// newLogger is the server's logger at --log-level.
func newLogger(logLevel string) (*slog.Logger, error) {
	var level slog.Level
	if err := level.UnmarshalText([]byte(logLevel)); err != nil {
		return nil, fmt.Errorf("--log-level: %w", err)
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level})), nil
}

// serveHTTP serves the API on the listener until ctx ends, then shuts the
// server down; sandboxes keep running.
func (s *server) serveHTTP(ctx context.Context) error {
	log := s.log
	// HTTP/2 without TLS (prior knowledge) too, for gRPC and Connect
	// clients of envd; HTTP/1.1 stays the common case.
	protocols := new(http.Protocols)
	protocols.SetHTTP1(true)
	protocols.SetUnencryptedHTTP2(true)
	srv := &http.Server{Handler: s.served, Protocols: protocols, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute,
		ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn)}
	log.Info("emberbox serving", "addr", "http://"+s.ln.Addr().String(), "console", "http://"+s.ln.Addr().String()+console.Prefix,
		"data_dir", s.o.dataDir, "version", version)
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(s.ln) }()
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
	err := srv.Shutdown(sctx)
	if err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

func addConfineFlags(f *pflag.FlagSet, o *serveOptions) {
	f.BoolVar(&o.unconfined, "unconfined", false, "run VMs without confinement (own uid, seccomp, namespaces, chroot, cgroup): only where the host cannot confine them")
	f.IntVar(&o.uidBase, "vm-uid-base", qemu.DefaultUIDBase, "first host uid (and gid) VMs run as, one per VM")
	f.IntVar(&o.uidCount, "vm-uid-count", qemu.DefaultUIDCount, "number of host uids VMs may run as")
	f.StringVar(&o.cgroupParent, "cgroup-parent", "", `cgroup the VMs' groups are made in, from the hierarchy's root (default: "emberbox" under the server's own)`)
}
