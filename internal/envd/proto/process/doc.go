// Package process is the Go code generated from process.proto, E2B's
// envd process service (see scripts/protoc.sh).
package process
