package sandbox

import (
	"context"
	"sync"

	"github.com/emberbox/emberbox/internal/admission"
)

// diskPressure is the reaper's record of what each running sandbox's files
// took on the host at the previous tick, and whether it has already said
// that nothing it could pause was growing.
type diskPressure struct {
	sizes  map[string]int64
	warned bool
}

// relieveDiskPressure keeps the data dir's filesystem from filling under
// running guests. A guest's memory is a shared mapping of a sparse file in
// its directory (docs/DESIGN.md D13) and its disk a thin overlay: both take
// blocks as the guest writes, nothing promised them, and a VM whose memory
// file cannot get a block dies of SIGBUS. So each tick measures what every
// running sandbox's files take. When the free space, less twice what they
// grew since the previous tick (the next second at this rate, and one to
// spare), would be below the floor, every sandbox that grew is paused at
// once, with a call in flight or not: a pause stops the guest's writes and
// needs almost no new blocks (its memory is in its file already), where a
// full disk would end the VM. Sandboxes that did not grow are left alone:
// pausing them gives no space back. Admission's disk reserve refuses
// creates and wakes before this point. It returns the ids paused.
func (rp *Reaper) relieveDiskPressure(ctx context.Context, live []*Sandbox) []string {
	if rp.diskFloorMiB <= 0 {
		return nil
	}
	sizes := make(map[string]int64, len(live))
	var grownBytes int64
	var growers []string
	for _, sb := range live {
		if sb.State != StateRunning || rp.host.liveInstance(sb.ID) == nil {
			continue
		}
		n := allocated(rp.files.dir(sb.ID))
		sizes[sb.ID] = n
		if prev, ok := rp.disk.sizes[sb.ID]; ok && n > prev {
			grownBytes += n - prev
			growers = append(growers, sb.ID)
		}
	}
	rp.disk.sizes = sizes
	read := rp.diskFree
	if read == nil {
		read = func() (int64, error) { return admission.DiskFreeMiB(rp.files.dataDir) }
	}
	free, err := read()
	if err != nil {
		rp.log.Warn("reading the data dir's free space", "err", err)
		return nil
	}
	grown := grownBytes >> 20
	if free-2*grown >= rp.diskFloorMiB {
		rp.disk.warned = false
		return nil
	}
	if len(growers) == 0 {
		if !rp.disk.warned {
			rp.disk.warned = true
			rp.log.Warn("the data dir's free space is low and no running sandbox is growing", "free_mib", free, "floor_mib", rp.diskFloorMiB)
		}
		return nil
	}
	rp.log.Warn("the data dir's free space is low; pausing every sandbox whose files grew", "sandboxes", len(growers),
		"free_mib", free, "grown_mib", grown, "floor_mib", rp.diskFloorMiB)
	var wg sync.WaitGroup
	paused := make([]bool, len(growers))
	for i, id := range growers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := rp.host.pause(ctx, id, PauseDiskPressure); err != nil {
				rp.log.Error("pausing under disk pressure", "sandbox_id", id, "err", err)
				return
			}
			paused[i] = true
		}()
	}
	wg.Wait()
	var out []string
	for i, id := range growers {
		if paused[i] {
			out = append(out, id)
		}
	}
	return out
}
