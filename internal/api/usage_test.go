package api

import (
	"encoding/csv"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/emberbox/emberbox/internal/metering"
	"github.com/emberbox/emberbox/internal/pricing"
)

// productPageRows is the product page's month as settled usage of key a:
// 40,000 runs of 90 s, 2 vCPU and 4 GiB, busy 15 CPU-seconds each, in
// ten rows so that grouping and paging have something to do.
func productPageRows(now time.Time) []metering.Row {
	var rows []metering.Row
	for i := range 10 {
		ms := int64(4000 * 90 * 1000)
		rows = append(rows, metering.Row{ResourceID: "sbx_" + string(rune('a'+i)), Kind: metering.KindSandbox, Owner: "key_a",
			Bucket: metering.Bucket{Hour: now.Truncate(time.Hour).Add(-time.Duration(i+1) * time.Hour), RunningMs: ms, VCPUMs: 2 * ms,
				MemoryMiBMs: 4096 * ms, CPUNs: 4000 * 15 * int64(time.Second), Runs: 4000, GuestCPUNs: 4000 * 14 * int64(time.Second)}})
	}
	return rows
}

func TestCompareReproducesTheProductPage(t *testing.T) {
	e := newEnv(t)
	want := map[string]string{"e2b": "165600000", "modal": "237960000", "blaxel": "193200000", "blaxel-no-standby": "165600000"}
	type answer struct {
		Basis, RuntimeMicros, RivalMicros, SavingMicros string
		SavingPercent                                   float64
		PerMonth                                        struct{ RuntimeMicros, RivalMicros string }
	}
	// With no usage, the example workload is what is priced.
	for provider, rival := range want {
		w := e.do("GET", "/v1/usage/compare?provider="+provider, "")
		if w.Code != http.StatusOK {
			t.Fatalf("%s: %d %s", provider, w.Code, w.Body)
		}
		a := decodeBody[answer](t, w)
		if a.Basis != "example" || a.RuntimeMicros != "34166667" || a.RivalMicros != rival {
			t.Errorf("%s (no usage): %+v; want example, 34166667 (=$34.17) against %s", provider, a, rival)
		}
	}
	e.m.usage.rows = productPageRows(time.Now())
	for provider, rival := range want {
		a := decodeBody[answer](t, e.do("GET", "/v1/usage/compare?provider="+provider+"&days=30", ""))
		if a.Basis != "settled" || a.RuntimeMicros != "34166667" || a.RivalMicros != rival || a.PerMonth.RivalMicros != rival {
			t.Errorf("%s: %+v; want settled, 34166667 against %s", provider, a, rival)
		}
		if pricing.Cents(34166667) != 3417 {
			t.Error("34166667 µ$ does not round to $34.17")
		}
	}
	// Key b has none of it.
	r := decodeBody[answer](t, e.do("GET", "/v1/usage/compare?provider=e2b", "", "Authorization", "Bearer secret-b"))
	if r.Basis != "example" {
		t.Errorf("key b sees key a's usage: %+v", r)
	}
	for _, bad := range []string{"provider=nobody", "provider=runtime", "provider=e2b&days=0", "provider=e2b&days=91", ""} {
		if w := e.do("GET", "/v1/usage/compare?"+bad, ""); w.Code != http.StatusBadRequest || errorOf(t, w).Code != "invalid_request" {
			t.Errorf("%q: %d %s", bad, w.Code, w.Body)
		}
	}
}

