package api

// Manager is what the API needs from the sandbox manager, by area: each
// role is its own interface, narrow enough to read, and what a handler
// needs reads from the role it calls. Today one value, *sandbox.Manager,
// fills every role. Every method takes the
// caller's key id as owner: a sandbox of another owner is reported as
// errdefs.ErrNotFound. Errors carry errdefs classes (and often an
// *errdefs.CodedError with the wire code), which the API maps to statuses.
//
// Previews, Network and Checkpoints are optional: nil, they are looked for on the
// Sandboxes role by type assertion, and without them their routes answer
// 501.
type Manager struct {
	Sandboxes
	Power
	Switcher
	Snapshots
	Usage
	Guests
	Previews    PreviewManager
	Network     NetworkManager
	Checkpoints CheckpointManager
}

// complete reports whether m fills every role.
func (m Manager) complete() bool {
	return m.Sandboxes != nil && m.Power != nil && m.Switcher != nil && m.Snapshots != nil && m.Usage != nil && m.Guests != nil
}
