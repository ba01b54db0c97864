package pgtest

import "syscall"

// dieWithParent has the kernel kill the process when its parent's thread
// that started it ends.
func dieWithParent(a *syscall.SysProcAttr) { a.Pdeathsig = syscall.SIGKILL }
