// Package vmm is the boundary between the sandbox manager and the virtual
// machine monitors that run sandboxes. A Driver boots and reattaches Machines;
// a Machine is one running VM with a byte stream to its guest agent. Nothing
// here knows HTTP or the store, and nothing above knows which VMM runs a
// sandbox.
//
// `Driver` boots (`Start`; `Spec.KeepDisk` boots the disk already there),
// reattaches (`Attach`, or `ErrGone`), resumes saved VMs (`Resume`, `Saved`)
// and copies snapshots (`Clone`); `Machine` is one running VM: its record,
// accel and pid, the dial to its guest, stop and done. What only some drivers
// can do (pause, snapshot and continue a VM, moves (`Mover`), disk export
// (`DiskExporter`), killing strays (`StrayKiller`)) is an optional interface
// the caller checks for. Firecracker is planned.
//
// vmm/vmmtest (imported by tests only) is an in-process fake `Driver` whose
// guest is a real agent over a socketpair (its pause keeps the agent's
// processes and files and leaves a marker in `Dir`, so `Saved` holds across
// managers; `FailPauses`, `FailResumes`, `SaveState` for failure and crash
// tests), and `TestDriver`, the contract suite every driver's tests run.
//
// # Moving saved VMs
//
// A paused sandbox is files alone (its saved VM in `sandboxes/<id>/`), so a
// drain moves it as files. `vmm.Mover` is what a driver offers for it:
// `MoveFiles` names the files of the saved VM, each by the name it takes in the
// new directory, and `Moved` makes them resumable in their new place. QEMU's
// are `mem`, `state` and `disk.qcow2`, and for a copy of a snapshot or template
// the snapshot's flattened disk too, as `backing.qcow2`, so the moved sandbox
// needs none of the old node's snapshots or templates; the base image does not
// move (every node has it at the same path). `Moved` rebuilds the disk chain
// from what arrived, never from what the files say: it checks the qcow2 images
// keep their data in themselves (no external data file; the same Go header
// parser, so no root tool opens them first), rewrites their headers (`qemu-img
// rebase -u`, header only) to `backing.qcow2` and the base image, writes the
// `backing` chain file afresh, and refuses links and a RAM file of the wrong
// size.
package vmm
