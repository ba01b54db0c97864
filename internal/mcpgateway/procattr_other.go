//go:build !linux

package mcpgateway

import "syscall"

// childAttr: the gateway runs in Linux guests; elsewhere it builds for
// its types, and its children get no parent-death signal.
func childAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{} }
