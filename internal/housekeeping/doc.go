// Package housekeeping holds no code, only tests that make the module's
// house rules executable: every package has one doc comment; the guest
// agent, the HTTP API and the test helpers stay behind their dependency
// fences; the packages that are not Linux-only vet cleanly for darwin, so
// clients and developers' laptops can build them; the Go SDK, a module of
// its own in sdk/go, requires nothing of the server's; and no type, seam,
// file or function grows past the limits of the house (house_test.go:
// methods per type, interface width, file and function size), today's
// offenders and the tables being allowed in house_allow_test.go.
//
// The tests read every Go file of the module and run the go command from
// the module root, so `go test` reruns them whenever a Go file changes.
// TestHouseMeasures logs the measures of the house, for a before and after:
//
//	go test -run TestHouseMeasures -v ./internal/housekeeping/
package housekeeping
