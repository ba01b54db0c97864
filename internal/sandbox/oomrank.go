package sandbox

import (
	"github.com/emberbox/emberbox/internal/vmm"
)

// Where each VM stands with the host kernel's OOM killer, should the host
// ever run out of memory despite admission and the pressure pause: the
// server (serve sets its own score far below) outlasts every VM, a VM with
// work in flight outlasts an idle one, and any VM goes before the host's
// other programs (score 0). The kernel adds each process's share of memory
// (0 to 1000) to its score, so an idle VM is chosen first unless a working
// one holds far more.
const (
	OOMScoreServer = -900
	oomScoreIdle   = 800
	oomScoreBusy   = 200
)

// rankForOOM sets each running VM's OOM score by whether it has work in
// flight, writing only the scores that changed. A VM inherits the server's
// score as it starts, so the first tick after a start always writes.
func (rp *Reaper) rankForOOM(live []*Sandbox) {
	for _, sb := range live {
		if sb.State != StateRunning {
			continue
		}
		in := rp.host.liveInstance(sb.ID)
		if in == nil {
			continue
		}
		mach := in.vm()
		scorer, ok := mach.(vmm.OOMScorer)
		if !ok {
			continue
		}
		want := oomScoreIdle
		if in.working() {
			want = oomScoreBusy
		}
		in.mu.Lock()
		done := in.oomScored == mach && in.oomScore == want
		in.mu.Unlock()
		if done {
			continue
		}
		if err := scorer.SetOOMScore(want); err != nil {
			rp.log.Debug("setting a vm's oom score", "sandbox_id", sb.ID, "err", err)
			continue
		}
		in.mu.Lock()
		in.oomScored, in.oomScore = mach, want
		in.mu.Unlock()
	}
}
