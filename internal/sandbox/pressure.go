package sandbox

import (
	"context"

	"github.com/emberbox/emberbox/internal/admission"
)

// relievePressure pauses one running sandbox when the host's available
// memory is below the floor: the one whose last API call is oldest among
// those a call would wake again (autoWake on, not persistent), preferring
// one with no call in flight. A paused
// sandbox holds no host memory (docs/DESIGN.md D13), so this is what keeps
// a host whose memory is overcommitted (--memory-overcommit above 1) out of
// swap and the OOM killer when its idle sandboxes grow. One a tick: a pause
// frees its memory within a fraction of a second, and the next tick looks
// again. It returns the id paused, or "".
func (rp *Reaper) relievePressure(ctx context.Context, live []*Sandbox) string {
	if rp.memoryFloorMiB <= 0 {
		return ""
	}
	read := rp.memAvailable
	if read == nil {
		read = admission.MemAvailableMiB
	}
	avail, err := read()
	if err != nil || avail >= rp.memoryFloorMiB {
		return ""
	}
	var victim *Sandbox
	var oldest int64
	victimWorking := false
	for _, sb := range live {
		if sb.State != StateRunning || sb.Persistent || !sb.AutoWake {
			continue
		}
		in := rp.host.liveInstance(sb.ID)
		if in == nil {
			continue
		}
		// A sandbox with a call in flight goes only when every candidate
		// has one: pausing it fails that call, but the OOM killer would
		// end the whole VM.
		working, last := in.working(), in.active.Load()
		if victim == nil || (victimWorking && !working) || (working == victimWorking && last < oldest) {
			victim, oldest, victimWorking = sb, last, working
		}
	}
	if victim == nil {
		rp.log.Warn("host memory is low and no sandbox can be paused", "available_mib", avail, "floor_mib", rp.memoryFloorMiB)
		return ""
	}
	rp.log.Warn("host memory is low; pausing the sandbox idle longest", "sandbox_id", victim.ID,
		"available_mib", avail, "floor_mib", rp.memoryFloorMiB)
	if _, err := rp.host.pause(ctx, victim.ID, PauseMemoryPressure); err != nil {
		rp.log.Error("pausing under memory pressure", "sandbox_id", victim.ID, "err", err)
		return ""
	}
	return victim.ID
}
