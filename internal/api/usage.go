package api

import (
	"encoding/base64"
	"encoding/csv"
	"fmt"
	"math"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/emberbox/emberbox/internal/metering"
	"github.com/emberbox/emberbox/internal/pricing"
	"github.com/emberbox/emberbox/internal/sandbox"
)

// Usage, metrics and prices (docs/pricing.md). Money is integer
// microdollars in decimal strings, quantities exact decimal strings, as
// withruntime reads them.

// micros writes an amount of microdollars.
func micros(n int64) string { return strconv.FormatInt(n, 10) }

// usageJSON is what was used and what it costs.
type usageJSON struct {
	RunningSeconds     string `json:"runningSeconds"`
	VCPUSeconds        string `json:"vcpuSeconds"`
	ActiveCPUSeconds   string `json:"activeCpuSeconds"` // measured on the host
	BilledCPUSeconds   string `json:"billedCpuSeconds"` // with the CPU floor
	GuestCPUSeconds    string `json:"guestCpuSeconds"`  // as the guest reports it; never billed
	MemoryGiBSeconds   string `json:"memoryGiBSeconds"`
	StorageGiBSeconds  string `json:"storageGiBSeconds"`
	SnapshotGiBSeconds string `json:"snapshotGiBSeconds"`
	EgressBytes        int64  `json:"egressBytes"`
	IngressBytes       int64  `json:"ingressBytes"`
	Runs               int64  `json:"runs"`
	CPUMicros          string `json:"cpuMicros"`
	MemoryMicros       string `json:"memoryMicros"`
	StorageMicros      string `json:"storageMicros"`
	SnapshotMicros     string `json:"snapshotMicros"`
	ChargedMicros      string `json:"chargedMicros"`
}

func toUsageJSON(s *metering.Summary) usageJSON {
	u := s.Usage
	return usageJSON{
		RunningSeconds: metering.Decimal(u.RunningMs, 1000), VCPUSeconds: metering.Decimal(u.VCPUMs, 1000),
		ActiveCPUSeconds: metering.Decimal(u.ActiveCPUNs, 1e9), BilledCPUSeconds: metering.Decimal(u.BilledCPUNs, 1e9),
		GuestCPUSeconds:  metering.Decimal(s.GuestCPUNs, 1e9),
		MemoryGiBSeconds: metering.Decimal(u.MemoryMiBMs, 1024*1000), StorageGiBSeconds: metering.Decimal(u.StorageMiBMs, 1024*1000),
		SnapshotGiBSeconds: metering.Decimal(u.SnapshotMiBMs, 1024*1000),
		EgressBytes:        u.EgressBytes, IngressBytes: s.IngressBytes, Runs: u.Runs,
		CPUMicros: micros(s.Charge.CPUMicros), MemoryMicros: micros(s.Charge.MemoryMicros),
		StorageMicros: micros(s.Charge.StorageMicros), SnapshotMicros: micros(s.Charge.SnapshotMicros),
		ChargedMicros: micros(s.Charge.TotalMicros),
	}
}

// ratesJSON are the prices usage is charged at.
type ratesJSON struct {
	Currency           string `json:"currency"`
	CPUPerVCPUHour     string `json:"cpuPerVcpuHour"`
	MemoryPerGiBHour   string `json:"memoryPerGiBHour"`
	CPUFloorVCPU       string `json:"cpuFloorVcpu"`
	StoragePerGBMonth  string `json:"storagePerGBMonth"`
	SnapshotPerGiBHour string `json:"snapshotPerGiBHour"`
	EgressPerGB        string `json:"egressPerGB"`
	EgressFreeBytes    int64  `json:"egressFreeBytesPerMonth"`
}

func toRatesJSON(r pricing.Rates) ratesJSON {
	return ratesJSON{Currency: "USD", CPUPerVCPUHour: r.CPUPerVCPUHour, MemoryPerGiBHour: r.MemoryPerGiBHour,
		CPUFloorVCPU: r.CPUFloorVCPU, StoragePerGBMonth: r.StoragePerGBMonth, SnapshotPerGiBHour: r.SnapshotPerGiBHour,
		EgressPerGB: r.EgressPerGB, EgressFreeBytes: r.EgressFreeBytes}
}

