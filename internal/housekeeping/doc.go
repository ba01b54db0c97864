// Package housekeeping holds no code, only tests that make the module's house
// rules executable: every package has one doc comment; the guest agent, the
// HTTP API and the test helpers stay behind their dependency fences; and the
// packages that are not Linux-only vet cleanly for darwin, so clients and
// developers' laptops can build them.
//
// The tests read every Go file of the module and run the go command from the
// module root, so `go test` reruns them whenever a Go file changes.
package housekeeping
