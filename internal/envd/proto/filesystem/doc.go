// Package filesystem is the Go code generated from filesystem.proto, E2B's
// envd filesystem service (see scripts/protoc.sh).
package filesystem
