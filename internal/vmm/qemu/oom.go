package qemu

import (
	"errors"
	"fmt"
	"os"
	"strconv"
)

// SetOOMScore implements vmm.OOMScorer. The VMM is checked to be the
// process it started as (its start time), so that a pid the kernel has
// handed on after the VMM exited is never touched.
func (m *machine) SetOOMScore(adj int) error {
	if adj < -1000 || adj > 1000 {
		return fmt.Errorf("oom_score_adj %d out of range", adj)
	}
	select {
	case <-m.exited:
		return errors.New("the vm has exited")
	default:
	}
	if st, err := procStartTime(m.pid); err != nil || st != m.startTime {
		return fmt.Errorf("the vm's process %d is gone", m.pid)
	}
	return os.WriteFile(fmt.Sprintf("/proc/%d/oom_score_adj", m.pid), []byte(strconv.Itoa(adj)), 0)
}
