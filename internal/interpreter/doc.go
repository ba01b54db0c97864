// Package interpreter runs code in stateful IPython kernels inside a
// sandbox, one kernel per context, and speaks it as Runtime's interpreter
// routes (through the api package) and as E2B's code-interpreter API
// (E2BHandler).
//
// A context is a bridge process in the guest (bridge.py, embedded here and
// started with `python3 -u -c` through the guest's process API, as the
// sandbox user) that starts an ipykernel with jupyter_client and drives it
// for the host over a loopback TCP connection reached with
// Guest.DialPort: JSON lines of requests in, of events out. Everything the
// bridge sends is bounded here as a hostile guest's output. A context
// lives as long as its bridge process: a paused and woken sandbox keeps it
// (the host connects again), a stopped or restarted one does not, and the
// context is then forgotten.
package interpreter
