package sandbox

import (
	"strings"

	"github.com/emberbox/emberbox/internal/admission"
)

// account keeps the admission ledger in step with the record, as every
// transition goes through update: a sandbox gives back its boot slot when
// it runs, all but its disk when it enters paused, and everything when it
// is stopped or deleted (the ledger releases once however often this is
// called). Entering paused happens only under the sandbox's VM lock, which
// a stop or delete takes before it can release, so the shrink never
// follows a release.
func account(ledger *admission.Ledger, sb *Sandbox, entered bool) {
	switch sb.State {
	case StateRunning:
		ledger.Booted(sb.ID)
	case StatePaused:
		if entered {
			ledger.Restore(claim(sb))
		}
	case StateStopped, StateDeleted:
		ledger.Release(sb.ID)
	}
}

// LabelQuotaKey, on a sandbox of an internal owner ("system:…": image
// build and import sandboxes), names the API key whose quotas it counts
// against: the key whose work it does. On a tenant's sandbox it means
// nothing, so no key can charge another.
const LabelQuotaKey = "emberbox.quota/key"

// quotaOwner is the key sb counts against in the admission ledger.
func quotaOwner(sb *Sandbox) string {
	if k := sb.Labels[LabelQuotaKey]; k != "" && strings.HasPrefix(sb.OwnerKeyID, "system:") {
		return k
	}
	return sb.OwnerKeyID
}

// claim is what sb holds in the admission ledger: a paused sandbox holds
// its disk alone, as it has no VM.
func claim(sb *Sandbox) admission.Claim {
	c := admission.Claim{ID: sb.ID, Owner: quotaOwner(sb), Booting: sb.State == StateStarting || sb.State == StateResuming,
		Resources: admission.Resources{VCPU: sb.VCPU, MemoryMiB: int64(sb.MemoryMiB), DiskMiB: int64(sb.DiskMiB)}}
	if sb.State == StatePaused {
		c.VCPU, c.MemoryMiB, c.Booting = 0, 0, false
	}
	return c
}
