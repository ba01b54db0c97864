package webhook

// The event types of the feed. A webhook's Events name them, or a family
// as "sandbox.*".
const (
	SandboxCreated     = "sandbox.created"
	SandboxRunning     = "sandbox.running"
	SandboxPaused      = "sandbox.paused"
	SandboxWoken       = "sandbox.woken"
	SandboxRestored    = "sandbox.restored" // brought back to a checkpoint
	SandboxStopped     = "sandbox.stopped"  // data.reason says why
	SandboxDeleted     = "sandbox.deleted"
	SandboxLeaseEnding = "sandbox.lease_ending" // data.expiresAt, data.onLeaseEnd
	EgressRefused      = "egress.refused"       // of a sandbox: data.target, data.reason
	SnapshotReady      = "snapshot.ready"
	SnapshotFailed     = "snapshot.failed"
	SnapshotDeleted    = "snapshot.deleted"
	ImageReady         = "image.ready"  // a build or import ended well
	ImageFailed        = "image.failed" // data.error
	WebhookTest        = "webhook.test"
)

// Resource types of events.
const (
	ResourceSandbox  = "sandbox"
	ResourceSnapshot = "snapshot"
	ResourceImage    = "image"
	ResourceWebhook  = "webhook"
)

// Types are every event type, for validating a webhook's Events.
var Types = []string{SandboxCreated, SandboxRunning, SandboxPaused, SandboxWoken, SandboxRestored,
	SandboxStopped, SandboxDeleted, SandboxLeaseEnding, EgressRefused, SnapshotReady, SnapshotFailed,
	SnapshotDeleted, ImageReady, ImageFailed, WebhookTest}

// sandboxEvents maps the types of a sandbox's own trail (the store's
// sandbox_events, which the sandbox manager appends to) to the feed's: the
// store publishes an entry of the trail to the feed, in the same
// transaction, when its type is here.
var sandboxEvents = map[string]string{
	"created":        SandboxCreated,
	"ready":          SandboxRunning,
	"paused":         SandboxPaused,
	"woken":          SandboxWoken,
	"restored":       SandboxRestored,
	"stopped":        SandboxStopped,
	"deleted":        SandboxDeleted,
	"lease_ending":   SandboxLeaseEnding,
	"egress_refused": EgressRefused,
}

// FromSandboxTrail returns the feed type of an entry of a sandbox's trail
// of type typ, or "" when the feed does not carry it.
func FromSandboxTrail(typ string) string { return sandboxEvents[typ] }