// timeParam parses an RFC 3339 time in UTC (ending in Z).
func timeParam(q map[string][]string, name string, required bool, issues *[]issue) time.Time {
	v := ""
	if vs := q[name]; len(vs) > 0 {
		v = vs[0]
	}
	if v == "" {
		if required {
			*issues = append(*issues, issue{Path: name, Message: "is required (RFC 3339, UTC, ending in Z)"})
		}
		return time.Time{}
	}
	t, err := time.Parse(time.RFC3339Nano, v)
	if err != nil || !strings.HasSuffix(v, "Z") {
		*issues = append(*issues, issue{Path: name, Message: "must be an RFC 3339 time in UTC ending in Z, like 2026-12-01T00:00:00Z"})
	}
	return t.UTC()
}

// usageScope is whose usage a call may see: the caller's own, or with an
// admin key and owner=all everyone's ("").
func usageScope(r *http.Request, c *call) (string, error) {
	switch o := r.URL.Query().Get("owner"); {
	case o == "" || o == c.owner:
		return c.owner, nil
	case c.role != RoleAdmin:
		return "", newError(http.StatusForbidden, "forbidden", "Only an admin key can read another key's usage.")
	case o == "all":
		return "", nil
	default:
		return o, nil
	}
}

// get serves GET /v1/usage: usage from..to (default: this month so
// far), in total and grouped by sandbox, key or day.
func (s usageAPI) get(w http.ResponseWriter, r *http.Request, c *call) error {
	from, to, groupBy, err := s.usageRange(r.URL.Query())
	if err != nil {
		return err
	}
	owner, err := usageScope(r, c)
	if err != nil {
		return err
	}
	rates := s.mgr.Rates()
	// Rows are hours: a range covers the hours it touches.
	sums, err := s.sumUsage(r, owner, metering.Query{From: from.Truncate(time.Hour), To: to}, groupBy, rates)
	if err != nil {
		return err
	}
	sums.total.Price(rates)
	slices.Sort(sums.order)
	out := usageAnswerJSON{From: jsonTime(from), To: jsonTime(to), GroupBy: groupBy, Rates: toRatesJSON(rates), Totals: toUsageJSON(&sums.total),
		Groups: []usageGroupJSON{}, Spent: micros(sums.total.Charge.TotalMicros), Credited: "0", Held: "0", Expired: "0", TakenBack: "0"}
	for _, k := range sums.order {
		g := sums.groups[k]
		g.Price(rates)
		kind := ""
		if groupBy == "sandbox" {
			kind = sums.kinds[k]
		}
		out.Groups = append(out.Groups, usageGroupJSON{Key: k, Kind: kind, usageJSON: toUsageJSON(g)})
	}
	out.Outbound.Bytes = sums.total.EgressBytes
	out.Outbound.AllowanceBytes = rates.EgressFreeBytes
	out.Outbound.ChargedMicros = micros(rates.EgressMicros(sums.total.EgressBytes))
	writeJSON(w, http.StatusOK, out)
	return nil
}

// usageRange reads the from, to and groupBy of GET /v1/usage, with their
// defaults: this month so far, grouped by sandbox.
func (s usageAPI) usageRange(q url.Values) (from, to time.Time, groupBy string, err error) {
	var issues []issue
	now := s.now().UTC()
	monthStart := time.Date(now.Year(), now.Month(), 1, 0, 0, 0, 0, time.UTC)
	from, to = timeParam(q, "from", false, &issues), timeParam(q, "to", false, &issues)
	if from.IsZero() {
		from = monthStart
	}
	if to.IsZero() {
		to = now.Add(time.Hour) // the current hour's row too
	}
	groupBy = q.Get("groupBy")
	if groupBy == "" {
		groupBy = "sandbox"
	}
	if !slices.Contains([]string{"sandbox", "key", "day"}, groupBy) {
		issues = append(issues, issue{Path: "groupBy", Message: "must be sandbox, key or day"})
	}
	if !to.After(from) {
		issues = append(issues, issue{Path: "to", Message: "must be after from"})
	}
	if len(issues) > 0 {
		return time.Time{}, time.Time{}, "", invalid(issues)
	}
	return from, to, groupBy, nil
}

