// Package secrets keeps egress secrets: credentials a sandbox uses without
// ever seeing them. A sandbox in a secret's scope has the secret's
// environment variable set to a placeholder; the egress gate terminates
// TLS to the secret's hosts (internal/egress's interception) and, on a
// request the secret's rules allow, puts the value where the placeholder
// is in a credential header (or sets the secret's own header). Anywhere
// else the placeholder travels as it is, and is worth nothing.
//
// Values are sealed at rest (AES-256-GCM under a key kept beside the
// database, not in it: Sealer), unsealed only in this process's memory,
// and never returned, logged or written into an event: what leaves the
// package about a secret is its name, hosts, rules, scope and placeholder.
package secrets
