package metering

import (
	"math/big"
	"strings"

	"github.com/emberbox/emberbox/internal/pricing"
)

// Summary adds rows up: the quantities pricing charges, the CPU floor
// applied per row (one sandbox in one hour), and what only the meters show.
type Summary struct {
	pricing.Usage
	GuestCPUNs   int64
	IngressBytes int64
	RSSMaxBytes  int64
	Charge       pricing.Charge
}

// Summarize adds rows up and prices them at rates.
func Summarize(rows []Row, rates pricing.Rates) Summary {
	var s Summary
	for _, r := range rows {
		s.Add(r, rates)
	}
	s.Charge = rates.Charge(s.Usage)
	return s
}

// Add adds one row; call Price once all are in.
func (s *Summary) Add(r Row, rates pricing.Rates) {
	u := &s.Usage
	u.RunningMs += r.RunningMs
	u.VCPUMs += r.VCPUMs
	u.MemoryMiBMs += r.MemoryMiBMs
	u.ActiveCPUNs += r.CPUNs
	if r.RunningMs > 0 || r.CPUNs > 0 {
		u.BilledCPUNs += rates.BilledCPUNs(r.CPUNs, r.RunningMs)
	}
	u.Runs += r.Runs
	mibMs := (r.StorageByteMs + 1<<19) >> 20 // byte-ms to MiB-ms, rounded
	if r.Kind == KindSnapshot {
		u.SnapshotMiBMs += mibMs
	} else {
		u.StorageMiBMs += mibMs
	}
	u.EgressBytes += r.EgressBytes
	s.GuestCPUNs += r.GuestCPUNs
	s.IngressBytes += r.IngressBytes
	s.RSSMaxBytes = max(s.RSSMaxBytes, r.RSSMaxBytes)
}

// Price sets s.Charge from what was added.
func (s *Summary) Price(rates pricing.Rates) { s.Charge = rates.Charge(s.Usage) }

// Decimal writes num/den exactly as a decimal string, without trailing
// zeros. den must have no prime factor but 2 and 5 (seconds from ms or
// ns, GiB from MiB over seconds), so the expansion ends within as many
// digits as den has factors.
func Decimal(num, den int64) string {
	digits, d := 0, den
	for d > 1 && (d%2 == 0 || d%5 == 0) {
		switch {
		case d%10 == 0:
			d /= 10
		case d%2 == 0:
			d /= 2
		default:
			d /= 5
		}
		digits++
	}
	out := new(big.Rat).SetFrac64(num, den).FloatString(digits)
	if strings.Contains(out, ".") {
		out = strings.TrimRight(strings.TrimRight(out, "0"), ".")
	}
	return out
}
