package sandbox

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
