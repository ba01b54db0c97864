package agentproto

import "time"

// Version is the protocol version the agent reports in its Ready line.
const Version = 1

// PortName is the name of the virtio-serial port the agent listens on.
const PortName = "org.emberbox.agent.0"

// Handshake lines. The host writes HelloPrefix+nonce+"\n"; the agent, having
// skipped everything before it, answers ReadyPrefix+nonce+" "+version+"\n".
const (
	HelloPrefix = "EMBERBOX-HELLO "
	ReadyPrefix = "EMBERBOX-READY "
)

// Method names, one per call the host can make.
const (
	MethodInfo      = "info"
	MethodConfigure = "configure"
	MethodRenew     = "renew"
	// MethodSecretEnv sets the placeholders of the sandbox's egress
	// secrets in every command's environment (agents before it answer
	// unknown_method).
	MethodSecretEnv = "secrets.env"
	// MethodTrust replaces the extra CAs the guest trusts (a rotated
	// egress CA; agents before it answer unknown_method).
	MethodTrust = "trust.set"
	// MethodDetach ends the session from the guest's side once answered,
	// so that the agent waits for a new Hello: the host detaches before a
	// pause or snapshot, and a restored guest then answers the first Hello
	// of a new connection at once instead of reading it as traffic of the
	// session it had when it was saved.
	MethodDetach        = "detach"
	MethodExec          = "exec"
	MethodSpawn         = "spawn"
	MethodProcessList   = "process.list"
	MethodProcessGet    = "process.get"
	MethodProcessOutput = "process.output"
	MethodProcessSignal = "process.signal"
	// MethodProcessWrite queues input for a process started with StdinPipe
	// or Pty; MethodProcessResize sets a Pty process's window size. Both
	// answer Reply{Process}. An agent that predates them answers
	// CodeUnknownMethod.
	MethodProcessWrite  = "process.write"
	MethodProcessResize = "process.resize"
	MethodFileRead      = "file.read"
	MethodFileWrite     = "file.write"
	MethodFileList      = "file.list"
	MethodFileStat      = "file.stat"
	MethodFileMkdir     = "file.mkdir"
	MethodFileRemove    = "file.remove"
	MethodFileChmod     = "file.chmod"
	// file.glob: Reply{entries} of what under Path matches Glob.
	MethodFileGlob = "file.glob"
	// file.rename: Path to Target, refusing to replace unless Overwrite.
	MethodFileRename = "file.rename"
	// file.archive: Reply{ok} (or an error), the tar (gzipped with Gzip)
	// of the directory Path in D frames, then Reply{ok} or an error.
	MethodFileArchive = "file.archive"
	// file.unarchive: exactly Size bytes of a tar or tar.gz in D frames,
	// unpacked into the directory Path, then Reply{unpacked}.
	MethodFileUnarchive = "file.unarchive"
	// MethodPortConnect connects to a TCP port on the guest's loopback:
	// the Request carries Port, the agent answers one Reply (OK, or Error
	// with CodePortRefused), then the stream carries the connection's raw
	// bytes both ways. Closing one side of the stream half-closes the
	// connection. An older agent answers CodeUnknownMethod.
	MethodPortConnect = "port.connect"
	// File watches (inotify): start, list, read events from a cursor
	// (waiting up to WaitMs), stop. An older agent answers unknown_method.
	MethodFileWatchStart  = "file.watch.start"
	MethodFileWatchList   = "file.watch.list"
	MethodFileWatchEvents = "file.watch.events"
	MethodFileWatchStop   = "file.watch.stop"
)

// PortRequest names a TCP port on the guest's loopback.
type PortRequest struct {
	Port int `json:"port"`
}

// CodePortRefused is the error code of a port.connect nothing listens on
// (or that the agent refuses: too many connections at once).
const CodePortRefused = "port_refused"

