package main

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/spf13/cobra"

	"github.com/emberbox/emberbox/internal/admission"
	"github.com/emberbox/emberbox/internal/api"
	"github.com/emberbox/emberbox/internal/catalog"
	"github.com/emberbox/emberbox/internal/sandbox"
	"github.com/emberbox/emberbox/internal/volumes"
)

// limitOptions are the flags of admission control: what the host may
// promise, what one key may hold, how large and how long-lived one sandbox
// may be, and how fast a caller may send requests.
type limitOptions struct {
	// model is how sandboxes are charged: "measured" (by what they use)
	// or "strict" (by their nominal size).
	model              string
	startMiB           int64
	headroomMiB        int64
	maxVCPUs           int
	vcpuOvercommit     float64
	maxMemoryMiB       int64
	memoryOvercommit   float64
	hostReserveMiB     int64
	vmOverheadMiB      int64
	diskReserveMiB     int64
	diskOvercommit     float64
	maxConcurrentBoots int
	memoryFloorMiB     int64
	diskFloorMiB       int64

	quota       admission.Quota
	backupQuota volumes.BackupQuota
	checkpoints sandbox.CheckpointLimits
	// buildsPerKey bounds one key's image builds queued or running.
	buildsPerKey int

	maxSandboxVCPUs     int
	maxSandboxMemoryMiB int
	maxSandboxDiskMiB   int
	maxLifetime         time.Duration

	rates api.RateLimits
}