// usageSums are the usage rows of a range summed in total and by group.
type usageSums struct {
	total  metering.Summary
	groups map[string]*metering.Summary
	kinds  map[string]string // the kind of resource of each group's first row
	order  []string          // the groups' keys, as first seen
}

// sumUsage sums owner's usage rows that q selects, grouped by groupBy.
func (s usageAPI) sumUsage(r *http.Request, owner string, q metering.Query, groupBy string, rates pricing.Rates) (*usageSums, error) {
	sums := &usageSums{groups: map[string]*metering.Summary{}, kinds: map[string]string{}}
	err := s.mgr.EachUsageRow(r.Context(), owner, q, func(row metering.Row) error {
		sums.total.Add(row, rates)
		key := row.ResourceID
		switch groupBy {
		case "key":
			key = row.Owner
		case "day":
			key = row.Hour.Format(time.DateOnly)
		}
		g := sums.groups[key]
		if g == nil {
			g = &metering.Summary{}
			sums.groups[key] = g
			sums.order = append(sums.order, key)
			sums.kinds[key] = row.Kind
		}
		g.Add(row, rates)
		return nil
	})
	if err != nil {
		return nil, err
	}
	return sums, nil
}

// usageGroupJSON is one group of GET /v1/usage.
type usageGroupJSON struct {
	Key  string `json:"key"`
	Kind string `json:"kind,omitempty"`
	usageJSON
}

// usageAnswerJSON is the answer of GET /v1/usage.
type usageAnswerJSON struct {
	From     jsonTime         `json:"from"`
	To       jsonTime         `json:"to"`
	GroupBy  string           `json:"groupBy"`
	Rates    ratesJSON        `json:"rates"`
	Totals   usageJSON        `json:"totals"`
	Groups   []usageGroupJSON `json:"groups"`
	Spent    string           `json:"spent"`
	Credited string           `json:"credited"`
	Held     string           `json:"held"`
	Expired  string           `json:"expired"`
	// Available is null: a self-hosted server has no credit.
	Available *string `json:"available"`
	TakenBack string  `json:"takenBack"`
	Trial     *int64  `json:"trial"`
	Outbound  struct {
		Bytes          int64  `json:"bytes"`
		AllowanceBytes int64  `json:"allowanceBytes"`
		ChargedMicros  string `json:"chargedMicros"`
	} `json:"outbound"`
}

// Export pages.
const (
	defaultExportLimit = 1000
	maxExportLimit     = 10000
)

var exportHeader = []string{"hour", "resource_type", "resource_id", "key_id", "running_seconds", "vcpu_seconds",
	"memory_gib_seconds", "active_cpu_seconds", "billed_cpu_seconds", "guest_cpu_seconds", "storage_gib_seconds",
	"egress_bytes", "ingress_bytes", "runs", "cpu_micros", "memory_micros", "storage_micros", "charged_micros", "final"}

