package sandbox

import (
	"fmt"
	"strings"

	"github.com/emberbox/emberbox/internal/errdefs"
)

// State is where a sandbox is in its life (the API's "state" field).
type State string

// States.
const (
	StateStarting State = "starting"
	StateRunning  State = "running"
	// StatePausing is recorded before a pause touches the VM, StatePaused
	// once its state is saved and the VMM has ended, and StateResuming
	// before a wake starts it again: a crash at any step is finished or
	// undone by the next start (Recover).
	StatePausing  State = "pausing"
	StatePaused   State = "paused"
	StateResuming State = "resuming"
	StateStopping State = "stopping"
	StateStopped  State = "stopped"
	// StateDeleting is recorded before a delete removes anything, so that a
	// crash part-way is finished on restart. The API shows it as stopping.
	StateDeleting State = "deleting"
	StateDeleted  State = "deleted"
)

// CodeSandboxPaused refuses a guest call to a paused sandbox whose
// autoWake is off.
const CodeSandboxPaused = "sandbox_paused"

// Paused reports whether s is one of the states of a pause: pausing,
// paused or resuming. A guest call in them waits for a wake (autoWake).
func (s State) Paused() bool {
	return s == StatePausing || s == StatePaused || s == StateResuming
}

// StateInfo is one row of the state table: what a state means to callers.
type StateInfo struct {
	State State
	// Wire is the state the API reports (internal states map onto the
	// Runtime API's list).
	Wire State
	// Status is the coarse status the API reports beside the state.
	Status string
	// Terminal: no transition can follow but deletion.
	Terminal bool
	// Refusal is what a call into the guest gets in this state; nil for
	// the one state that has a guest to call.
	Refusal *RefusalInfo
	// Wakes: a guest call in this state to a sandbox with autoWake waits
	// for it to be woken and is then served; Refusal is for the others.
	Wakes bool
}

// RefusalInfo is the coded answer to a guest call in the wrong state.
type RefusalInfo struct {
	Class error  // errdefs class, which decides the HTTP status
	Code  string // the wire code
	Hint  string
}

// stateTable lists every state once. The API's refusals, the tests over all
// guest routes and the table in docs/ARCHITECTURE.md are read from it.
var stateTable = []StateInfo{
	{State: StateStarting, Wire: StateStarting, Status: "pending",
		Refusal: &RefusalInfo{errdefs.ErrConflict, "sandbox_not_ready", "wait for it with GET /v1/sandboxes/{id}?waitFor=running"}},
	{State: StateRunning, Wire: StateRunning, Status: "active"},
	{State: StatePausing, Wire: StatePausing, Wakes: true, Status: "paused",
		Refusal: &RefusalInfo{errdefs.ErrConflict, CodeSandboxPaused, "it is pausing and autoWake is off: wake it with POST /v1/sandboxes/{id}:wake"}},
	{State: StatePaused, Wire: StatePaused, Wakes: true, Status: "paused",
		Refusal: &RefusalInfo{errdefs.ErrConflict, CodeSandboxPaused, "autoWake is off: wake it with POST /v1/sandboxes/{id}:wake"}},
	{State: StateResuming, Wire: StateResuming, Wakes: true, Status: "pending",
		Refusal: &RefusalInfo{errdefs.ErrConflict, "sandbox_not_ready", "wait for it with GET /v1/sandboxes/{id}?waitFor=running"}},
	{State: StateStopping, Wire: StateStopping, Status: "stopping",
		Refusal: &RefusalInfo{errdefs.ErrConflict, "not_running", "the sandbox is stopping; create a new one"}},
	{State: StateStopped, Wire: StateStopped, Status: "stopped", Terminal: true,
		Refusal: &RefusalInfo{errdefs.ErrConflict, "not_running", "create a new sandbox; a stopped one cannot run commands"}},
	{State: StateDeleting, Wire: StateStopping, Status: "stopping",
		Refusal: &RefusalInfo{errdefs.ErrConflict, "not_running", "the sandbox is being deleted"}},
	{State: StateDeleted, Wire: StateDeleted, Status: "stopped", Terminal: true,
		Refusal: &RefusalInfo{errdefs.ErrNotFound, "not_found", ""}},
}

// States returns the state table, in lifecycle order.
func States() []StateInfo { return append([]StateInfo(nil), stateTable...) }

func (s State) info() StateInfo {
	for _, i := range stateTable {
		if i.State == s {
			return i
		}
	}
	// An unknown state (a newer server's record) has no guest to call.
	return StateInfo{State: s, Wire: s, Status: "unknown",
		Refusal: &RefusalInfo{errdefs.ErrConflict, "not_running", ""}}
}

// Status is the coarse status the API reports beside the state.
func (s State) Status() string { return s.info().Status }

// Wire is the state the API reports.
func (s State) Wire() State { return s.info().Wire }

// Terminal reports whether no further transition can happen but deletion.
func (s State) Terminal() bool { return s.info().Terminal }

// Refusal returns the coded error a call into sb's guest gets in sb's
// state, or nil if sb is running.
func Refusal(sb *Sandbox) error {
	if sb.State.info().Refusal == nil {
		return nil
	}
	return refuse(sb, sb.State)
}

// refuse builds the refusal of state for sb.
func refuse(sb *Sandbox, state State) error {
	r := state.info().Refusal
	if r == nil {
		r = StateStopping.info().Refusal
	}
	if r.Class == errdefs.ErrNotFound {
		return notFound(sb.ID)
	}
	e := errdefs.New(r.Class, r.Code, "sandbox %s is %s", sb.ID, state.Wire())
	e.Hint = r.Hint
	e.Details = map[string]any{"state": string(state.Wire())}
	return e
}

// StateTableMarkdown renders the state table as the Markdown table that
// docs/ARCHITECTURE.md carries (a test keeps the two equal).
func StateTableMarkdown() string {
	var b strings.Builder
	b.WriteString("| state | API shows | status | guest calls answer |\n|---|---|---|---|\n")
	for _, i := range stateTable {
		ans := "served"
		if r := i.Refusal; r != nil {
			ans = fmt.Sprintf("%s: `%s`", r.Class, r.Code)
		}
		if i.Wakes {
			ans = "autoWake: woken, then served; else " + ans
		}
		fmt.Fprintf(&b, "| `%s` | `%s` | `%s` | %s |\n", i.State, i.Wire, i.Status, ans)
	}
	return b.String()
}
