// Package pricing turns metered sandbox usage into money: what Emberbox charges
// at its operator's rates, and what the same usage would cost at other sandbox
// providers' published rates.
//
// Quantities are integers (milliseconds, nanoseconds, bytes, MiB), rates are
// decimal strings, and every amount is computed exactly with big.Rat. Each
// reported figure is rounded once, half away from zero, to an integer number of
// microdollars (1,000,000 = $1); a total is rounded from the exact sum of its
// parts, never summed from rounded parts.
//
// `Rates` (decimal strings; `DefaultRates` are Runtime's published prices;
// `Validate`), `Charge` and `BilledCPUNs` (the CPU floor), `EgressMicros`;
// `Providers()` lists each rival's published rates with their source and the
// date read, and `Provider.Price` prices usage at them (docs/pricing.md).
package pricing

import (
	"errors"
	"fmt"
	"math"
	"math/big"
	"time"
)

// Usage is metered quantities over a period, summed over sandboxes.
type Usage struct {
	// RunningMs is sandbox running time: from ready to stop or pause.
	RunningMs int64
	// VCPUMs is allocated vCPUs × running ms.
	VCPUMs int64
	// MemoryMiBMs is reserved memory in MiB × running ms.
	MemoryMiBMs int64
	// ActiveCPUNs is the busy CPU time of the VMs, as the host counts it.
	ActiveCPUNs int64
	// BilledCPUNs is active CPU with the CPU floor applied per metering
	// bucket (see Rates.BilledCPUNs). Zero means the bucket is the whole
	// Usage: max(ActiveCPUNs, floor × RunningMs).
	BilledCPUNs int64
	// Runs counts runs: a sandbox going from ready to its end or a pause.
	// Providers that bill a tail after each run use it.
	Runs int64
	// StorageMiBMs is MiB of paused or kept disks × ms. (Bytes × ms would
	// overflow int64 at 3.5 GB-months.)
	StorageMiBMs int64
	// SnapshotMiBMs is MiB of snapshots × ms.
	SnapshotMiBMs int64
	// EgressBytes is bytes sent out of the sandboxes.
	EgressBytes int64
}

// Workload returns the Usage of runs identical runs, each running for
// runTime on vcpu vCPUs and memoryMiB MiB, busy for busyCPU of CPU time.
// The floor of r applies to each run. Running time counts in whole
// milliseconds, as metering records it.
func (r Rates) Workload(runs int64, runTime time.Duration, vcpu, memoryMiB int64, busyCPU time.Duration) (Usage, error) {
	switch {
	case runs < 0:
		return Usage{}, fmt.Errorf("workload: negative number of runs %d", runs)
	case runTime < 0:
		return Usage{}, fmt.Errorf("workload: negative run time %v", runTime)
	case vcpu < 0:
		return Usage{}, fmt.Errorf("workload: negative vCPU count %d", vcpu)
	case memoryMiB < 0:
		return Usage{}, fmt.Errorf("workload: negative memory %d MiB", memoryMiB)
	case busyCPU < 0:
		return Usage{}, fmt.Errorf("workload: negative busy CPU time %v", busyCPU)
	}
	runMs := runTime.Milliseconds()
	billed, err := r.billedCPUNs(int64(busyCPU), runMs)
	if err != nil {
		return Usage{}, fmt.Errorf("workload: %w", err)
	}
	u := Usage{Runs: runs}
	var ok bool
	if u.RunningMs, ok = mulInt64(runs, runMs); !ok {
		return Usage{}, errOverflow
	}
	if u.VCPUMs, ok = mulInt64(u.RunningMs, vcpu); !ok {
		return Usage{}, errOverflow
	}
	if u.MemoryMiBMs, ok = mulInt64(u.RunningMs, memoryMiB); !ok {
		return Usage{}, errOverflow
	}
	if u.ActiveCPUNs, ok = mulInt64(runs, int64(busyCPU)); !ok {
		return Usage{}, errOverflow
	}
	if u.BilledCPUNs, ok = mulInt64(runs, billed); !ok {
		return Usage{}, errOverflow
	}
	return u, nil
}

