package main

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/emberbox/emberbox/internal/pricing"
)

// costOptions is a workload to price: runs a month of one sandbox shape.
type costOptions struct {
	runs           int64
	seconds        float64
	vcpu           int64
	memoryGiB      float64
	busyCPUSeconds float64
	providers      []string
	json           bool
}

// newCostCommand prices a month of runs at Emberbox's default rates and at
// other providers' published rates.
func newCostCommand() *cobra.Command {
	var o costOptions
	cmd := &cobra.Command{
		Use:   "cost",
		Short: "Price a month of sandbox runs at Emberbox's rates and at other providers'",
		Long: "Price a month of identical sandbox runs at Emberbox's default rates (Runtime's)\n" +
			"and at the published rates of other sandbox providers. Storage, egress, plan\n" +
			"fees and taxes are left out. The rates, their sources and the dates they were\n" +
			"read are in docs/pricing.md and the --json output.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			rep, err := priceWorkload(o)
			if err != nil {
				return err
			}
			if o.json {
				enc := json.NewEncoder(cmd.OutOrStdout())
				enc.SetIndent("", "  ")
				return enc.Encode(rep)
			}
			return printCost(cmd.OutOrStdout(), rep)
		},
	}
	f := cmd.Flags()
	f.Int64Var(&o.runs, "runs", 40_000, "runs a month")
	f.Float64Var(&o.seconds, "seconds", 90, "running time of each run, in seconds")
	f.Int64Var(&o.vcpu, "vcpu", 2, "vCPUs of each sandbox")
	f.Float64Var(&o.memoryGiB, "memory-gib", 4, "memory of each sandbox, in GiB")
	f.Float64Var(&o.busyCPUSeconds, "busy-cpu-seconds", 15, "CPU-seconds each run keeps the CPU busy")
	f.StringSliceVar(&o.providers, "provider", nil, "price at this provider only (repeatable; default all): "+strings.Join(providerIDs(), ", "))
	f.BoolVar(&o.json, "json", false, "print the figures, rates and sources as JSON")
	return cmd
}

func providerIDs() []string {
	var ids []string
	for _, p := range pricing.Providers() {
		ids = append(ids, p.ID)
	}
	return ids
}

// costReport is the output of cost, as JSON shows it.
type costReport struct {
	Workload       costWorkload `json:"workload"`
	EmberboxMicros int64        `json:"emberboxMicros"`
	Providers      []costRow    `json:"providers"`
}

type costWorkload struct {
	Runs           int64   `json:"runs"`
	Seconds        float64 `json:"seconds"`
	VCPU           int64   `json:"vcpu"`
	MemoryGiB      float64 `json:"memoryGiB"`
	BusyCPUSeconds float64 `json:"busyCpuSeconds"`
}

type costRow struct {
	ID           string `json:"id"`
	Name         string `json:"name"`
	Model        string `json:"model"`
	CPUMicros    int64  `json:"cpuMicros"`
	MemoryMicros int64  `json:"memoryMicros"`
	OtherMicros  int64  `json:"otherMicros"`
	TotalMicros  int64  `json:"totalMicros"`
	Total        string `json:"total"`
	// SavingMicros is what Emberbox's charge is below this one; negative
	// where Emberbox costs more.
	SavingMicros  int64          `json:"savingMicros"`
	SavingPercent int64          `json:"savingPercent"`
	Rates         []pricing.Rate `json:"rates"`
	Notes         string         `json:"notes"`
	Source        string         `json:"source"`
	ReadOn        string         `json:"readOn"`
}

