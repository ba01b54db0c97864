package interpreter

import (
	"encoding/json"
	"time"
)

// Language is the one language contexts run.
const Language = "python"

// DefaultContext is the id of a sandbox's default context, started on
// first use: the language's own name, as Runtime names it.
const DefaultContext = Language

// Statuses of an execution.
const (
	StatusOK          = "ok"
	StatusError       = "error"       // the code raised
	StatusTimeout     = "timeout"     // interrupted at its timeout
	StatusInterrupted = "interrupted" // interrupted by a call or a gone client
	StatusLost        = "lost"        // the kernel died, or the context ended
)

// Kinds of Event.
const (
	KindStdout = "stdout"
	KindStderr = "stderr"
	KindResult = "result"
	KindError  = "error"
	KindCount  = "count" // the execution count, sent when the cell starts
)

// Event is one piece of an execution's output, as it happens.
type Event struct {
	Kind   string
	Text   string     // stdout, stderr
	Result *Result    // result
	Error  *ExecError // error
	Count  int        // count
}

// Result is one rich output: a MIME bundle. Main is the cell's value
// (execute_result); other results come from display calls (display_data),
// figures among them.
type Result struct {
	Main bool                       `json:"main"`
	Data map[string]json.RawMessage `json:"data"`
}

// ExecError is an exception the code raised.
type ExecError struct {
	Name      string `json:"name"`
	Value     string `json:"value"`
	Traceback string `json:"traceback"`
}

// RunRequest is one execution.
type RunRequest struct {
	Code     string
	Context  string            // "" is the default context
	Env      map[string]string // for this execution only
	Timeout  time.Duration     // 0: none
	Language string            // "" or "python"
	// KeepOnDisconnect lets the cell run on when ctx ends (the client
	// went away); otherwise it is interrupted.
	KeepOnDisconnect bool
}

// Execution is how an execution ended and all it produced (output past
// MaxOutput left out).
type Execution struct {
	Status         string
	Context        string
	Stdout, Stderr string
	Results        []Result
	Error          *ExecError
	ExecutionCount int
	Duration       time.Duration
	Truncated      bool
}

// ContextInfo describes a context.
type ContextInfo struct {
	ID       string
	Language string
	Cwd      string
	EnvNames []string
	Created  time.Time
	Running  bool // an execution is under way
}

// CreateRequest makes a context.
type CreateRequest struct {
	ID       string // "" picks one
	Language string // "" or "python"
	Cwd      string // "" is the sandbox user's home
	Env      map[string]string
}