// Methods of streams the guest opens to the host (egress; see
// internal/egress). egress.proxy: after the Request frame the stream carries
// the raw bytes of one TCP connection to the guest's HTTP proxy port, both
// ways. egress.dns: one data frame with a DNS query, answered by one data
// frame (empty: no answer).
const (
	MethodEgressProxy = "egress.proxy"
	MethodEgressDNS   = "egress.dns"
	// egress.tcp: a captured TCP connection of a program that ignores the
	// proxy variables. The Request carries Egress (where it was going);
	// the host answers one Reply (OK, or Error with code CodeEgressRefused
	// and the reason as message), then the stream carries raw bytes.
	MethodEgressTCP = "egress.tcp"
)

// CodeEgressRefused is the error code of a captured connection the host's
// policy refuses; the message is the reason (e.g. "rule-not-allowed").
const CodeEgressRefused = "egress_refused"

// CodeEgressFailed is the error code of a captured connection the host
// could not make (the destination did not answer, say).
const CodeEgressFailed = "egress_failed"

// EgressRequest is where a captured connection was going.
type EgressRequest struct {
	Addr string `json:"addr"` // ip:port, as the program asked
}

// Guest addresses of the egress relay.
const (
	EgressProxyAddr = "127.0.0.1:10800"
	EgressDNSAddr   = "127.0.0.1:53"
	EgressTCPAddr   = "127.0.0.1:10801" // captured TCP is redirected here
)

// Request is the first frame of every call. Exactly one of the pointer fields
// matching Method is set.
type Request struct {
	Method    string            `json:"method"`
	Configure *ConfigureRequest `json:"configure,omitempty"`
	Renew     *RenewRequest     `json:"renew,omitempty"`
	SecretEnv *SecretEnvRequest `json:"secretEnv,omitempty"`
	Trust     *TrustRequest     `json:"trust,omitempty"`
	Exec      *ExecRequest      `json:"exec,omitempty"`
	Process   *ProcessRequest   `json:"process,omitempty"`
	File      *FileRequest      `json:"file,omitempty"`
	Watch     *WatchRequest     `json:"watch,omitempty"`
	Egress    *EgressRequest    `json:"egress,omitempty"`
	Port      *PortRequest      `json:"port,omitempty"`
	Volume    *VolumeRequest    `json:"volume,omitempty"`
}

// Error codes carried on the wire. The host maps them to errdefs classes.
const (
	CodeInvalid          = "invalid_request"
	CodeFileNotFound     = "file_not_found"
	CodeIsADirectory     = "is_a_directory"
	CodeNotADirectory    = "not_a_directory"
	CodePermission       = "permission_denied"
	CodeExists           = "file_exists"
	CodeNotEmpty         = "directory_not_empty"
	CodeNoSpace          = "no_space"
	CodeProcessNotFound  = "process_not_found"
	CodeTooLarge         = "too_large"
	CodeInternal         = "internal"
	CodeUnknownMethod    = "unknown_method"
	CodeCommandNotFound  = "command_not_found"
	CodeProcessNotExited = "process_running"
	CodeCrossDevice      = "cross_device"
	CodeUnsafeArchive    = "unsafe_archive"
	// CodeStdinClosed: the process takes no (more) input: it was started
	// without StdinPipe or Pty, input was ended with EOF, or it has ended.
	CodeStdinClosed = "stdin_closed"
	// CodeStdinGap: a write's offset is past the bytes accepted so far.
	CodeStdinGap = "stdin_offset_gap"
	// CodeStdinFull: an append (no InputOffset) did not fit in the
	// process's input buffer, and nothing of it was taken.
	CodeStdinFull = "stdin_full"
	// CodeNotATerminal: resize of a process that has no Pty.
	CodeNotATerminal  = "not_a_terminal"
	CodeWatchNotFound = "watch_not_found"
)

// Error is a failure reported by the agent.
type Error struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

func (e *Error) Error() string { return e.Message }

