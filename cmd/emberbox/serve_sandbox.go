package main

import (
	"context"
	"fmt"
	"net/netip"
	"path/filepath"
	"time"

	"github.com/emberbox/emberbox/internal/admission"
	"github.com/emberbox/emberbox/internal/catalog"
	"github.com/emberbox/emberbox/internal/interpreter"
	"github.com/emberbox/emberbox/internal/ociimport"
	"github.com/emberbox/emberbox/internal/recipebuild"
	"github.com/emberbox/emberbox/internal/sandbox"
	"github.com/emberbox/emberbox/internal/store"
	"github.com/emberbox/emberbox/internal/telemetry"
	"github.com/emberbox/emberbox/internal/volumes"
)

// admit reads the limit flags into admission control, and checks the
// prices and the meter's interval.
func (s *server) admit(context.Context) error {
	adm, err := s.o.limits.build(s.o.dataDir, s.log)
	if err != nil {
		return err
	}
	s.adm = adm
	if err := s.o.rates.Validate(); err != nil {
		return fmt.Errorf("prices: %w", err)
	}
	if s.o.meterInterval < time.Second {
		return fmt.Errorf("--meter-interval must be at least 1s")
	}
	return nil
}

// newMetrics makes the Prometheus metrics; their sources are set once
// the manager runs.
func (s *server) newMetrics(context.Context) error {
	s.metrics = telemetry.New()
	return nil
}

// openVolumes makes the volumes and, on a server of its own, recovers
// them.
func (s *server) openVolumes(ctx context.Context) error {
	o := s.o
	// Volumes serve the manager (streams, create-time attaches) and use it
	// (guests): made first, told of the manager after.
	// Their sizes are held in the admission ledger beside sandboxes' disks.
	s.vols = volumes.New(volumes.Config{Store: s.st, Backups: s.st, DataDir: o.dataDir, Logger: s.log,
		Admission: s.adm.ledger, BackupQuota: o.limits.backupQuota, DiskReserveMiB: o.limits.diskReserveMiB,
		DiskFreeMiB: func() (int64, error) { return admission.DiskFreeMiB(o.dataDir) }})
	// A node of a cluster offers no volumes (their files would be on one
	// node); the store's are not this node's to hold.
	if !s.isNode {
		if err := s.vols.Recover(ctx); err != nil {
			return err
		}
	}
	return nil
}

// openCatalog makes the image catalog: its start commands run before a
// sandbox of an image is running (a Preparer of the manager).
func (s *server) openCatalog(context.Context) error {
	o := s.o
	if o.imageBuilds < 1 || o.imageBuilds > 16 {
		return fmt.Errorf("--image-builds must be from 1 to 16")
	}
	chunks, err := o.contextChunks.limits()
	if err != nil {
		return err
	}
	s.imgs, err = catalog.New(catalog.Config{Store: catalog.Store{ImageRecords: s.st, ImageTags: s.st, ImageHolders: s.st, BuildLogs: s.st}, Events: s.st, DataDir: o.dataDir, Builds: o.imageBuilds, BuildsPerKey: o.limits.buildsPerKey, Logger: s.log,
		DiskFreeMiB: func() (int64, error) { return admission.DiskFreeMiB(o.dataDir) }, DiskReserveMiB: o.limits.diskReserveMiB,
		DefaultRootfs: s.boot.Rootfs, DefaultDigest: s.boot.RecipeHash, Chunks: chunks})
	return err
}

