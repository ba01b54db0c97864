// Package faultpoint lets crash tests kill the server at named steps of its
// work. A step calls Hit with its name; the process dies with SIGKILL there if
// the environment variable EMBERBOX_FAULTPOINT names that step when the process
// starts. It is a kill -9 at an exact point, so that tests can show that every
// step leaves the store and the host in a state the next start can account for.
// Unset, Hit costs one string comparison.
//
// Steps: `idempotency.reserved`, `create.recorded`, `create.vm_started`,
// `create.vm_recorded`, `idempotency.answered`, `delete.recorded`,
// `delete.vm_ended`, `delete.files_removed`, `admin_key.written`,
// `pause.recorded`, `pause.saved`, `wake.recorded`, `wake.resumed`,
// `webhook.claimed`, `webhook.sent`.
package faultpoint

import (
	"os"
	"syscall"
)

// Env is the variable that arms a fault point.
const Env = "EMBERBOX_FAULTPOINT"

// armed is read once: the points are for tests that start a process with
// the variable set, never for changing a running server.
var armed = os.Getenv(Env)

// Hit kills the process with SIGKILL if name is the armed fault point.
func Hit(name string) {
	if armed == "" || armed != name {
		return
	}
	_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
	select {} // the signal is on its way; never run past the point
}
