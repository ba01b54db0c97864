package sandbox

import (
	"context"
	"time"

	"github.com/emberbox/emberbox/internal/admission"
	"github.com/emberbox/emberbox/internal/metering"
	"github.com/emberbox/emberbox/internal/pricing"
)

// Rates are the prices usage is charged at.
func (mt *Meter) Rates() pricing.Rates { return mt.rates }

// AttachUsage sets the Usage of each sandbox: everything metered for it so
// far, priced at mt's rates.
func (mt *Meter) AttachUsage(ctx context.Context, sbs ...*Sandbox) error {
	if len(sbs) == 0 {
		return nil
	}
	ids := make([]string, len(sbs))
	for i, sb := range sbs {
		ids[i] = sb.ID
	}
	sums := map[string]*metering.Summary{}
	err := mt.store.EachUsageRow(ctx, metering.Query{ResourceIDs: ids}, func(r metering.Row) error {
		s := sums[r.ResourceID]
		if s == nil {
			s = &metering.Summary{}
			sums[r.ResourceID] = s
		}
		s.Add(r, mt.rates)
		return nil
	})
	if err != nil {
		return err
	}
	for _, sb := range sbs {
		s := sums[sb.ID]
		if s == nil {
			s = &metering.Summary{}
		}
		s.Price(mt.rates)
		sb.Usage = s
	}
	return nil
}

// EachUsageRow calls fn with each of owner's usage rows that q selects,
// oldest hour first.
func (mt *Meter) EachUsageRow(ctx context.Context, owner string, q metering.Query, fn func(metering.Row) error) error {
	q.Owner = owner // "" is every key's: the API lets only an admin ask
	return mt.store.EachUsageRow(ctx, q, fn)
}

// SettledThrough is the time before which no usage row can change any
// more: the start of the hour of the oldest open interval, or of the
// last full meter interval.
func (mt *Meter) SettledThrough(ctx context.Context) (time.Time, error) {
	t := mt.host.now().Add(-2 * mt.every())
	oldest, ok, err := mt.store.OldestOpenMeter(ctx)
	if err != nil {
		return time.Time{}, err
	}
	if ok && oldest.Before(t) {
		t = oldest
	}
	return t.UTC().Truncate(time.Hour), nil
}

// Metrics returns owner's sandbox id and its settled intervals that end
// in [from, to).
func (mt *Meter) Metrics(ctx context.Context, owner, id string, from, to time.Time) (*Sandbox, []metering.Point, error) {
	sb, err := mt.host.Get(ctx, owner, id)
	if err != nil {
		return nil, nil, err
	}
	pts, err := mt.store.MeterPoints(ctx, id, from, to)
	return sb, pts, err
}

// KeyLimits returns what one key may hold at once and what it holds now.
func (mt *Meter) KeyLimits(owner string) (admission.Quota, admission.Usage) {
	return mt.ledger.Quota(), mt.ledger.Owner(owner)
}

// Reading is one live sandbox's meters, for monitoring.
type Reading struct {
	ID, Owner string
	Usage     *metering.Summary // everything settled so far
	RSSBytes  int64             // resident memory at the newest reading
}

// Readings returns the meters of every sandbox that has a VM.
func (mt *Meter) Readings(ctx context.Context) ([]Reading, error) {
	live, err := mt.records.ListLive(ctx)
	if err != nil {
		return nil, err
	}
	if err := mt.AttachUsage(ctx, live...); err != nil {
		return nil, err
	}
	now := mt.host.now()
	out := make([]Reading, 0, len(live))
	for _, sb := range live {
		r := Reading{ID: sb.ID, Owner: sb.OwnerKeyID, Usage: sb.Usage}
		if pts, err := mt.store.MeterPoints(ctx, sb.ID, now.Add(-3*mt.every()), now.Add(time.Second)); err == nil && len(pts) > 0 {
			r.RSSBytes = pts[len(pts)-1].RSSBytes
		}
		out = append(out, r)
	}
	return out, nil
}