// startManager makes the sandbox manager and tells the catalog, the
// volumes and the cluster's fence of it.
func (s *server) startManager(context.Context) error {
	o, adm, ecfg := s.o, s.adm, s.egress
	// One interpreter service for the Runtime routes and E2B's port 49999
	// (interp.E2BHandler), so both see the same contexts; made here, as
	// the manager tells it of copies.
	s.interp = interpreter.New(s.log)
	mcfg := sandbox.Config{
		// Volumes attach before an image's start command runs, which may
		// use them.
		Volumes: s.vols, Preparers: []sandbox.Preparer{s.vols, s.imgs.Preparer()},
		Store: s.st, Driver: s.drv, Boot: s.boot.BootFiles, DataDir: o.dataDir, Logger: s.log, BootTimeout: o.bootTimeout,
		Egress: ecfg.op, EgressDefault: ecfg.def, ExtraCAs: ecfg.cas, Trust: ecfg.trust, StoppedDiskRetention: o.diskRetention,
		Templates: o.templates, ImageTemplates: imageTemplates(o.imageTemplates), MemoryFloorMiB: o.limits.memoryFloorMiB,
		DiskFloorMiB: o.limits.diskFloorMiB, Checkpoints: o.limits.checkpoints,
		Admission: adm.ledger, Limits: adm.limits,
		Rates: o.rates, MeterInterval: o.meterInterval, Observer: s.metrics,
		// A fork's or a branch's copy goes on with its source's
		// interpreter contexts, whose kernels its memory holds.
		Copied: s.interp.Adopt,
	}
	s.secretsOfSandboxes(&mcfg)
	if s.cl != nil {
		// A copy placed away from its snapshot fetches the snapshot.
		mcfg.FetchSnapshot = s.cl.FetchSnapshot
	}
	if s.isNode {
		// Built images and volumes keep their files on the node that made
		// them, and the cluster places no sandbox by them yet: a node
		// offers neither (docs/cluster.md).
		mcfg.Volumes, mcfg.Preparers = nil, nil
	}
	mgr := sandbox.New(mcfg)
	s.mgr = mgr
	s.imgs.SetTemplates(mgr.Templates)
	s.fencedMgr.Store(mgr)
	// The manager lets go of its sandboxes (they keep running) after the
	// background loops have stopped, before the store closes.
	s.cleanup.push(mgr.Close)
	s.vols.SetGuests(mgr)
	return nil
}

// recoverManager reattaches to the sandboxes the previous run left, and
// has the default template made.
func (s *server) recoverManager(ctx context.Context) error {
	if err := s.mgr.Recover(ctx); err != nil {
		return err
	}
	s.mgr.Templates.Prepare()
	return nil
}

// startBackground makes the context of the server's loops: on the way
// out they are stopped, then waited for.
func (s *server) startBackground(ctx context.Context) error {
	bctx, stopBackground := context.WithCancel(ctx)
	s.bg.ctx = bctx
	s.cleanup.push(s.bg.wg.Wait)
	s.cleanup.push(stopBackground)
	return nil
}

// startBuilds makes the image builder and, on a server of its own,
// recovers the builds and starts the catalog's and the volumes' loops.
func (s *server) startBuilds(ctx context.Context) error {
	o, mgr := s.o, s.mgr
	// The builder runs builds in sandbox VMs of mgr. Its Recover clears
	// what a build cut short by a crash left (sandboxes, snapshots) before
	// the catalog queues builds again.
	// OCI images (a registry reference, an uploaded archive, a Dockerfile's
	// FROM) are unpacked in build VMs too; bases FROM names are kept in
	// images/imports for later builds.
	// Tenants name the registry, so pulls obey the egress rules' refusal
	// of private addresses unless the operator allows them.
	registryAllowed := func(a netip.Addr) bool { return o.registryAllowPrivate || !s.egress.op.Forbidden(a) }
	importer := &ociimport.Importer{Manager: mgr, Owner: recipebuild.Owner, BaseDir: filepath.Join(o.dataDir, "images", "imports"),
		Transport: ociimport.GuardedTransport(registryAllowed)}
	builder := recipebuild.New(recipebuild.Config{Manager: mgr, Snapshots: mgr.Snapshots, Cache: s.st, Import: importer, Logger: s.log, DefaultDigest: s.boot.RecipeHash})
	if s.isNode {
		return nil
	}
	if err := builder.Recover(ctx); err != nil {
		return fmt.Errorf("image builder: %w", err)
	}
	s.imgs.SetBuilder(builder)
	if err := s.imgs.Recover(ctx); err != nil {
		return err
	}
	s.bg.run(s.imgs.Run)
	s.bg.run(s.vols.Run)
	return nil
}

// startLoops starts the manager's loops and the store's upkeep, and points
// the metrics at them.
func (s *server) startLoops(context.Context) error {
	mgr, st, log := s.mgr, s.st, s.log
	s.bg.run(func(ctx context.Context) { _ = mgr.Reaper.Run(ctx) })
	s.bg.run(func(ctx context.Context) { pruneIdempotency(ctx, st, log) })
	s.bg.run(mgr.Reaper.RunDiskRetention)
	s.bg.run(mgr.Meter.Run)
	s.metrics.SetSources(telemetrySources(st, mgr))
	return nil
}

// telemetrySources reads the store and the manager at each scrape.
func telemetrySources(st *store.Store, mgr *sandbox.Manager) telemetry.Sources {
	return telemetry.Sources{
		SandboxStates: st.CountSandboxes,
		Sandboxes: func(ctx context.Context) ([]telemetry.SandboxReading, error) {
			rs, err := mgr.Meter.Readings(ctx)
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
