package pricing

import (
	"math/big"
	"slices"
)

// Provider is a sandbox provider's published pricing, to price the same
// Usage as Emberbox bills at another provider's rates.
type Provider struct {
	ID    string
	Name  string
	Rates []Rate
	// Model says in one line how the provider bills.
	Model string
	// Notes holds what the model leaves out and how sure the rates are.
	Notes string
	// Source is where the rates were read.
	Source string
	// ReadOn is the date (YYYY-MM-DD) the rates were read.
	ReadOn string

	price func(Usage) quote
}

// Rate is one line of a provider's price list.
type Rate struct {
	What  string `json:"what"`
	Price string `json:"price"` // US dollars, decimal
	Unit  string `json:"unit"`
}

// Quote is what a Usage would cost at a provider, in microdollars.
type Quote struct {
	CPUMicros    int64
	MemoryMicros int64
	// OtherMicros is charges that are neither CPU nor memory time: per-run
	// fees and tails, storage.
	OtherMicros int64
	// TotalMicros is rounded from the exact sum of the parts.
	TotalMicros int64
}

// quote is a Quote before rounding, in dollars.
type quote struct{ cpu, mem, other *big.Rat }

// Price returns what u would cost at p.
func (p Provider) Price(u Usage) Quote {
	q := p.price(u)
	for _, x := range []**big.Rat{&q.cpu, &q.mem, &q.other} {
		if *x == nil {
			*x = new(big.Rat)
		}
	}
	return Quote{
		CPUMicros:    micros(q.cpu),
		MemoryMicros: micros(q.mem),
		OtherMicros:  micros(q.other),
		TotalMicros:  micros(sum(q.cpu, q.mem, q.other)),
	}
}

// Providers returns the known providers in a stable order, Runtime first.
// The result is the caller's to change.
func Providers() []Provider {
	ps := providers()
	for i := range ps {
		ps[i].Rates = slices.Clone(ps[i].Rates)
	}
	return ps
}

// LookupProvider returns the provider with the given ID.
func LookupProvider(id string) (Provider, bool) {
	for _, p := range Providers() {
		if p.ID == id {
			return p, true
		}
	}
	return Provider{}, false
}

// Usage in the units price lists use.
func seconds(ms int64) *big.Rat         { return frac(ms, msPerSecond) }
func vcpuSeconds(u Usage) *big.Rat      { return seconds(u.VCPUMs) }
func gibSeconds(u Usage) *big.Rat       { return frac(u.MemoryMiBMs, mibPerGiB*msPerSecond) }
func activeCPUHours(u Usage) *big.Rat   { return frac(u.ActiveCPUNs, nsPerHour) }
func activeCPUSeconds(u Usage) *big.Rat { return frac(u.ActiveCPUNs, nsPerMs*msPerSecond) }

// meanMemoryGiB is the time-weighted mean reserved memory of u's sandboxes.
func meanMemoryGiB(u Usage) *big.Rat {
	if u.RunningMs == 0 {
		return new(big.Rat)
	}
	return frac(u.MemoryMiBMs, u.RunningMs*mibPerGiB)
}

// Rates as the providers publish them.
const (
	e2bVCPUSecond = "0.000014"
	e2bGiBSecond  = "0.0000045"

	modalCoreSecond = "0.00003942"
	modalGiBSecond  = "0.00000667"

	blaxelGBSecond       = "0.0000115"
	blaxelStandbySeconds = 15

	daytonaVCPUSecond = "0.000014"
	daytonaGiBSecond  = "0.0000045"

	vercelActiveCPUHour = "0.128"
	vercelGBHour        = "0.0212"
	vercelPerMCreations = "0.60"

	flySharedVCPUSecond = "0.0000008465"
	flyGBSecond         = "0.000002316"
	flyIncludedGBVCPU   = "0.25"
)

