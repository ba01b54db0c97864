module github.com/emberbox/emberbox/sdk/go

go 1.26.8

require github.com/coder/websocket v1.8.15