var errOverflow = errors.New("workload: a total does not fit in int64")

// mulInt64 returns a×b for non-negative a and b, and whether it fits.
func mulInt64(a, b int64) (int64, bool) {
	if a != 0 && b > math.MaxInt64/a {
		return 0, false
	}
	return a * b, true
}

// Cents rounds microdollars to cents, half away from zero, as a figure
// shown to the cent is rounded.
func Cents(micros int64) int64 {
	q, r := micros/10_000, micros%10_000
	switch {
	case r >= 5_000:
		q++
	case r <= -5_000:
		q--
	}
	return q
}

// Units, as exact ratios.
const (
	msPerHour       = 3_600_000
	msPerSecond     = 1_000
	nsPerMs         = 1_000_000
	nsPerHour       = 3_600_000_000_000
	msPer30Days     = 30 * 24 * msPerHour
	bytesPerGB      = 1_000_000_000 // decimal GB
	bytesPerMiB     = 1 << 20
	mibPerGiB       = 1 << 10
	microsPerDollar = 1_000_000
)

// frac returns num/den.
func frac(num, den int64) *big.Rat { return big.NewRat(num, den) }

// mul returns the product of xs.
func mul(xs ...*big.Rat) *big.Rat {
	p := big.NewRat(1, 1)
	for _, x := range xs {
		p.Mul(p, x)
	}
	return p
}

// sum returns the sum of xs.
func sum(xs ...*big.Rat) *big.Rat {
	s := new(big.Rat)
	for _, x := range xs {
		s.Add(s, x)
	}
	return s
}

// maxRat returns the larger of a and b.
func maxRat(a, b *big.Rat) *big.Rat {
	if a.Cmp(b) >= 0 {
		return a
	}
	return b
}

// micros rounds an exact dollar amount to microdollars, half away from
// zero, saturating at the int64 range.
func micros(dollars *big.Rat) int64 {
	return round(mul(dollars, frac(microsPerDollar, 1)))
}

// round returns x rounded half away from zero to an integer, saturating at
// the int64 range.
func round(x *big.Rat) int64 {
	n, d := x.Num(), x.Denom()
	q, r := new(big.Int).QuoRem(n, d, new(big.Int))
	// |r|*2 >= d rounds away from zero; QuoRem truncates towards zero.
	if new(big.Int).Lsh(new(big.Int).Abs(r), 1).Cmp(d) >= 0 {
		q.Add(q, big.NewInt(int64(n.Sign())))
	}
	switch {
	case q.IsInt64():
		return q.Int64()
	case q.Sign() > 0:
		return math.MaxInt64
	default:
		return math.MinInt64
	}
}

// parseDecimal parses a non-negative decimal number such as "0.025":
// digits, optionally a point and more digits. Exponents and fractions are
// refused so that a rate reads as a price list writes it.
func parseDecimal(s string) (*big.Rat, error) {
	if s == "" {
		return nil, errors.New("empty")
	}
	digits, point := 0, false
	for i, c := range s {
		switch {
		case c >= '0' && c <= '9':
			digits++
		case c == '.' && !point && i > 0:
			point = true
		case c == '-' && i == 0:
			return nil, fmt.Errorf("%q is negative", s)
		default:
			return nil, fmt.Errorf("%q is not a decimal number", s)
		}
	}
	if s[len(s)-1] == '.' || digits == 0 {
		return nil, fmt.Errorf("%q is not a decimal number", s)
	}
	x, ok := new(big.Rat).SetString(s)
	if !ok {
		return nil, fmt.Errorf("%q is not a decimal number", s)
	}
	return x, nil
}

// decimal parses a rate this package itself defines; a bad one is a bug.
func decimal(s string) *big.Rat {
	x, err := parseDecimal(s)
	if err != nil {
		panic("pricing: built-in rate: " + err.Error())
	}
	return x
}
