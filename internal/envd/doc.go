// Package envd serves E2B's in-sandbox API ("envd") from the host: the
// process and filesystem services over Connect RPC, /health and /files.
// Nothing of it runs in the guest: every call is carried to the agent over
// the host↔guest stream through sandbox.Guest. A request reaches it already
// routed and authenticated (sandbox.RoutedFrom).
package envd

// Version is the envd version reported to E2B's SDKs (envdVersion): they
// switch features on by it, so it names only what this package serves.
const Version = "0.5.7"