// export serves GET /v1/usage/export: settled usage rows, one per
// resource and clock hour, as CSV pages.
func (s usageAPI) export(w http.ResponseWriter, r *http.Request, c *call) error {
	q := r.URL.Query()
	var issues []issue
	since, until := timeParam(q, "since", true, &issues), timeParam(q, "until", true, &issues)
	limit := defaultExportLimit
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > maxExportLimit {
			issues = append(issues, issue{Path: "limit", Message: fmt.Sprintf("must be from 1 to %d", maxExportLimit)})
		}
		limit = n
	}
	var afterHour time.Time
	var afterID string
	cursor := q.Get("cursor")
	if cursor != "" {
		var ok bool
		if afterHour, afterID, ok = parseExportCursor(cursor); !ok {
			issues = append(issues, issue{Path: "cursor", Message: "is not a cursor this server gave"})
		}
	}
	if len(issues) == 0 && !until.After(since) {
		issues = append(issues, issue{Path: "until", Message: "must be after since"})
	}
	if len(issues) > 0 {
		return invalid(issues)
	}
	owner, err := usageScope(r, c)
	if err != nil {
		return err
	}
	// A row is an hour's: it is in the range if its hour starts in it.
	var rows []metering.Row // at most limit + 1
	err = s.mgr.EachUsageRow(r.Context(), owner, metering.Query{From: since, To: until,
		AfterHour: afterHour, AfterID: afterID, Limit: limit + 1}, func(row metering.Row) error {
		rows = append(rows, row)
		return nil
	})
	if err != nil {
		return err
	}
	var next *string
	if len(rows) > limit {
		rows = rows[:limit]
		last := rows[len(rows)-1]
		cur := exportCursor(last.Hour, last.ResourceID)
		next = &cur
	}
	final, err := s.mgr.SettledThrough(r.Context())
	if err != nil {
		return err
	}
	rates := s.mgr.Rates()
	var b strings.Builder
	cw := csv.NewWriter(&b)
	if cursor == "" {
		_ = cw.Write(exportHeader)
	}
	for _, row := range rows {
		sum := metering.Summarize([]metering.Row{row}, rates)
		u := sum.Usage
		_ = cw.Write([]string{row.Hour.Format(time.RFC3339), row.Kind, row.ResourceID, row.Owner,
			metering.Decimal(u.RunningMs, 1000), metering.Decimal(u.VCPUMs, 1000), metering.Decimal(u.MemoryMiBMs, 1024*1000),
			metering.Decimal(u.ActiveCPUNs, 1e9), metering.Decimal(u.BilledCPUNs, 1e9), metering.Decimal(sum.GuestCPUNs, 1e9),
			metering.Decimal(u.StorageMiBMs+u.SnapshotMiBMs, 1024*1000),
			strconv.FormatInt(u.EgressBytes, 10), strconv.FormatInt(sum.IngressBytes, 10), strconv.FormatInt(u.Runs, 10),
			micros(sum.Charge.CPUMicros), micros(sum.Charge.MemoryMicros), micros(sum.Charge.StorageMicros + sum.Charge.SnapshotMicros),
			micros(sum.Charge.TotalMicros), strconv.FormatBool(row.Final)})
	}
	cw.Flush()
	writeJSON(w, http.StatusOK, struct {
		CSV          string   `json:"csv"`
		Rows         int      `json:"rows"`
		NextCursor   *string  `json:"nextCursor"`
		FinalThrough jsonTime `json:"finalThrough"`
	}{CSV: b.String(), Rows: len(rows), NextCursor: next, FinalThrough: jsonTime(final)})
	return nil
}

func exportCursor(hour time.Time, id string) string {
	return base64.RawURLEncoding.EncodeToString([]byte(strconv.FormatInt(hour.Unix(), 10) + "/" + id))
}

func parseExportCursor(s string) (time.Time, string, bool) {
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil {
		return time.Time{}, "", false
	}
	h, id, ok := strings.Cut(string(b), "/")
	n, err := strconv.ParseInt(h, 10, 64)
	if !ok || err != nil || n <= 0 || id == "" || len(id) > 128 {
		return time.Time{}, "", false
	}
	return time.Unix(n, 0).UTC(), id, true
}

