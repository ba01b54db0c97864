//go:build !linux

package pgtest

import "syscall"

// dieWithParent does nothing here: only Linux has a parent-death signal.
func dieWithParent(*syscall.SysProcAttr) {}