// priceWorkload checks o and prices its workload at Emberbox's default
// rates and at each chosen provider.
func priceWorkload(o costOptions) (costReport, error) {
	switch {
	case o.runs < 0:
		return costReport{}, fmt.Errorf("--runs %d: must not be negative", o.runs)
	case !(o.seconds >= 0 && o.seconds <= 365*24*3600):
		return costReport{}, fmt.Errorf("--seconds %v: must be between 0 and a year", o.seconds)
	case o.vcpu < 1 || o.vcpu > 1024:
		return costReport{}, fmt.Errorf("--vcpu %d: must be between 1 and 1024", o.vcpu)
	case !(o.memoryGiB > 0 && o.memoryGiB <= 1<<20):
		return costReport{}, fmt.Errorf("--memory-gib %v: must be above 0 and at most 1 PiB", o.memoryGiB)
	case !(o.busyCPUSeconds >= 0 && o.busyCPUSeconds <= o.seconds*float64(o.vcpu)):
		return costReport{}, fmt.Errorf("--busy-cpu-seconds %v: must be between 0 and vcpu × seconds (%v)", o.busyCPUSeconds, o.seconds*float64(o.vcpu))
	}
	memoryMiB := math.Round(o.memoryGiB * 1024)
	if memoryMiB < 1 {
		return costReport{}, fmt.Errorf("--memory-gib %v: less than 1 MiB", o.memoryGiB)
	}
	rates := pricing.DefaultRates()
	u, err := rates.Workload(o.runs, seconds(o.seconds), o.vcpu, int64(memoryMiB), seconds(o.busyCPUSeconds))
	if err != nil {
		return costReport{}, err
	}
	var chosen []pricing.Provider
	if len(o.providers) == 0 {
		chosen = pricing.Providers()
	}
	for _, id := range o.providers {
		p, ok := pricing.LookupProvider(id)
		if !ok {
			return costReport{}, fmt.Errorf("--provider %q: unknown; known are %s", id, strings.Join(providerIDs(), ", "))
		}
		chosen = append(chosen, p)
	}
	rep := costReport{
		Workload:       costWorkload{o.runs, o.seconds, o.vcpu, o.memoryGiB, o.busyCPUSeconds},
		EmberboxMicros: rates.Charge(u).TotalMicros,
	}
	for _, p := range chosen {
		q := p.Price(u)
		row := costRow{
			ID: p.ID, Name: p.Name, Model: p.Model,
			CPUMicros: q.CPUMicros, MemoryMicros: q.MemoryMicros, OtherMicros: q.OtherMicros,
			TotalMicros: q.TotalMicros, Total: dollars(q.TotalMicros),
			SavingMicros: q.TotalMicros - rep.EmberboxMicros,
			Rates:        p.Rates, Notes: p.Notes, Source: p.Source, ReadOn: p.ReadOn,
		}
		if q.TotalMicros > 0 {
			row.SavingPercent = int64(math.Round(100 * float64(row.SavingMicros) / float64(q.TotalMicros)))
		}
		rep.Providers = append(rep.Providers, row)
	}
	return rep, nil
}

// seconds converts a flag's seconds to a Duration, to the nanosecond.
func seconds(s float64) time.Duration { return time.Duration(math.Round(s * 1e9)) }

func printCost(w io.Writer, rep costReport) error {
	wl := rep.Workload
	fmt.Fprintf(w, "%d runs a month, %v s each, %d vCPU / %v GiB, busy %v CPU-s per run\n\n",
		wl.Runs, wl.Seconds, wl.VCPU, wl.MemoryGiB, wl.BusyCPUSeconds)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "PROVIDER\tBILLS\tCPU\tMEMORY\tOTHER\tTOTAL/MONTH\tEMBERBOX COSTS LESS BY")
	for _, r := range rep.Providers {
		less := ""
		if r.ID != "runtime" {
			less = fmt.Sprintf("%s (%d%%)", dollars(r.SavingMicros), r.SavingPercent)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", r.Name, r.Model,
			dollars(r.CPUMicros), dollars(r.MemoryMicros), dollars(r.OtherMicros), r.Total, less)
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("writing the table: %w", err)
	}
	_, err := fmt.Fprintln(w, "\nEmberbox bills at Runtime's rates by default. Storage, egress and taxes are left out;\n"+
		"sources and dates are in --json and docs/pricing.md.")
	return err
}

// dollars formats microdollars to the cent: $1,234.57, -$1.11.
func dollars(micros int64) string {
	c := pricing.Cents(micros)
	sign := ""
	if c < 0 {
		sign, c = "-", -c
	}
	whole := fmt.Sprint(c / 100)
	for i := len(whole) - 3; i > 0; i -= 3 {
		whole = whole[:i] + "," + whole[i:]
	}
	return fmt.Sprintf("%s$%s.%02d", sign, whole, c%100)
}