// compare serves GET /v1/usage/compare: the caller's usage over the
// last days priced here and at a rival's published rates. With no usage,
// the product page's example workload is priced instead (basis example).
func (s usageAPI) compare(w http.ResponseWriter, r *http.Request, c *call) error {
	q := r.URL.Query()
	var issues []issue
	id := q.Get("provider")
	p, ok := pricing.LookupProvider(id)
	if !ok || id == "runtime" {
		var known []string
		for _, p := range pricing.Providers() {
			if p.ID != "runtime" {
				known = append(known, p.ID)
			}
		}
		issues = append(issues, issue{Path: "provider", Message: "must be one of " + strings.Join(known, ", ")})
	}
	days := 30
	if v := q.Get("days"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 90 {
			issues = append(issues, issue{Path: "days", Message: "must be from 1 to 90"})
		}
		days = n
	}
	if len(issues) > 0 {
		return invalid(issues)
	}
	rates := s.mgr.Rates()
	now := s.now().UTC()
	sum, err := s.summarize(r, c.owner, metering.Query{From: now.Add(-time.Duration(days) * 24 * time.Hour).Truncate(time.Hour)})
	if err != nil {
		return err
	}
	basis, note, scale := "settled", "", monthScale(days)
	usage := sum.Usage
	if usage.RunningMs == 0 {
		basis, scale = "example", 1
		usage, err = rates.Workload(40000, 90*time.Second, 2, 4096, 15*time.Second)
		if err != nil {
			return err
		}
		note = "No usage yet: priced 40,000 runs a month of 90 s each, 2 vCPU and 4 GiB, busy for 15 CPU-seconds per run."
	}
	here := rates.Charge(usage).TotalMicros
	rival := p.Price(usage).TotalMicros
	saving := rival - here
	pct := 0.0
	if rival > 0 {
		pct = math.Round(float64(saving)*1000/float64(rival)) / 10
	}
	type month struct {
		RuntimeMicros string `json:"runtimeMicros"`
		RivalMicros   string `json:"rivalMicros"`
		SavingMicros  string `json:"savingMicros"`
	}
	scaled := func(n int64) string { return micros(int64(math.Round(float64(n) * scale))) }
	writeJSON(w, http.StatusOK, struct {
		Provider      string           `json:"provider"`
		ProviderName  string           `json:"providerName"`
		Days          int              `json:"days"`
		Basis         string           `json:"basis"`
		Note          *string          `json:"note"`
		RuntimeMicros string           `json:"runtimeMicros"`
		RivalMicros   string           `json:"rivalMicros"`
		SavingMicros  string           `json:"savingMicros"`
		SavingPercent float64          `json:"savingPercent"`
		PerMonth      month            `json:"perMonth"`
		Rival         pricing.Provider `json:"rival"`
		Rates         ratesJSON        `json:"rates"`
	}{Provider: p.ID, ProviderName: p.Name, Days: days, Basis: basis, Note: optString(note),
		RuntimeMicros: micros(here), RivalMicros: micros(rival), SavingMicros: micros(saving), SavingPercent: pct,
		PerMonth: month{RuntimeMicros: scaled(here), RivalMicros: scaled(rival), SavingMicros: scaled(saving)},
		Rival:    p, Rates: toRatesJSON(rates)})
	return nil
}

// summarize adds up owner's rows that q selects, priced.
func (s usageAPI) summarize(r *http.Request, owner string, q metering.Query) (metering.Summary, error) {
	rates := s.mgr.Rates()
	var sum metering.Summary
	err := s.mgr.EachUsageRow(r.Context(), owner, q, func(row metering.Row) error {
		sum.Add(row, rates)
		return nil
	})
	sum.Price(rates)
	return sum, err
}

// monthScale scales usage over days to a 30-day month.
func monthScale(days int) float64 { return 30 / float64(days) }

// me serves GET /v1/me: who this key is.
func (s usageAPI) me(w http.ResponseWriter, r *http.Request, c *call) error {
	name := ""
	if kl, ok := s.keys.(KeyLister); ok {
		if keys, err := kl.ListKeys(r.Context()); err == nil {
			for _, k := range keys {
				if k.ID == c.owner {
					name = k.Name
				}
			}
		}
	}
	accel := ""
	if s.accel != nil {
		accel = s.accel()
	}
	writeJSON(w, http.StatusOK, map[string]any{
		"orgId": "local", "orgName": "emberbox", "keyId": c.owner, "keyName": name, "role": c.role,
		"access": "full", "agent": nil, "credential": map[string]any{"type": "api_key", "id": c.owner},
		"server": map[string]any{"version": s.version, "accel": accel},
	})
	return nil
}

