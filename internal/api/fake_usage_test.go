package api

import (
	"context"
	"slices"
	"time"

	"github.com/emberbox/emberbox/internal/admission"
	"github.com/emberbox/emberbox/internal/metering"
	"github.com/emberbox/emberbox/internal/pricing"
	"github.com/emberbox/emberbox/internal/sandbox"
)

// fakeUsage is the metering side of fakeManager: rows and points a test
// sets, filtered as the store filters them.
type fakeUsage struct {
	rows   []metering.Row
	points map[string][]metering.Point
}

func (m *fakeManager) Rates() pricing.Rates { return pricing.DefaultRates() }

func (m *fakeManager) AttachUsage(ctx context.Context, sbs ...*sandbox.Sandbox) error {
	for _, sb := range sbs {
		rows, _ := m.usageRows("", metering.Query{ResourceIDs: []string{sb.ID}})
		s := metering.Summarize(rows, m.Rates())
		sb.Usage = &s
	}
	return nil
}

func (m *fakeManager) EachUsageRow(ctx context.Context, owner string, q metering.Query, fn func(metering.Row) error) error {
	rows, err := m.usageRows(owner, q)
	for _, r := range rows {
		if err := fn(r); err != nil {
			return err
		}
	}
	return err
}

func (m *fakeManager) usageRows(owner string, q metering.Query) ([]metering.Row, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []metering.Row
	for _, r := range m.usage.rows {
		switch {
		case owner != "" && r.Owner != owner,
			len(q.ResourceIDs) > 0 && !slices.Contains(q.ResourceIDs, r.ResourceID),
			!q.From.IsZero() && r.Hour.Before(q.From),
			!q.To.IsZero() && !r.Hour.Before(q.To),
			!q.AfterHour.IsZero() && (r.Hour.Before(q.AfterHour) || r.Hour.Equal(q.AfterHour) && r.ResourceID <= q.AfterID):
			continue
		}
		out = append(out, r)
	}
	slices.SortFunc(out, func(a, b metering.Row) int {
		if c := a.Hour.Compare(b.Hour); c != 0 {
			return c
		}
		return compareStrings(a.ResourceID, b.ResourceID)
	})
	if q.Limit > 0 && len(out) > q.Limit {
		out = out[:q.Limit]
	}
	return out, nil
}

func compareStrings(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func (m *fakeManager) SettledThrough(ctx context.Context) (time.Time, error) {
	return time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC), nil
}

func (m *fakeManager) Metrics(ctx context.Context, owner, id string, from, to time.Time) (*sandbox.Sandbox, []metering.Point, error) {
	sb, err := m.Get(ctx, owner, id)
	if err != nil {
		return nil, nil, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []metering.Point
	for _, p := range m.usage.points[id] {
		if !p.At.Before(from) && p.At.Before(to) {
			out = append(out, p)
		}
	}
	return sb, out, nil
}

func (m *fakeManager) KeyLimits(owner string) (admission.Quota, admission.Usage) {
	return admission.Quota{Sandboxes: 8, MemoryMiB: 32768}, admission.Usage{Sandboxes: 1, MemoryMiB: 4096}
}
