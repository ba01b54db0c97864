// Package envd serves E2B's in-sandbox API ("envd") from the host: the
// process and filesystem services over Connect RPC, /health and /files.
// Nothing of it runs in the guest: every call is carried to the agent over
// the host↔guest stream through guest.Handle. A request reaches it already
// routed and authenticated (sandbox.RoutedFrom).
//
// The .proto files under proto/ match the wire of E2B's own (their
// descriptors are those of the e2b SDK); the Go code generated from them is
// committed, and regenerated with scripts/protoc.sh.
package envd

//go:generate ../../scripts/protoc.sh

// Version is the envd version reported to E2B's SDKs (envdVersion): they
// switch features on by it, so it names only what this package serves.
// 0.5.7 is octet-stream (and gzip) uploads; 0.6.2 would promise file
// metadata (extended attributes), which the guest does not keep.
const Version = "0.5.7"
