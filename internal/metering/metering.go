package metering

import (
	"time"
)

// Reading is a sandbox's cumulative counters at one moment.
type Reading struct {
	At time.Time
	// VM names the VM process the CPU count belongs to: a count only
	// continues another of the same VM.
	VM string
	// CPUNs is the VMM's CPU time since it started (host accounting).
	CPUNs int64
	// GuestCPUNs is the busy time the guest kernel reports since it
	// booted; the guest can lie about it, so it is shown, never billed.
	GuestCPUNs int64
	// EgressBytes and IngressBytes count the sandbox's traffic through
	// its egress gate (sent and received).
	EgressBytes, IngressBytes int64
	// RSSBytes is the VMM's resident memory at At (not cumulative).
	RSSBytes int64
}

// Shape is what a sandbox reserves while it runs.
type Shape struct {
	VCPU      int
	MemoryMiB int
}

// Bucket is the usage of one sandbox in one clock hour.
type Bucket struct {
	Hour          time.Time // the hour's start, UTC
	RunningMs     int64
	VCPUMs        int64 // vCPUs × running ms
	MemoryMiBMs   int64 // reserved MiB × running ms
	CPUNs         int64 // host-measured CPU of the VMM
	GuestCPUNs    int64
	EgressBytes   int64
	IngressBytes  int64
	RSSMaxBytes   int64
	Runs          int64 // runs begun in this hour
	StorageByteMs int64 // bytes of kept disk × ms (paused or stopped)
}

// guestSlack bounds a guest's busy time over an interval to its vCPUs ×
// the interval, plus this much: its ticks and the host's clock disagree a
// little at the edges.
const guestSlack = time.Second

// Delta splits what happened between the cursor c and the newer reading r
// of the same VM into clock-hour buckets. Running time is split exactly
// at the hour boundaries; CPU and traffic, which have no timestamps of
// their own, in proportion to it. A reading that is not newer gives
// nothing; counters that went back (a fresh egress gate after a restart)
// count from zero.
func Delta(c, r Reading, s Shape) []Bucket {
	c.At, r.At = c.At.UTC(), r.At.UTC()
	span := r.At.Sub(c.At).Milliseconds()
	if span <= 0 {
		return nil
	}
	cpu := grow(c.CPUNs, r.CPUNs)
	guest := min(grow(c.GuestCPUNs, r.GuestCPUNs), int64(s.VCPU)*(span*int64(time.Millisecond)+int64(guestSlack)))
	egress := grow(c.EgressBytes, r.EgressBytes)
	ingress := grow(c.IngressBytes, r.IngressBytes)

	var out []Bucket
	var usedCPU, usedGuest, usedEg, usedIn, done int64
	for at := c.At; at.Before(r.At); {
		hour := at.Truncate(time.Hour)
		end := earlier(hour.Add(time.Hour), r.At)
		if !end.After(at) {
			break
		}
		ms := end.Sub(at).Milliseconds()
		if end.Equal(r.At) {
			ms = span - done // the rounding of the parts never loses a millisecond
		}
		done += ms
		b := Bucket{Hour: hour, RunningMs: ms, VCPUMs: int64(s.VCPU) * ms, MemoryMiBMs: int64(s.MemoryMiB) * ms,
			RSSMaxBytes: r.RSSBytes}
		if end.Equal(r.At) {
			b.CPUNs, b.GuestCPUNs, b.EgressBytes, b.IngressBytes = cpu-usedCPU, guest-usedGuest, egress-usedEg, ingress-usedIn
		} else {
			b.CPUNs, b.GuestCPUNs = share(cpu, ms, span), share(guest, ms, span)
			b.EgressBytes, b.IngressBytes = share(egress, ms, span), share(ingress, ms, span)
			usedCPU += b.CPUNs
			usedGuest += b.GuestCPUNs
			usedEg += b.EgressBytes
			usedIn += b.IngressBytes
		}
		out = append(out, b)
		at = end
	}
	return out
}

// Storage splits bytes kept from since to until into clock-hour buckets.
func Storage(bytes int64, since, until time.Time) []Bucket {
	since, until = since.UTC(), until.UTC()
	var out []Bucket
	for at := since; at.Before(until); {
		hour := at.Truncate(time.Hour)
		end := earlier(hour.Add(time.Hour), until)
		out = append(out, Bucket{Hour: hour, StorageByteMs: bytes * end.Sub(at).Milliseconds()})
		at = end
	}
	return out
}

// grow is how much a cumulative counter grew from a to b: b itself if it
// went back (it was reset).
func grow(a, b int64) int64 {
	if b < a {
		return max(b, 0)
	}
	return b - a
}

func earlier(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

// share is total × part / whole, part ≤ whole, without the overflow of
// multiplying first: the remainder's product stays below whole².
func share(total, part, whole int64) int64 {
	if whole <= 0 {
		return 0
	}
	hi, lo := total/whole, total%whole
	return hi*part + lo*part/whole
}

// Row is one resource's settled usage in one clock hour, as kept.
type Row struct {
	ResourceID string
	Kind       string // "sandbox" or "snapshot"
	Owner      string // the key that owns the resource
	Bucket
	SettledAt time.Time // when it last changed
	// Final: the resource is deleted, so nothing more is charged to it.
	Final bool
}

// Resource kinds.
const (
	KindSandbox  = "sandbox"
	KindSnapshot = "snapshot"
)

// Point is one settled interval of a sandbox, for its metrics.
type Point struct {
	At         time.Time // the interval's end
	Span       time.Duration
	CPUNs      int64
	GuestCPUNs int64
	RSSBytes   int64
}

// Query selects usage rows. Zero fields do not filter.
type Query struct {
	Owner       string   // the owning key
	ResourceIDs []string // these resources only
	From, To    time.Time
	// AfterHour and AfterID continue a listing ordered by (hour,
	// resource id) after that row.
	AfterHour time.Time
	AfterID   string
	Limit     int // 0: all
}
