package pricing

import (
	"errors"
	"fmt"
	"math/big"
)

// Rates are Emberbox's billing rates, set by the operator. Each rate is a
// decimal string in US dollars, parsed exactly; flags can bind to the
// fields directly. Charge, BilledCPUNs and EgressMicros panic on rates that
// fail Validate, so validate rates where they are configured.
type Rates struct {
	// CPUPerVCPUHour is the price of one vCPU-hour of billed CPU: measured
	// busy CPU, raised to the floor.
	CPUPerVCPUHour string
	// MemoryPerGiBHour is the price of one GiB (2^30 bytes) of reserved
	// memory for an hour of running time.
	MemoryPerGiBHour string
	// CPUFloorVCPU is the CPU billed at least, in vCPUs, for running time:
	// billed CPU over a metering interval is
	// max(measured CPU, floor × running time).
	CPUFloorVCPU string
	// StoragePerGBMonth is the price of one decimal GB of paused or kept
	// disk for a 30-day month.
	StoragePerGBMonth string
	// SnapshotPerGiBHour is the price of one GiB of snapshot for an hour.
	SnapshotPerGiBHour string
	// EgressPerGB is the price of one decimal GB sent out beyond the
	// monthly allowance.
	EgressPerGB string
	// EgressFreeBytes is the egress each account may send free each month.
	EgressFreeBytes int64
}

// DefaultRates returns the rates Emberbox bills by unless configured
// otherwise: the published rates of Runtime Cloud, whose API Emberbox
// serves.
func DefaultRates() Rates {
	return Rates{
		CPUPerVCPUHour:     "0.025",
		MemoryPerGiBHour:   "0.0075",
		CPUFloorVCPU:       "0.05",
		StoragePerGBMonth:  "0.08",
		SnapshotPerGiBHour: "0.000119",
		EgressPerGB:        "0.02",
		EgressFreeBytes:    100 << 30,
	}
}

// namedRate is a rate's text with its name for messages.
type namedRate struct{ name, value string }

func (r Rates) named() []namedRate {
	return []namedRate{
		{"CPU rate (per vCPU-hour)", r.CPUPerVCPUHour},
		{"memory rate (per GiB-hour)", r.MemoryPerGiBHour},
		{"CPU floor (vCPU)", r.CPUFloorVCPU},
		{"storage rate (per GB-month)", r.StoragePerGBMonth},
		{"snapshot rate (per GiB-hour)", r.SnapshotPerGiBHour},
		{"egress rate (per GB)", r.EgressPerGB},
	}
}

// Validate reports every rate that is not a non-negative decimal number.
func (r Rates) Validate() error {
	var errs []error
	for _, n := range r.named() {
		if _, err := parseDecimal(n.value); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", n.name, err))
		}
	}
	if r.EgressFreeBytes < 0 {
		errs = append(errs, fmt.Errorf("egress allowance: %d bytes is negative", r.EgressFreeBytes))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("pricing: invalid rates: %w", err)
	}
	return nil
}

// must parses a rate of r that Validate would accept.
func (r Rates) must(s string) *big.Rat {
	x, err := parseDecimal(s)
	if err != nil {
		panic(fmt.Sprintf("pricing: rates not validated: %v", err))
	}
	return x
}

// BilledCPUNs applies the CPU floor to one metering interval of one
// sandbox: max(activeNs, floor × runningMs), in nanoseconds. Metering calls
// it per sandbox per clock hour, so a busy hour does not pay for an idle
// one.
func (r Rates) BilledCPUNs(activeNs, runningMs int64) int64 {
	n, err := r.billedCPUNs(activeNs, runningMs)
	if err != nil {
		panic(fmt.Sprintf("pricing: rates not validated: %v", err))
	}
	return n
}

func (r Rates) billedCPUNs(activeNs, runningMs int64) (int64, error) {
	floor, err := parseDecimal(r.CPUFloorVCPU)
	if err != nil {
		return 0, fmt.Errorf("CPU floor: %w", err)
	}
	floorNs := round(mul(floor, frac(runningMs, 1), frac(nsPerMs, 1)))
	return max(activeNs, floorNs), nil
}

// Charge is what Emberbox charges for a Usage, in microdollars.
type Charge struct {
	CPUMicros      int64
	MemoryMicros   int64
	StorageMicros  int64
	SnapshotMicros int64
	// TotalMicros is rounded from the exact sum of the parts, so it can
	// differ from the sum of the rounded parts by a microdollar or two.
	TotalMicros int64
}

// Charge prices u at r. Egress is not part of it: its allowance is per
// account per month, so it is priced on a month's total by EgressMicros.
func (r Rates) Charge(u Usage) Charge {
	cpu, mem, storage, snap := r.exact(u)
	return Charge{
		CPUMicros:      micros(cpu),
		MemoryMicros:   micros(mem),
		StorageMicros:  micros(storage),
		SnapshotMicros: micros(snap),
		TotalMicros:    micros(sum(cpu, mem, storage, snap)),
	}
}

// exact returns the exact dollar amounts of Charge.
func (r Rates) exact(u Usage) (cpu, mem, storage, snap *big.Rat) {
	billed := u.BilledCPUNs
	if billed == 0 {
		billed = r.BilledCPUNs(u.ActiveCPUNs, u.RunningMs)
	}
	cpu = mul(frac(billed, nsPerHour), r.must(r.CPUPerVCPUHour))
	mem = mul(frac(u.MemoryMiBMs, mibPerGiB*msPerHour), r.must(r.MemoryPerGiBHour))
	storage = mul(frac(u.StorageMiBMs, msPer30Days), frac(bytesPerMiB, bytesPerGB), r.must(r.StoragePerGBMonth))
	snap = mul(frac(u.SnapshotMiBMs, mibPerGiB*msPerHour), r.must(r.SnapshotPerGiBHour))
	return cpu, mem, storage, snap
}

// EgressMicros prices one account's egress over one calendar month: the
// bytes beyond the allowance, at the egress rate per decimal GB.
func (r Rates) EgressMicros(monthBytes int64) int64 {
	billable := max(monthBytes-r.EgressFreeBytes, 0)
	return micros(mul(frac(billable, bytesPerGB), r.must(r.EgressPerGB)))
}