func addLimitFlags(cmd *cobra.Command, o *limitOptions) {
	f := cmd.Flags()
	f.StringVar(&o.model, "admission", "measured", `how sandboxes are charged against the host: "measured" (running ones by their resident memory plus --memory-headroom-mib, paused ones by disk alone; vCPUs not capped) or "strict" (by their nominal size: the host never overcommits)`)
	f.Int64Var(&o.startMiB, "memory-start-mib", admission.DefaultStartMiB, "measured admission: memory a sandbox is expected to take before its VM's first reading (at most its size)")
	f.Int64Var(&o.headroomMiB, "memory-headroom-mib", admission.DefaultHeadroomMiB, "measured admission: memory a running sandbox may take beyond its newest reading, kept free for it")
	f.IntVar(&o.maxVCPUs, "max-vcpus", 0, "vCPUs the server may promise in all (default: host CPUs × --vcpu-overcommit)")
	f.Float64Var(&o.vcpuOvercommit, "vcpu-overcommit", 0, "vCPUs promised per host CPU when --max-vcpus is not set (default: 8 strict; measured: no cap, the per-VM CPU quota bounds each)")
	f.Int64Var(&o.maxMemoryMiB, "max-memory-mib", 0, "nominal memory the server may promise in all, VM overhead included (default: (host memory − --host-reserve-mib) × --memory-overcommit)")
	f.Float64Var(&o.memoryOvercommit, "memory-overcommit", 0, "nominal memory promised per MiB of host memory (default: 1 strict; measured: 32, a ceiling beside the measured check)")
	f.Int64Var(&o.hostReserveMiB, "host-reserve-mib", 2048, "host memory never promised to sandboxes, and kept available at every create")
	f.Int64Var(&o.vmOverheadMiB, "vm-overhead-mib", 512, "host memory charged per running sandbox besides its own: what its cgroup allows QEMU beyond the guest (code cache and devices)")
	f.Int64Var(&o.diskReserveMiB, "disk-reserve-mib", 2048, "free space kept on the data dir's filesystem after every live disk has grown to its size")
	f.Float64Var(&o.diskOvercommit, "disk-overcommit", 0, "disk promised per MiB of free space; above 1 a guest whose disk cannot grow meets I/O errors (default: 1 strict; measured: 16, as disks are thin overlays)")
	f.IntVar(&o.maxConcurrentBoots, "max-concurrent-boots", 0, "sandboxes booting at once (default: host CPUs)")
	f.Int64Var(&o.diskFloorMiB, "disk-floor-mib", 2048, "free space on the data dir's filesystem below which (at the rate guests write) every running sandbox whose files grow is paused (0: never); guest memory files and disks take blocks as they are written, and a VM whose memory file cannot get one dies")
	f.Int64Var(&o.memoryFloorMiB, "memory-floor-mib", 1024, "host memory available below which the running sandbox idle longest is paused, one a second (0: never); what makes --memory-overcommit above 1 safe")

	f.IntVar(&o.quota.Sandboxes, "quota-sandboxes", 0, "live sandboxes per API key (0: only the host's limit; set it where keys share a host)")
	f.IntVar(&o.quota.VCPU, "quota-vcpus", 0, "vCPUs per API key (0: only the host's limit)")
	f.Int64Var(&o.quota.MemoryMiB, "quota-memory-mib", 0, "memory per API key (0: only the host's limit)")
	f.Int64Var(&o.quota.DiskMiB, "quota-disk-mib", 0, "disk per API key, sandboxes' disks and volumes together (0: only the host's limit)")
	f.IntVar(&o.quota.Boots, "quota-boots", 0, "sandboxes of one API key booting at once (0: only the host's limit)")
	f.IntVar(&o.quota.Volumes, "quota-volumes", volumes.MaxPerOwner, "volumes per API key (0: no limit)")
	f.Int64Var(&o.quota.VolumeMiB, "quota-volume-mib", 64<<10, "total size of one API key's volumes, each counted at its full size (0: only the host's limit)")
	f.IntVar(&o.backupQuota.Count, "quota-volume-backups", volumes.DefaultBackupCount, "volume backups per API key (0: no limit)")
	f.Int64Var(&o.backupQuota.MiB, "quota-volume-backup-mib", volumes.DefaultBackupMiB, "total size of one API key's volume backups, each counted at its volume's size (0: no limit)")
	f.IntVar(&o.backupQuota.PerVolume, "quota-backups-per-volume", volumes.DefaultBackupPerVolume, "backups of one volume (0: no limit)")
	f.IntVar(&o.checkpoints.PerSandbox, "checkpoints-per-sandbox", sandbox.DefaultCheckpointsPerSandbox, "checkpoints one sandbox keeps; a new one past it deletes its oldest")
	f.Int64Var(&o.checkpoints.QuotaBytes, "quota-checkpoint-bytes", sandbox.DefaultCheckpointQuotaBytes, "disk the checkpoints of one API key's sandboxes take together; past it a sandbox's own oldest make room, else 429 quota_exceeded")
	f.IntVar(&o.buildsPerKey, "quota-image-builds", catalog.DefaultBuildsPerKey, "image builds of one API key queued or running at once (0: no limit)")

	f.IntVar(&o.maxSandboxVCPUs, "max-sandbox-vcpus", 0, "vCPUs of one sandbox (default: host CPUs, at least 2)")
	f.IntVar(&o.maxSandboxMemoryMiB, "max-sandbox-memory-mib", 0, "memory of one sandbox (default: all the server may promise)")
	f.IntVar(&o.maxSandboxDiskMiB, "max-sandbox-disk-mib", 0, "disk of one sandbox (default: the API's 65536)")
	f.DurationVar(&o.maxLifetime, "max-lifetime", 24*time.Hour, "longest a sandbox may live from its creation; :extend never passes it")

	f.Float64Var(&o.rates.Read.PerSecond, "rate-read", 100, "GET requests per second per API key (0: no limit)")
	f.IntVar(&o.rates.Read.Burst, "rate-read-burst", 200, "GET requests per API key at once")
	f.Float64Var(&o.rates.Write.PerSecond, "rate-write", 50, "other requests (creates, execs, writes) per second per API key (0: no limit)")
	f.IntVar(&o.rates.Write.Burst, "rate-write-burst", 100, "other requests per API key at once")
	f.Float64Var(&o.rates.AuthFail.PerSecond, "rate-auth-fail", 1, "failed authentications per second per client address (0: no limit)")
	f.IntVar(&o.rates.AuthFail.Burst, "rate-auth-fail-burst", 10, "failed authentications per client address at once")
}

// admissionModel is what --admission sets: the overcommit ratios a flag
// left at 0 takes, and whether running sandboxes are charged by use.
type admissionModel struct {
	measured           bool
	vcpu, memory, disk float64 // 0 vcpu: no cap
}

var admissionModels = map[string]admissionModel{
	// The host never promises what it does not have: every sandbox could
	// use all of its size at once.
	"strict": {vcpu: 8, memory: 1, disk: 1},
	// Sandboxes are charged by what they use (admission.MeasuredConfig);
	// the nominal ratios are a ceiling beside it (and what a node of a
	// cluster offers placement), not the limit a host meets first.
	"measured": {measured: true, memory: 32, disk: 16},
}

// admissionSettings is what the limit flags configure.
type admissionSettings struct {
	ledger *admission.Ledger
	// capacity and overhead are what a node of a cluster registers.
	capacity admission.Capacity
	overhead int64
	limits   sandbox.Limits
	rates    api.RateLimits
}

