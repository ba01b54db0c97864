// Package processconnect is the connect-go code generated from
// process.proto (see scripts/protoc.sh).
package processconnect
