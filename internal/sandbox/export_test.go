package sandbox

import (
	"os"
	"path/filepath"
	"time"

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
	m.conduct.violation(in, v)
	return true
}

// ReportGuestOOMKills has the meter read total as sandbox id's count of
// OOM kills, as the guest's info would report it; false if the sandbox
// has no live instance.
func ReportGuestOOMKills(m *Manager, id string, total int64) bool {
	m.mu.Lock()
	in := m.live[id]
	m.mu.Unlock()
	if in == nil {
		return false
	}
	m.Meter.oomKills(in, total)
	return true
}

// MaxGuestViolations is the number of violations that stops a sandbox.
const MaxGuestViolations = maxViolations

// Hostname is hostname, for its tests.
func Hostname(sb *Sandbox) string { return hostname(sb) }

// TemplateReady reports whether the default image's template of a shape
// is built.
func (m *Manager) TemplateReady(vcpu, memoryMiB, diskMiB int) bool {
	return m.ImageTemplateReady("", vcpu, memoryMiB, diskMiB)
}

// ImageTemplateReady reports whether the template of root disk rootfs
// ("": the default image's) and a shape is built.
func (m *Manager) ImageTemplateReady(rootfs string, vcpu, memoryMiB, diskMiB int) bool {
	_, err := os.Stat(filepath.Join(m.TemplateDir(rootfs, vcpu, memoryMiB, diskMiB), templateMarker))
	return err == nil
}

// TemplateDir is the directory of the template of rootfs and a shape.
func (m *Manager) TemplateDir(rootfs string, vcpu, memoryMiB, diskMiB int) string {
	return m.Templates.dir(rootfs, shape{vcpu, memoryMiB, diskMiB})
}

// ImageTemplatesDir is the directory of every template of rootfs.
func (m *Manager) ImageTemplatesDir(rootfs string) string { return m.Templates.imageDir(rootfs) }

// RetryFullTemplates lets the next create look again for room under the
// cap of image templates at once.
func (m *Manager) RetryFullTemplates() {
	m.Templates.mu.Lock()
	m.Templates.fullAt = time.Time{}
	m.Templates.mu.Unlock()
}

// TemplatesFull reports whether the cap of image templates last stopped a
// build (every template kept in use).
func (m *Manager) TemplatesFull() bool {
	m.Templates.mu.Lock()
	defer m.Templates.mu.Unlock()
	return !m.Templates.fullAt.IsZero()
}

// TemplatesInUse is the set of template directories a create is copying
// or a sandbox's files name.
func (m *Manager) TemplatesInUse() map[string]bool {
	m.Templates.mu.Lock()
	defer m.Templates.mu.Unlock()
	return m.Templates.inUseLocked()
}

// CallsInFlight is the number of calls into sandbox id's guest that hold
// it busy (0 for one without a live instance).
func (m *Manager) CallsInFlight(id string) int64 {
	m.mu.Lock()
	in := m.live[id]
	m.mu.Unlock()
	if in == nil {
		return 0
	}
	return in.busy.Load()
}