func providers() []Provider {
	def := DefaultRates()
	blaxel := func(tail bool) func(Usage) quote {
		return func(u Usage) quote {
			q := quote{mem: mul(gibSeconds(u), decimal(blaxelGBSecond))}
			if tail {
				q.other = mul(frac(u.Runs, 1), frac(blaxelStandbySeconds, 1), meanMemoryGiB(u), decimal(blaxelGBSecond))
			}
			return q
		}
	}
	return []Provider{
		{
			ID:   "runtime",
			Name: "Runtime (Emberbox default)",
			Rates: []Rate{
				{"active CPU", def.CPUPerVCPUHour, "per vCPU-hour"},
				{"reserved memory", def.MemoryPerGiBHour, "per GiB-hour"},
				{"CPU floor", def.CPUFloorVCPU, "vCPU while running"},
				{"paused storage", def.StoragePerGBMonth, "per GB-month"},
				{"snapshots", def.SnapshotPerGiBHour, "per GiB-hour"},
			},
			Model: "busy CPU (0.05 vCPU floor) + reserved memory",
			Notes: "The rates Emberbox bills by default. Billed from ready; boot and restore are free. " +
				"Egress ($0.02/GB after 100 GiB a month) is per account and not in the quote.",
			Source: "https://github.com/withruntime/runtime/blob/main/packages/cloud-guide/docs/pricing.md",
			ReadOn: "2026-12-01",
			price: func(u Usage) quote {
				cpu, mem, storage, snap := def.exact(u)
				return quote{cpu: cpu, mem: mem, other: sum(storage, snap)}
			},
		},
		{
			ID:   "e2b",
			Name: "E2B",
			Rates: []Rate{
				{"vCPU", e2bVCPUSecond, "per allocated vCPU-second"},
				{"memory", e2bGiBSecond, "per allocated GiB-second"},
			},
			Model:  "allocated vCPU + memory, running time",
			Notes:  "Billed per second while running, busy or not; paused sandboxes are not billed.",
			Source: "https://e2b.dev/docs/faq/calculate-sandbox-price",
			ReadOn: "2026-12-01",
			price:  allocated(e2bVCPUSecond, e2bGiBSecond),
		},
		{
			ID:   "modal",
			Name: "Modal Sandboxes",
			Rates: []Rate{
				{"CPU", modalCoreSecond, "per physical core-second (1 core = 2 vCPU)"},
				{"memory", modalGiBSecond, "per GiB-second"},
			},
			Model: "max(request, use) of cores + memory",
			Notes: "Billed on the higher of request and use; priced here on the period's totals. " +
				"The rates were not read on modal.com/pricing itself here: they are the Sandbox rates " +
				"a third-party record cites from it (checked 2026-09-13); another, from May 2026, has " +
				"$0.00000672/GiB-s. The billing rule is from modal.com/docs/guide/sandbox-resources.",
			Source: "https://modal.com/pricing",
			ReadOn: "2026-09-13",
			price: func(u Usage) quote {
				// Cores are half the vCPUs, requested or used.
				cores := mul(maxRat(vcpuSeconds(u), activeCPUSeconds(u)), frac(1, 2))
				return quote{
					cpu: mul(cores, decimal(modalCoreSecond)),
					mem: mul(gibSeconds(u), decimal(modalGiBSecond)),
				}
			},
		},
		{
			ID:   "blaxel",
			Name: "Blaxel",
			Rates: []Rate{
				{"active sandbox", blaxelGBSecond, "per GB-second of memory size, CPU included"},
			},
			Model: "memory size × active time + 15 s tail/run",
			Notes: "A sandbox goes to standby about 15 seconds after its last connection closes, and is " +
				"billed as active until then (docs.blaxel.ai/Sandboxes/Overview); the tail is in Other. " +
				"GB is Blaxel's size name: a 4 GiB sandbox counts as 4. The rate is as a third-party " +
				"record cites blaxel.ai/pricing (retrieved 2026-08-19); the page itself was not read here.",
			Source: "https://blaxel.ai/pricing",
			ReadOn: "2026-08-19",
			price:  blaxel(true),
		},
		{
			ID:   "blaxel-no-standby",
			Name: "Blaxel (no standby tail)",
			Rates: []Rate{
				{"active sandbox", blaxelGBSecond, "per GB-second of memory size, CPU included"},
			},
			Model:  "memory size × active time",
			Notes:  "Blaxel without the standby tail: the least it can cost.",
			Source: "https://blaxel.ai/pricing",
			ReadOn: "2026-08-19",
			price:  blaxel(false),
		},
		{
			ID:   "daytona",
			Name: "Daytona",
			Rates: []Rate{
				{"vCPU", daytonaVCPUSecond, "per vCPU-second"},
				{"memory", daytonaGiBSecond, "per GiB-second"},
			},
			Model: "allocated vCPU + memory, running time",
			Notes: "Per second while running; stopped sandboxes pay only disk (5 GiB free). " +
				"daytona.io/pricing was not in the stored sources: these are the rates several " +
				"third-party records cite from it ($0.0504/vCPU-h, $0.0162/GiB-h, retrieved 2026-09-28).",
			Source: "https://www.daytona.io/pricing",
			ReadOn: "2026-09-28",
			price:  allocated(daytonaVCPUSecond, daytonaGiBSecond),
		},
		{
			ID:   "vercel",
			Name: "Vercel Sandbox",
			Rates: []Rate{
				{"active CPU", vercelActiveCPUHour, "per vCPU-hour"},
				{"provisioned memory", vercelGBHour, "per GB-hour"},
				{"sandbox creations", vercelPerMCreations, "per million"},
			},
			Model: "active CPU + provisioned memory + creations",
			Notes: "Pro/Enterprise list prices, region iad1. Memory is billed in 1-minute minimum " +
				"increments, not modelled here. Each vCPU comes with 2 GB; GB is taken as the sandbox's " +
				"GiB size. Older copies of the page (2025 beta) list $0.0106/GB-h; the current page, " +
				"as copies and records of it read it (last record 2026-10-09), lists $0.0212.",
			Source: "https://vercel.com/docs/vercel-sandbox/pricing",
			ReadOn: "2026-10-09",
			price: func(u Usage) quote {
				return quote{
					cpu:   mul(activeCPUHours(u), decimal(vercelActiveCPUHour)),
					mem:   mul(frac(u.MemoryMiBMs, mibPerGiB*msPerHour), decimal(vercelGBHour)),
					other: mul(frac(u.Runs, 1_000_000), decimal(vercelPerMCreations)),
				}
			},
		},
		{
			ID:   "fly",
			Name: "Fly Machines (shared CPU)",
			Rates: []Rate{
				{"shared vCPU", flySharedVCPUSecond, "per vCPU-second, 256 MB included"},
				{"additional RAM", flyGBSecond, "per GB-second"},
			},
			Model: "shared vCPU + RAM over 256 MB/vCPU",
			Notes: "Ashburn (iad) prices, the lowest; other regions cost up to 1.6× more. Performance " +
				"vCPUs cost $0.000012732/s with 2 GB each. GB here is 1024 MB. Stopped machines pay " +
				"$0.15/GB-month of rootfs. Read from the docs page's price table source (RegionPricingSelector).",
			Source: "https://fly.io/docs/about/pricing/",
			ReadOn: "2026-12-01",
			price: func(u Usage) quote {
				included := mul(vcpuSeconds(u), decimal(flyIncludedGBVCPU))
				extra := new(big.Rat).Sub(gibSeconds(u), included)
				if extra.Sign() < 0 {
					extra.SetInt64(0)
				}
				return quote{
					cpu: mul(vcpuSeconds(u), decimal(flySharedVCPUSecond)),
					mem: mul(extra, decimal(flyGBSecond)),
				}
			},
		},
	}
}

// allocated prices every allocated vCPU and GiB for the running time, busy
// or not, at per-second rates.
func allocated(vcpuSecond, gibSecond string) func(Usage) quote {
	return func(u Usage) quote {
		return quote{cpu: mul(vcpuSeconds(u), decimal(vcpuSecond)), mem: mul(gibSeconds(u), decimal(gibSecond))}
	}
}