// getLimits serves GET /v1/limits: the quotas this key is held to and what
// it holds now, and what it was charged in the last 24 hours.
func (s usageAPI) getLimits(w http.ResponseWriter, r *http.Request, c *call) error {
	now := s.now().UTC()
	day, err := s.summarize(r, c.owner, metering.Query{From: now.Add(-24 * time.Hour).Truncate(time.Hour)})
	if err != nil {
		return err
	}
	quota, used := s.mgr.KeyLimits(c.owner)
	row := func(limit, label, unit string, max, used int64) map[string]any {
		var m any
		if max > 0 {
			m = max
		}
		return map[string]any{"limit": limit, "label": label, "unit": unit, "max": m, "used": used}
	}
	writeJSON(w, http.StatusOK, map[string]any{
		"access": "full",
		"daily":  map[string]any{"limitMicros": nil, "usedMicros": micros(day.Charge.TotalMicros), "remainingMicros": nil},
		"trial":  nil,
		"credit": nil,
		"account": []map[string]any{
			row("sandbox.count", "Sandboxes held at once", "count", int64(quota.Sandboxes), int64(used.Sandboxes)),
			row("sandbox.vcpu", "vCPUs held at once", "count", int64(quota.VCPU), int64(used.VCPU)),
			row("sandbox.memory_mib", "Memory held at once", "mib", quota.MemoryMiB, used.MemoryMiB),
			row("sandbox.disk_mib", "Disk held at once (volumes included)", "mib", quota.DiskMiB, used.DiskMiB),
			row("sandbox.boots", "Boots at once", "count", int64(quota.Boots), int64(used.Boots)),
			row("volume.count", "Volumes kept", "count", int64(quota.Volumes), int64(used.Volumes)),
			row("volume.size_mib", "Size of volumes kept", "mib", quota.VolumeMiB, used.VolumeMiB),
		},
	})
	return nil
}

// Metrics ranges: how far back, and the step of their points.
var metricRanges = map[string]struct{ span, step time.Duration }{
	"15m": {15 * time.Minute, 15 * time.Second},
	"1h":  {time.Hour, time.Minute},
	"6h":  {6 * time.Hour, 5 * time.Minute},
	"24h": {24 * time.Hour, 15 * time.Minute},
	"7d":  {7 * 24 * time.Hour, time.Hour},
	"30d": {30 * 24 * time.Hour, 6 * time.Hour},
}

type metricPoint struct {
	At              jsonTime `json:"at"`
	CPUPercent      *float64 `json:"cpuPercent"`      // of its vCPUs; the VMM's own work counts, so it can pass 100
	CPUCores        *float64 `json:"cpuCores"`        // cores busy on average
	GuestCPUPercent *float64 `json:"guestCpuPercent"` // as the guest reports it
	MemoryBytes     *int64   `json:"memoryBytes"`     // resident memory of its VM
}

// metricStep is what was measured of a sandbox in one step of its
// metrics.
type metricStep struct {
	span       time.Duration
	cpu, guest int64
	rss        int64
	seen       bool
}

// metricSteps reads sandbox id and what was measured of it from from to
// now, in n steps of step: from its metered intervals for steps under an
// hour, else from its hourly usage rows.
func (s usageAPI) metricSteps(r *http.Request, c *call, id string, step time.Duration, from, now time.Time, n int) (*sandbox.Sandbox, []metricStep, error) {
	steps := make([]metricStep, n)
	if step < time.Hour {
		sb, pts, err := s.mgr.Metrics(r.Context(), c.owner, id, from, now.Add(time.Second))
		if err != nil {
			return nil, nil, err
		}
		for _, p := range pts {
			i := int(p.At.Sub(from) / step)
			if i < 0 || i >= n {
				continue
			}
			a := &steps[i]
			a.span += p.Span
			a.cpu += p.CPUNs
			a.guest += p.GuestCPUNs
			a.rss, a.seen = max(a.rss, p.RSSBytes), true
		}
		return sb, steps, nil
	}
	sb, _, err := s.mgr.Metrics(r.Context(), c.owner, id, now, now)
	if err != nil {
		return nil, nil, err
	}
	err = s.mgr.EachUsageRow(r.Context(), c.owner, metering.Query{ResourceIDs: []string{id}, From: from}, func(row metering.Row) error {
		i := int(row.Hour.Sub(from) / step)
		if i < 0 || i >= n || row.RunningMs == 0 {
			return nil
		}
		a := &steps[i]
		a.span += time.Duration(row.RunningMs) * time.Millisecond
		a.cpu += row.CPUNs
		a.guest += row.GuestCPUNs
		a.rss, a.seen = max(a.rss, row.RSSMaxBytes), true
		return nil
	})
	if err != nil {
		return nil, nil, err
	}
	return sb, steps, nil
}

