#!/bin/sh
# Regenerates the Go code of E2B's envd services (internal/envd/proto) from
# their .proto files. The generated code is committed: building needs no
# protoc. Needs protoc (with its well-known types), and puts the two
# generators, at the versions go.mod pins, in GOBIN.
set -eu
cd "$(dirname "$0")/../internal/envd/proto"
go install google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.12
go install connectrpc.com/connect/cmd/protoc-gen-connect-go@v1.19.1
PATH="$(go env GOPATH)/bin:$PATH"
mod=github.com/emberbox/emberbox/internal/envd/proto
# The .proto files carry no go_package (E2B's descriptors have none); the
# import paths are given here instead.
m="Mprocess/process.proto=$mod/process,Mfilesystem/filesystem.proto=$mod/filesystem"
protoc -I . \
	--go_out=. --go_opt=paths=source_relative,"$m" \
	--connect-go_out=. --connect-go_opt=paths=source_relative,"$m" \
	process/process.proto filesystem/filesystem.proto