// Reply is the JSON frame that answers a call (for streaming calls, the frame
// that ends it). Exactly one field is set.
type Reply struct {
	Error     *Error        `json:"error,omitempty"`
	Info      *Info         `json:"info,omitempty"`
	Exit      *ExecResult   `json:"exit,omitempty"`
	Process   *ProcessInfo  `json:"process,omitempty"`
	Processes []ProcessInfo `json:"processes,omitempty"`
	Entry     *FileEntry    `json:"entry,omitempty"`
	Entries   []FileEntry   `json:"entries,omitempty"`
	Removed   *bool         `json:"removed,omitempty"`
	Unpacked  *Unpacked     `json:"unpacked,omitempty"`
	Watch     *WatchInfo    `json:"watch,omitempty"`
	Watches   []WatchInfo   `json:"watches,omitempty"`
	Batch     *WatchBatch   `json:"batch,omitempty"`
	Stopped   *bool         `json:"stopped,omitempty"`
	OK        bool          `json:"ok,omitempty"`
}

// Info describes the guest.
type Info struct {
	Version       int       `json:"version"`
	KernelRelease string    `json:"kernelRelease"`
	BootedAt      time.Time `json:"bootedAt"`
	UptimeMs      int64     `json:"uptimeMs"`
	CPUs          int       `json:"cpus"`
	MemTotalKiB   int64     `json:"memTotalKiB"`
	// CPUBusyMs is the CPU time the guest kernel has counted as busy
	// since it booted, every CPU together: all but idle and iowait.
	// The host shows it beside its own meter and never bills it.
	CPUBusyMs int64 `json:"cpuBusyMs,omitempty"`
	// OOMKills counts the processes the guest kernel's OOM killer has
	// ended since the guest booted (/proc/vmstat oom_kill). The host turns
	// a rise into an out_of_memory event.
	OOMKills int64 `json:"oomKills,omitempty"`
}

// ConfigureRequest sets sandbox-wide settings. The env is kept only in the
// guest's memory, so the host never has to store its values.
type ConfigureRequest struct {
	Env      map[string]string `json:"env,omitempty"`
	Hostname string            `json:"hostname,omitempty"`
	// CACerts is a PEM bundle the guest must trust besides its own (the
	// host's TLS-inspecting proxy's CA, say).
	CACerts string `json:"caCerts,omitempty"`
}

// SecretEnvRequest replaces the variables the sandbox's egress secrets
// put in every command's environment: name to placeholder. A variable the
// sandbox's own environment sets too keeps the sandbox's value.
type SecretEnvRequest struct {
	Env map[string]string `json:"env"`
}

// Bounds of a SecretEnvRequest, which the agent refuses past.
const (
	MaxSecretEnv      = 256
	MaxSecretEnvBytes = 256 // of a name or a placeholder
)

// TrustRequest replaces the extra CAs the guest trusts besides its own
// roots (ConfigureRequest.CACerts): a PEM bundle of certificates only,
// at most MaxTrustBytes; empty trusts none.
type TrustRequest struct {
	CACerts string `json:"caCerts"`
}

// MaxTrustBytes bounds a TrustRequest's bundle.
const MaxTrustBytes = 256 << 10

// RenewRequest renews what a guest restored from saved memory shares with
// its past or with other copies of one snapshot: the kernel's randomness,
// the wall clock and, for a copy, its identity. Empty fields are left alone.
type RenewRequest struct {
	// Seed is host randomness mixed into the guest kernel's pool, which
	// is then reseeded before anything else draws from it.
	Seed []byte `json:"seed,omitempty"`
	// UnixNano is the host's wall clock when the request was made.
	UnixNano int64 `json:"unixNano,omitempty"`
	// Hostname, MachineID (32 hex digits) and BootID (a UUID) are a
	// copy's own.
	Hostname  string `json:"hostname,omitempty"`
	MachineID string `json:"machineId,omitempty"`
	BootID    string `json:"bootId,omitempty"`
}

