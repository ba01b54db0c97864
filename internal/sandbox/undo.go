package sandbox

// undo is the cleanup stack of one multi-step operation: each step that
// takes something adds the step that gives it back, and a failure runs
// them, last first. On success keep drops them, so the deferred run does
// nothing (gVisor's pkg/cleanup, containerd's defer-on-error):
//
//	var u undo
//	defer u.run()
//	... u.add(func() { release() }) ...
//	u.keep()
//	return result, nil
type undo []func()

// add pushes f, to run if the operation fails.
func (u *undo) add(f func()) { *u = append(*u, f) }

// run runs the steps added, last first, once.
func (u *undo) run() {
	for i := len(*u) - 1; i >= 0; i-- {
		(*u)[i]()
	}
	*u = nil
}

// keep drops the steps added: what they would give back is kept (or now
// owned by something else, which gives it back itself).
func (u *undo) keep() { *u = nil }
