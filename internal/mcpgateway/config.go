// Package mcpgateway is the MCP gateway that runs inside a sandbox, as
// `emberbox-agent mcp-gateway`. It installs the MCP servers it is given,
// runs each as a child that speaks MCP over stdio, and serves them all
// over MCP's streamable HTTP on one port of 127.0.0.1, at /mcp/<id>. The
// host reaches that port through its preview proxy, which authenticates
// (internal/mcp); the gateway adds a key of its own for a public one.
//
// The gateway keeps no sessions: it initializes each server once, answers
// every client's initialize with that server's answer, and renumbers the
// requests of all clients onto the one stdio stream. A client therefore
// survives a restart of the gateway between two calls.
package mcpgateway

import (
	"fmt"
	"regexp"
	"time"
)

// Where the gateway keeps what the host reads, in the guest.
const (
	// StatusPath is the gateway's state, rewritten on every change
	// (root-only: it holds the key of a public gateway).
	StatusPath = "/run/emberbox/mcp/status.json"
	// LogDir holds each server's install and stderr log, <id>.log.
	LogDir = "/tmp/emberbox-mcp"
	// KeyHeader carries the key of a gateway that has one.
	KeyHeader = "X-Mcp-Gateway-Key"
)

// Bounds of what the gateway takes and keeps.
const (
	MaxServers  = 8
	maxConfig   = 1 << 20
	maxRequest  = 4 << 20  // a client's POST body
	maxMessage  = 16 << 20 // a line from a server
	maxLog      = 8 << 20  // each server's log file
	logTailSize = 2048     // of a failed server, in its status
)

// Server states, as the status file and the API say them.
const (
	StateInstalling = "installing"
	StateStarting   = "starting"
	StateRunning    = "running"
	StateFailed     = "failed"
)

// Config is what the gateway runs, read from its standard input.
type Config struct {
	Port int `json:"port"`
	// Key, when set, is required of every request in KeyHeader.
	Key     string   `json:"key,omitempty"`
	Servers []Server `json:"servers"`
}

// Server is one MCP server: how it is installed and run.
type Server struct {
	ID string `json:"id"`
	// Install runs as root unless Installed exists; it must create
	// Installed once it succeeds.
	Install   []string `json:"install,omitempty"`
	Installed string   `json:"installed,omitempty"`
	// Run starts the server, which then speaks MCP on its stdin and
	// stdout, as User in Cwd with Env added to the gateway's own.
	Run  []string          `json:"run"`
	Env  map[string]string `json:"env,omitempty"`
	User string            `json:"user"`
	Cwd  string            `json:"cwd"`
}

// Status is the gateway's state, in StatusPath.
type Status struct {
	PID       int            `json:"pid"`
	Config    Config         `json:"config"`
	Servers   []ServerStatus `json:"servers"`
	UpdatedAt time.Time      `json:"updatedAt"`
}

// ServerStatus is one server's state.
type ServerStatus struct {
	ID        string     `json:"id"`
	State     string     `json:"state"`
	Error     string     `json:"error,omitempty"`
	LogTail   string     `json:"logTail,omitempty"`
	StartedAt *time.Time `json:"startedAt,omitempty"`
	// Name and Version are what the server says of itself.
	Name    string `json:"name,omitempty"`
	Version string `json:"version,omitempty"`
	// Restarts counts the times it was started again after it ended.
	Restarts int `json:"restarts,omitempty"`
}

var validID = regexp.MustCompile(`^[a-z][a-z0-9-]{0,31}$`)

// Check refuses a config the gateway cannot run.
func (c *Config) Check() error {
	if c.Port < 1 || c.Port > 65535 {
		return fmt.Errorf("port %d out of range", c.Port)
	}
	if len(c.Servers) == 0 || len(c.Servers) > MaxServers {
		return fmt.Errorf("%d servers: 1 to %d", len(c.Servers), MaxServers)
	}
	seen := map[string]bool{}
	for _, s := range c.Servers {
		if !validID.MatchString(s.ID) || seen[s.ID] {
			return fmt.Errorf("server id %q invalid or repeated", s.ID)
		}
		seen[s.ID] = true
		if len(s.Run) == 0 || s.User == "" || s.Cwd == "" {
			return fmt.Errorf("server %s: run, user and cwd are required", s.ID)
		}
		if len(s.Install) > 0 && s.Installed == "" {
			return fmt.Errorf("server %s: an install needs its installed marker", s.ID)
		}
	}
	return nil
}

// ValidID reports whether id names a server as the gateway takes it.
func ValidID(id string) bool { return validID.MatchString(id) }