// sandboxMetrics serves GET /v1/sandboxes/{id}/metrics?range=: its CPU
// and memory as the host measured them, one point per step.
func (s usageAPI) sandboxMetrics(w http.ResponseWriter, r *http.Request, c *call) error {
	rng := r.URL.Query().Get("range")
	if rng == "" {
		rng = "1h"
	}
	spec, ok := metricRanges[rng]
	if !ok {
		return invalid([]issue{{Path: "range", Message: "must be 15m, 1h, 6h, 24h, 7d or 30d"}})
	}
	now := s.now().UTC()
	from := now.Add(-spec.span).Truncate(spec.step)
	n := int(now.Sub(from)/spec.step) + 1
	sb, steps, err := s.metricSteps(r, c, r.PathValue("id"), spec.step, from, now, n)
	if err != nil {
		return err
	}
	vcpu := float64(max(sb.VCPU, 1))
	round := func(x float64) *float64 { v := math.Round(x*100) / 100; return &v }
	points := make([]metricPoint, n)
	var latest *metricPoint
	for i, a := range steps {
		p := metricPoint{At: jsonTime(from.Add(time.Duration(i) * spec.step))}
		if a.seen && a.span > 0 {
			cores := float64(a.cpu) / float64(a.span)
			p.CPUCores, p.CPUPercent = round(cores), round(cores*100/vcpu)
			p.GuestCPUPercent = round(float64(a.guest) / float64(a.span) * 100 / vcpu)
			rss := a.rss
			p.MemoryBytes = &rss
			latest = &points[i]
		}
		points[i] = p
	}
	writeJSON(w, http.StatusOK, map[string]any{
		"sandboxId": sb.ID, "range": rng, "from": jsonTime(from), "to": jsonTime(now),
		"stepSeconds": int(spec.step / time.Second), "vcpu": sb.VCPU,
		"memoryLimitBytes": int64(sb.MemoryMiB) << 20, "diskLimitBytes": int64(sb.DiskMiB) << 20,
		"points": points, "latest": latest,
	})
	return nil
}

// serveMetrics serves GET /metrics: the server's Prometheus metrics, which
// name every key's sandboxes, so to admin keys only.
func (s *server) serveMetrics(w http.ResponseWriter, r *http.Request, c *call) error {
	if c.role != RoleAdmin {
		return newError(http.StatusForbidden, "forbidden", "Only an admin key can read the server's metrics.")
	}
	if s.metrics == nil {
		return newError(http.StatusNotFound, "route_not_found", "This server does not serve metrics.")
	}
	s.metrics.ServeHTTP(w, r)
	return nil
}

// sandboxUsage serves GET /v1/sandboxes/{id}/usage: everything metered for
// one sandbox so far, priced.
func (s usageAPI) sandboxUsage(w http.ResponseWriter, r *http.Request, c *call) error {
	sb, err := s.mgr.Get(r.Context(), c.owner, r.PathValue("id"))
	if err != nil {
		return err
	}
	if err := s.mgr.AttachUsage(r.Context(), sb); err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, struct {
		SandboxID string    `json:"sandboxId"`
		Rates     ratesJSON `json:"rates"`
		usageJSON
	}{SandboxID: sb.ID, Rates: toRatesJSON(s.mgr.Rates()), usageJSON: toUsageJSON(sb.Usage)})
	return nil
}
