package mcpgateway

import "syscall"

// childAttr is how the gateway's children start: killed with it, should
// it die without stopping them.
func childAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL} }
