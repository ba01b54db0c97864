// Package vmmtest helps test virtual machine monitor drivers and the code
// that uses them.
//
// Driver is a vmm.Driver whose machines are not VMs: each one's guest is a
// real agent (internal/agent) running in the test process, reached over a
// socketpair, so a caller's boot, call and recovery paths run without QEMU.
// Like the agent, it exists on Linux only.
// TestDriver checks the vmm.Driver and vmm.Machine contract; every driver's
// tests run it, and so does this package's, against Driver.
//
// Only tests may import this package (internal/housekeeping enforces it).
package vmmtest
