package sandbox

import (
	"errors"
	"time"

	"github.com/emberbox/emberbox/internal/errdefs"
)

// Observer is told of lifecycle outcomes, for monitoring;
// *telemetry.Metrics implements it.
type Observer interface {
	// SandboxOp counts an operation (create, stop, pause, ...) by its
	// outcome: ok, refused (the caller's or the host's limits, the
	// sandbox's state) or error.
	SandboxOp(op, outcome string)
	// ObserveBoot records how long a VM took to be ready: cold, template,
	// restore (a wake) or fork.
	ObserveBoot(kind string, d time.Duration)
	// LeaseExpired counts a lease end by what it did.
	LeaseExpired(action string)
	// EgressRefused counts a refused egress connection or lookup.
	EgressRefused(reason string)
}

type noObserver struct{}

func (noObserver) SandboxOp(string, string)          {}
func (noObserver) ObserveBoot(string, time.Duration) {}
func (noObserver) LeaseExpired(string)               {}

// outcomes tells the Observer how operations and boots went.
type outcomes struct{ obs Observer }

// op counts an operation by its outcome.
func (o outcomes) op(op string, err error) {
	outcome := "ok"
	switch {
	case err == nil:
	case errdefs.IsNotFound(err) || errdefs.IsConflict(err) || errdefs.IsInvalidArgument(err) ||
		errors.Is(err, errdefs.ErrPermission) || errors.Is(err, errdefs.ErrUnavailable):
		outcome = "refused"
	default:
		outcome = "error"
	}
	o.obs.SandboxOp(op, outcome)
}

// ready records the boot or restore whose ready event carries data.
func (o outcomes) ready(data map[string]any) {
	ms := func(k string) (time.Duration, bool) {
		v, ok := data[k].(int64)
		return time.Duration(v) * time.Millisecond, ok
	}
	switch {
	case data["template"] == true:
		if d, ok := ms("resumeMs"); ok {
			o.obs.ObserveBoot("template", d)
		}
	case data["snapshotId"] != nil:
		if d, ok := ms("resumeMs"); ok {
			o.obs.ObserveBoot("fork", d)
		}
	default:
		if d, ok := ms("wakeMs"); ok {
			o.obs.ObserveBoot("restore", d)
		} else if d, ok := ms("bootMs"); ok {
			o.obs.ObserveBoot("cold", d)
		}
	}
}

func (noObserver) EgressRefused(string) {}