// ExecRequest starts a command. Command runs under bash -c; Argv runs as is.
type ExecRequest struct {
	Command   string            `json:"command,omitempty"`
	Argv      []string          `json:"argv,omitempty"`
	Cwd       string            `json:"cwd,omitempty"`
	Env       map[string]string `json:"env,omitempty"`
	Stdin     []byte            `json:"stdin,omitempty"`
	TimeoutMs int64             `json:"timeoutMs,omitempty"` // 0: no timeout
	User      string            `json:"user,omitempty"`      // "" or "user", or "root"
	// Stream asks for Output events as output arrives; otherwise output is
	// captured up to MaxOutput bytes per stream and returned in the result.
	Stream    bool  `json:"stream,omitempty"`
	MaxOutput int64 `json:"maxOutput,omitempty"`
	// Detach (spawn) makes the process outlive the call; its output is kept
	// in a ring and read with process.output.
	Detach bool `json:"detach,omitempty"`
	// StdinPipe (spawn) keeps the process's stdin open for process.write
	// instead of giving it Stdin and then end of file.
	StdinPipe bool `json:"stdinPipe,omitempty"`
	// Pty (spawn) starts the process on a new terminal of that size, as
	// its session leader; the terminal's output is the process's stdout
	// and its input is written with process.write.
	Pty *PtySize `json:"pty,omitempty"`
	// OutputEncoding is recorded for the host ("utf8" or "base64"); the
	// agent keeps bytes either way.
	OutputEncoding string `json:"outputEncoding,omitempty"`
}

// PtySize is a terminal's window size in characters.
type PtySize struct {
	Cols int `json:"cols"`
	Rows int `json:"rows"`
}

// MaxPtySide bounds each side of a terminal window.
const MaxPtySide = 1000

// MaxStdinBuffer bounds the input a process has been sent and not yet
// read: a write beyond it is accepted in part, or not at all.
const MaxStdinBuffer = 1 << 20

// Stream names for output events.
const (
	Stdout = "stdout"
	Stderr = "stderr"
)

// Event is one JSON frame of a streamed exec or of process output. Type is
// "start", "stdout", "stderr", "truncated", "exit" or "error". Every frame of
// a streaming call is an Event; "exit" or "error" ends the call.
type Event struct {
	Type      string      `json:"type"`
	ProcessID string      `json:"processId,omitempty"`
	Data      []byte      `json:"data,omitempty"`
	Offset    int64       `json:"offset"`
	Dropped   int64       `json:"droppedBytes,omitempty"` // truncated: bytes lost
	Exit      *ExecResult `json:"exit,omitempty"`
	Error     *Error      `json:"error,omitempty"` // type "error": the call failed
}

// ExecResult is how a command ended. ExitCode is nil when the process did not
// exit by itself (timed out or killed by the agent); a death by signal is the
// negative signal number.
type ExecResult struct {
	ProcessID       string `json:"processId"`
	ExitCode        *int   `json:"exitCode"`
	Stdout          []byte `json:"stdout,omitempty"`
	Stderr          []byte `json:"stderr,omitempty"`
	StdoutTruncated bool   `json:"stdoutTruncated"`
	StderrTruncated bool   `json:"stderrTruncated"`
	TimedOut        bool   `json:"timedOut"`
	DurationMs      int64  `json:"durationMs"`
	State           string `json:"state"`
}

// Process states.
const (
	StateRunning  = "running"
	StateExited   = "exited"
	StateKilled   = "killed"
	StateTimedOut = "timed_out"
)

// ProcessInfo describes a process started by exec or spawn.
type ProcessInfo struct {
	ID          string     `json:"id"`
	State       string     `json:"state"`
	ExitCode    *int       `json:"exitCode"`
	Command     string     `json:"command"`
	Argv        []string   `json:"argv,omitempty"`
	Cwd         string     `json:"cwd"`
	PID         int        `json:"pid"`
	StartedAt   time.Time  `json:"startedAt"`
	EndedAt     *time.Time `json:"endedAt,omitempty"`
	TimeoutMs   int64      `json:"timeoutMs,omitempty"`
	OutputBytes int64      `json:"outputBytes"`
	FirstOffset int64      `json:"firstOffset"`
	// User is the account it runs as ("user" or "root").
	User string `json:"user,omitempty"`
	// Pty is its terminal's current size, if it runs on one.
	Pty *PtySize `json:"pty,omitempty"`
	// StdinOpen: process.write accepts input. StdinOffset is the number
	// of input bytes accepted so far.
	StdinOpen      bool   `json:"stdinOpen,omitempty"`
	StdinOffset    int64  `json:"stdinOffset,omitempty"`
	OutputEncoding string `json:"outputEncoding,omitempty"`
}