func TestUsageAndExport(t *testing.T) {
	e := newEnv(t)
	now := time.Now().UTC()
	e.m.usage.rows = productPageRows(now)
	type usage struct {
		Totals struct{ RunningSeconds, ActiveCpuSeconds, GuestCpuSeconds, MemoryGiBSeconds, ChargedMicros string }
		Groups []struct {
			Key string
		}
		Spent string
	}
	from := now.Add(-24 * time.Hour).Format(time.RFC3339)
	u := decodeBody[usage](t, e.do("GET", "/v1/usage?from="+from, ""))
	if u.Totals.RunningSeconds != "3600000" || u.Totals.ActiveCpuSeconds != "600000" || u.Totals.GuestCpuSeconds != "560000" ||
		u.Totals.MemoryGiBSeconds != "14400000" || u.Totals.ChargedMicros != "34166667" || u.Spent != "34166667" || len(u.Groups) != 10 {
		t.Errorf("usage %+v", u)
	}
	if d := decodeBody[usage](t, e.do("GET", "/v1/usage?groupBy=day&from="+from, "")); len(d.Groups) < 1 || len(d.Groups) > 2 {
		t.Errorf("by day: %+v", d)
	}
	if b := decodeBody[usage](t, e.do("GET", "/v1/usage?from="+from, "", "Authorization", "Bearer secret-b")); b.Totals.ChargedMicros != "0" || len(b.Groups) != 0 {
		t.Errorf("key b: %+v", b)
	}
	if w := e.do("GET", "/v1/usage?owner=key_a", "", "Authorization", "Bearer secret-b"); w.Code != http.StatusForbidden {
		t.Errorf("a tenant read another key's usage: %d", w.Code)
	}
	if a := decodeBody[usage](t, e.do("GET", "/v1/usage?owner=all&groupBy=key&from="+from, "", "Authorization", "Bearer secret-admin")); len(a.Groups) != 1 || a.Groups[0].Key != "key_a" {
		t.Errorf("admin by key: %+v", a)
	}
	for _, bad := range []string{"from=yesterday", "groupBy=month", "from=2026-12-01T10:00:00%2B01:00"} {
		if w := e.do("GET", "/v1/usage?"+bad, ""); w.Code != http.StatusBadRequest {
			t.Errorf("%q: %d", bad, w.Code)
		}
	}

	// Export in pages of 4: the header once, every row once, in order.
	since, until := now.Add(-24*time.Hour).Format(time.RFC3339), now.Add(time.Hour).Format(time.RFC3339)
	var all [][]string
	cursor := ""
	for page := 0; ; page++ {
		type export struct {
			CSV        string
			NextCursor *string
		}
		w := e.do("GET", "/v1/usage/export?limit=4&since="+since+"&until="+until+cursor, "")
		if w.Code != http.StatusOK {
			t.Fatalf("export: %d %s", w.Code, w.Body)
		}
		x := decodeBody[export](t, w)
		recs, err := csv.NewReader(strings.NewReader(x.CSV)).ReadAll()
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, recs...)
		if x.NextCursor == nil {
			break
		}
		cursor = "&cursor=" + *x.NextCursor
		if page > 5 {
			t.Fatal("export never ends")
		}
	}
	if len(all) != 11 || all[0][0] != "hour" {
		t.Fatalf("%d csv lines: %v", len(all), all)
	}
	for _, rec := range all[1:] {
		if rec[4] != "360000" || rec[7] != "60000" {
			t.Errorf("row %v", rec)
		}
	}
	if w := e.do("GET", "/v1/usage/export?since="+since+"&until="+until+"&cursor=bogus", ""); w.Code != http.StatusBadRequest {
		t.Errorf("bogus cursor: %d", w.Code)
	}
}

func TestSandboxMetrics(t *testing.T) {
	e := newEnv(t)
	e.m.add("key_a", "sbx_m", "running", 0)
	now := time.Now().UTC()
	e.m.usage.points = map[string][]metering.Point{"sbx_m": {
		{At: now.Add(-30 * time.Second), Span: 15 * time.Second, CPUNs: int64(15 * time.Second), RSSBytes: 100 << 20},
		{At: now.Add(-15 * time.Second), Span: 15 * time.Second, CPUNs: int64(15 * time.Second), RSSBytes: 120 << 20},
	}}
	type point struct {
		CpuPercent, CpuCores *float64
		MemoryBytes          *int64
	}
	type metrics struct {
		StepSeconds, Vcpu int
		Points            []point
		Latest            *point
	}
	m := decodeBody[metrics](t, e.do("GET", "/v1/sandboxes/sbx_m/metrics?range=15m", ""))
	if m.StepSeconds != 15 || len(m.Points) < 60 || m.Latest == nil {
		t.Fatalf("metrics %+v", m)
	}
	// One core busy the whole time: 50% of 2 vCPUs.
	if *m.Latest.CpuCores != 1 || *m.Latest.CpuPercent != 50 || *m.Latest.MemoryBytes != 120<<20 {
		t.Errorf("latest %v %v %v", *m.Latest.CpuCores, *m.Latest.CpuPercent, *m.Latest.MemoryBytes)
	}
	if w := e.do("GET", "/v1/sandboxes/sbx_m/metrics?range=2h", ""); w.Code != http.StatusBadRequest {
		t.Errorf("bad range: %d", w.Code)
	}
	if w := e.do("GET", "/v1/sandboxes/sbx_m/metrics", "", "Authorization", "Bearer secret-b"); w.Code != http.StatusNotFound {
		t.Errorf("another key's sandbox: %d", w.Code)
	}
}

func TestSandboxUsage(t *testing.T) {
	e := newEnv(t)
	e.m.add("key_a", "sbx_a", "running", 0)
	e.m.usage.rows = productPageRows(time.Now())
	type usage struct {
		SandboxID, RunningSeconds, ChargedMicros string
		Runs                                     int64
	}
	u := decodeBody[usage](t, e.do("GET", "/v1/sandboxes/sbx_a/usage", ""))
	if u.SandboxID != "sbx_a" || u.RunningSeconds != "360000" || u.Runs != 4000 || u.ChargedMicros != "3416667" {
		t.Errorf("usage %+v", u)
	}
	type sb struct{ ChargedMicros *string }
	if got := decodeBody[sb](t, e.do("GET", "/v1/sandboxes/sbx_a", "")); got.ChargedMicros == nil || *got.ChargedMicros != "3416667" {
		t.Errorf("sandbox chargedMicros %v", got.ChargedMicros)
	}
	if w := e.do("GET", "/v1/sandboxes/sbx_a/usage", "", "Authorization", "Bearer secret-b"); w.Code != http.StatusNotFound {
		t.Errorf("another key: %d", w.Code)
	}
}
