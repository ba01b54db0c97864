package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/emberbox/emberbox/internal/pricing"
)

// usageOptions are the flags of emberbox usage.
type usageOptions struct {
	serverFlags
	from, to, groupBy string
	owner             string
	json              bool
}

// newUsageCommand prints what a server metered, from its GET /v1/usage.
func newUsageCommand() *cobra.Command {
	var o usageOptions
	cmd := &cobra.Command{
		Use:   "usage",
		Short: "Print metered usage and charges per sandbox, key or day",
		Long: "Print what a running server metered (GET /v1/usage): running time, busy CPU\n" +
			"measured on the host and as the guest reports it, reserved memory, kept\n" +
			"disks, egress, and what it costs at the server's prices. The server and key\n" +
			"come from --server and --key, else $EMBERBOX_URL and $EMBERBOX_API_KEY,\n" +
			"else ~/.config/emberbox/config.json, else http://127.0.0.1:8080 and the\n" +
			"admin key in --data-dir.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			body, err := fetchUsage(cmd.Context(), o)
			if err != nil {
				return err
			}
			if o.json {
				_, err := cmd.OutOrStdout().Write(body)
				return err
			}
			return printUsage(cmd.OutOrStdout(), body)
		},
	}
	f := cmd.Flags()
	o.serverFlags.register(f)
	f.StringVar(&o.from, "from", "", "start, RFC 3339 UTC or YYYY-MM-DD (default: the start of this month)")
	f.StringVar(&o.to, "to", "", "end, RFC 3339 UTC or YYYY-MM-DD (default: now)")
	f.StringVar(&o.groupBy, "by", "sandbox", "sandbox, key or day")
	f.StringVar(&o.owner, "owner", "", `another key's id, or "all" (admin keys)`)
	f.BoolVar(&o.json, "json", false, "print the server's answer as JSON")
	return cmd
}

// dayOrTime accepts a date (midnight UTC) or an RFC 3339 time.
func dayOrTime(s string) (string, error) {
	if s == "" {
		return "", nil
	}
	if d, err := time.Parse(time.DateOnly, s); err == nil {
		return d.UTC().Format(time.RFC3339), nil
	}
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		return "", fmt.Errorf("%q is neither YYYY-MM-DD nor an RFC 3339 time", s)
	}
	return t.UTC().Format(time.RFC3339), nil
}

func fetchUsage(ctx context.Context, o usageOptions) ([]byte, error) {
	server, key, err := o.resolve()
	if err != nil {
		return nil, err
	}
	q := url.Values{"groupBy": {o.groupBy}}
	for name, v := range map[string]string{"from": o.from, "to": o.to} {
		t, err := dayOrTime(v)
		if err != nil {
			return nil, fmt.Errorf("--%s: %w", name, err)
		}
		if t != "" {
			q.Set(name, t)
		}
	}
	if o.owner != "" {
		q.Set("owner", o.owner)
	}
	body, err := apiCall(ctx, server, key, http.MethodGet, "/v1/usage?"+q.Encode())
	if err != nil {
		return nil, fmt.Errorf("reading usage: %w", err)
	}
	return body, nil
}

// usageRow is the part of a usage answer the table shows.
type usageRow struct {
	Key              string `json:"key"`
	Kind             string `json:"kind"`
	RunningSeconds   string `json:"runningSeconds"`
	ActiveCPUSeconds string `json:"activeCpuSeconds"`
	GuestCPUSeconds  string `json:"guestCpuSeconds"`
	MemoryGiBSeconds string `json:"memoryGiBSeconds"`
	EgressBytes      int64  `json:"egressBytes"`
	ChargedMicros    string `json:"chargedMicros"`
}

func printUsage(w io.Writer, body []byte) error {
	var u struct {
		From, To, GroupBy string
		Totals            usageRow   `json:"totals"`
		Groups            []usageRow `json:"groups"`
	}
	if err := json.Unmarshal(body, &u); err != nil {
		return errors.New("the server's usage answer is not what this command reads")
	}
	fmt.Fprintf(w, "usage from %s to %s, by %s\n\n", u.From, u.To, u.GroupBy)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, strings.ToUpper(u.GroupBy)+"\tRUNNING\tHOST CPU-S\tGUEST CPU-S\tGIB-HOURS\tEGRESS\tCHARGED")
	row := func(name string, r usageRow) {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", name, duration(r.RunningSeconds), round2(r.ActiveCPUSeconds),
			round2(r.GuestCPUSeconds), gibHours(r.MemoryGiBSeconds), bytesText(r.EgressBytes), usageDollars(r.ChargedMicros))
	}
	for _, g := range u.Groups {
		row(g.Key, g)
	}
	row("TOTAL", u.Totals)
	return tw.Flush()
}

func parseF(s string) float64 {
	var f float64
	_, _ = fmt.Sscan(s, &f)
	return f
}

func round2(s string) string { return fmt.Sprintf("%.2f", parseF(s)) }

func duration(s string) string {
	return (time.Duration(parseF(s)*1000) * time.Millisecond).Round(time.Second).String()
}

func gibHours(s string) string { return fmt.Sprintf("%.3f", parseF(s)/3600) }

func bytesText(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}

// usageDollars writes microdollars as dollars to the cent, or to the
// microdollar below a cent so that small runs do not all read $0.00.
func usageDollars(micros string) string {
	var n int64
	if _, err := fmt.Sscan(micros, &n); err != nil {
		return micros
	}
	if n != 0 && n < 10_000 && n > -10_000 {
		return fmt.Sprintf("$%.6f", float64(n)/1e6)
	}
	c := pricing.Cents(n)
	return fmt.Sprintf("$%d.%02d", c/100, c%100)
}
