package sandbox

import (
	"os"
	"path/filepath"

	"github.com/emberbox/emberbox/internal/guest"
)

// SetUpdateHooks installs test hooks into m's record updates: before runs
// as an update begins, inside between its read and its write (with the
// record as the update leaves it). Either may be nil.
func SetUpdateHooks(m *Manager, before func(id string), inside func(id string, sb *Sandbox)) {
	m.testHookBeforeUpdate.Store(&before)
	if before == nil {
		m.testHookBeforeUpdate.Store(nil)
	}
	m.testHookUpdate.Store(&inside)
	if inside == nil {
		m.testHookUpdate.Store(nil)
	}
}

// ReportGuestViolation reports a violation of sandbox id's guest as its
// client would; it reports false if the sandbox has no live instance.
func ReportGuestViolation(m *Manager, id string, v guest.Violation) bool {
	m.mu.Lock()
	in := m.live[id]
	m.mu.Unlock()
	if in == nil {
		return false
	}
	m.guestViolation(in, v)
	return true
}

// MaxGuestViolations is the number of violations that stops a sandbox.
const MaxGuestViolations = maxViolations

// Hostname is hostname, for its tests.
func Hostname(sb *Sandbox) string { return hostname(sb) }

// TemplateReady reports whether the template of a shape is built.
func (m *Manager) TemplateReady(vcpu, memoryMiB, diskMiB int) bool {
	_, err := os.Stat(filepath.Join(m.templateDir(shape{vcpu, memoryMiB, diskMiB}), templateMarker))
	return err == nil
}
