package api

// Manager is what the API needs from the sandbox manager, by area: each
// role is its own interface, narrow enough to read, and what a handler
// needs reads from the role it calls. Today one value, *sandbox.Manager,
// fills every role. Every method takes the
// caller's key id as owner: a sandbox of another owner is reported as
// errdefs.ErrNotFound. Errors carry errdefs classes (and often an
// *errdefs.CodedError with the wire code), which the API maps to statuses.
//
// The optional abilities PreviewManager and NetworkManager are found on
// the Sandboxes role by type assertion.
type Manager struct {
	Sandboxes
	Power
	Snapshots
	Usage
	Guests
}

// complete reports whether m fills every role.
func (m Manager) complete() bool {
	return m.Sandboxes != nil && m.Power != nil && m.Snapshots != nil && m.Usage != nil && m.Guests != nil
}