// build reads the host's size and turns the flags into the ledger, the
// limits of one sandbox and the request rates.
func (o limitOptions) build(dataDir string, log *slog.Logger) (admissionSettings, error) {
	var as admissionSettings
	m, ok := admissionModels[o.model]
	if !ok {
		return as, fmt.Errorf(`--admission is %q; want "measured" or "strict"`, o.model)
	}
	if o.memoryOvercommit < 0 || o.vcpuOvercommit < 0 || o.diskOvercommit < 0 {
		return as, fmt.Errorf("--memory-overcommit, --vcpu-overcommit and --disk-overcommit must not be negative")
	}
	if o.memoryOvercommit == 0 {
		o.memoryOvercommit = m.memory
	}
	if o.vcpuOvercommit == 0 {
		o.vcpuOvercommit = m.vcpu
	}
	if o.diskOvercommit == 0 {
		o.diskOvercommit = m.disk
	}
	var measured *admission.MeasuredConfig
	if m.measured {
		if o.startMiB < 0 || o.headroomMiB < 0 {
			return as, fmt.Errorf("--memory-start-mib and --memory-headroom-mib must not be negative")
		}
		measured = &admission.MeasuredConfig{StartMiB: o.startMiB, HeadroomMiB: o.headroomMiB}
	}
	cpus := admission.HostCPUs()
	capa := admission.Capacity{VCPU: o.maxVCPUs, MemoryMiB: o.maxMemoryMiB, Boots: o.maxConcurrentBoots}
	if capa.VCPU <= 0 && o.vcpuOvercommit > 0 {
		capa.VCPU = max(1, int(float64(cpus)*o.vcpuOvercommit))
	}
	if capa.Boots <= 0 {
		capa.Boots = cpus
	}
	hostMiB, err := admission.HostMemoryMiB()
	if err != nil {
		return as, fmt.Errorf("reading the host's memory: %w", err)
	}
	if capa.MemoryMiB <= 0 {
		capa.MemoryMiB = int64(float64(hostMiB-o.hostReserveMiB) * o.memoryOvercommit)
		if capa.MemoryMiB <= o.vmOverheadMiB {
			return as, fmt.Errorf("the host has %d MiB of memory, too little beside --host-reserve-mib %d for any sandbox", hostMiB, o.hostReserveMiB)
		}
	}
	as.ledger = admission.New(admission.Config{
		Capacity: capa, VMOverheadMiB: o.vmOverheadMiB, Quota: o.quota,
		DiskFreeMiB: func() (int64, error) { return admission.DiskFreeMiB(dataDir) }, DiskReserveMiB: o.diskReserveMiB, DiskOvercommit: o.diskOvercommit,
		MemAvailableMiB: admission.MemAvailableMiB, MemReserveMiB: o.hostReserveMiB,
		Measured: measured,
	})
	as.capacity, as.overhead = capa, o.vmOverheadMiB
	as.limits = sandbox.Limits{
		MaxVCPU: o.maxSandboxVCPUs, MaxMemoryMiB: o.maxSandboxMemoryMiB, MaxDiskMiB: o.maxSandboxDiskMiB,
		MaxLifetime: o.maxLifetime,
	}
	if as.limits.MaxVCPU <= 0 {
		as.limits.MaxVCPU = max(cpus, sandbox.DefaultVCPU)
	}
	if as.limits.MaxMemoryMiB <= 0 {
		// A sandbox that could never fit is refused as too large, not
		// answered no_capacity for ever; nor may one sandbox be promised
		// more than the host has, however far the promises overcommit.
		as.limits.MaxMemoryMiB = int(min(capa.MemoryMiB, hostMiB-o.hostReserveMiB) - o.vmOverheadMiB)
	}
	as.rates = o.rates
	log.Info("admission control", "model", o.model, "host_cpus", cpus, "host_memory_mib", hostMiB,
		"max_vcpus", capa.VCPU, "max_memory_mib", capa.MemoryMiB, "vm_overhead_mib", o.vmOverheadMiB,
		"max_concurrent_boots", capa.Boots, "disk_reserve_mib", o.diskReserveMiB,
		"max_sandbox_vcpus", as.limits.MaxVCPU, "max_sandbox_memory_mib", as.limits.MaxMemoryMiB,
		"max_lifetime", o.maxLifetime)
	return as, nil
}
