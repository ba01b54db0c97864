// Package filesystemconnect is the connect-go code generated from
// filesystem.proto (see scripts/protoc.sh).
package filesystemconnect
