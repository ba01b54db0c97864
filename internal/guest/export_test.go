package guest

// Budgets the tests check.
const (
	MaxHeldGuestStreams = maxHeldGuestStreams
	SessionCloseTimeout = sessionCloseTimeout
)