// ProcessRequest addresses one process.
type ProcessRequest struct {
	ID     string `json:"id,omitempty"`
	Signal string `json:"signal,omitempty"` // e.g. "SIGTERM", "TERM", "9"
	Cursor int64  `json:"cursor,omitempty"`
	// Follow streams output until the process ends; otherwise output already
	// kept from Cursor is sent, waiting up to WaitMs for some if there is none.
	Follow bool  `json:"follow,omitempty"`
	WaitMs int64 `json:"waitMs,omitempty"`
	// process.write: Input goes at InputOffset, the number of bytes the
	// writer believes were accepted before it (nil: after whatever was,
	// all or nothing).
	// Bytes below the accepted offset are skipped, so a retry is never
	// typed twice; an offset past it is refused with CodeStdinGap. EOF
	// ends the input once all of Input is accepted.
	Input       []byte `json:"input,omitempty"`
	InputOffset *int64 `json:"inputOffset,omitempty"`
	EOF         bool   `json:"eof,omitempty"`
	// process.resize: the new window size.
	Size *PtySize `json:"size,omitempty"`
}

// Sizes of lists the agent answers with. The host refuses longer lists
// (internal/guest), so the agent never sends more.
const (
	// MaxProcessList bounds process.list: the newest processes are listed.
	MaxProcessList = 1024
	// DefaultListLimit is file.list's limit when the request gives none;
	// MaxListLimit bounds any limit it gives.
	DefaultListLimit = 1000
	MaxListLimit     = 10000
)

// ListLimit is the number of entries file.list answers at most for a
// request's limit.
func ListLimit(limit int) int {
	if limit <= 0 {
		return DefaultListLimit
	}
	return min(limit, MaxListLimit)
}

// FileRequest addresses a path in the guest. Relative paths resolve against
// the user's home (/workspace).
type FileRequest struct {
	Path      string `json:"path"`
	Mode      uint32 `json:"mode,omitempty"` // permission bits; write/mkdir: 0 means default, chmod: 0 is 000
	Size      int64  `json:"size,omitempty"` // write: exact number of bytes that follow
	Depth     int    `json:"depth,omitempty"`
	Hidden    bool   `json:"hidden,omitempty"`
	Limit     int    `json:"limit,omitempty"`
	Parents   bool   `json:"parents,omitempty"`
	Recursive bool   `json:"recursive,omitempty"`
	User      string `json:"user,omitempty"` // "" or "user", or "root"
	// Glob (file.glob) is a pattern relative to Path: '/'-separated
	// segments as path.Match takes them, "**" matching any number of
	// directories. Hidden and Limit apply as in file.list.
	Glob string `json:"glob,omitempty"`
	// Target and Overwrite: file.rename.
	Target    string `json:"target,omitempty"`
	Overwrite bool   `json:"overwrite,omitempty"`
	// Gzip and Exclude (paths relative to Path): file.archive.
	Gzip    bool     `json:"gzip,omitempty"`
	Exclude []string `json:"exclude,omitempty"`
}

// Bounds of archive and glob requests.
const (
	MaxExcludes  = 256
	MaxGlobLen   = 1024
	MaxUnarchive = 4 << 30 // bytes of one archive sent to file.unarchive
)

// Unpacked is what a file.unarchive put in place.
type Unpacked struct {
	Entries int   `json:"entries"`
	Bytes   int64 `json:"bytes"`
}

// File entry types.
const (
	TypeFile      = "file"
	TypeDirectory = "directory"
	TypeSymlink   = "symlink"
	TypeOther     = "other"
)

// FileEntry describes one file.
type FileEntry struct {
	Name          string    `json:"name"`
	Path          string    `json:"path"`
	Type          string    `json:"type"`
	Size          int64     `json:"size"`
	Mode          string    `json:"mode"` // octal permission bits, e.g. "644"
	ModifiedAt    time.Time `json:"modifiedAt"`
	UID           int       `json:"uid"`
	GID           int       `json:"gid"`
	Owner         string    `json:"owner,omitempty"`
	Group         string    `json:"group,omitempty"`
	SymlinkTarget string    `json:"symlinkTarget,omitempty"`
}
