package computer

import (
	"crypto/sha256"
	"encoding/hex"

	"github.com/emberbox/emberbox/internal/mcpgateway"
)

// MCPEntry is an MCP server of the catalog: a package this server knows
// how to install in a sandbox and run behind the gateway.
type MCPEntry struct {
	ID          string `json:"id"`
	Name        string `json:"name"`
	Description string `json:"description"`
	// Registry is "pypi" or "npm"; the install reaches it through the
	// sandbox's egress, as do the hosts of Egress when the server runs.
	Registry string   `json:"registry"`
	Package  string   `json:"package"`
	Version  string   `json:"version"`
	Egress   []string `json:"egress"`
	// Secrets are the variables the server reads credentials from, to be
	// named egress secrets: the server sees a placeholder, the egress gate
	// puts the value in on the way to the secret's hosts.
	Secrets []MCPSecret `json:"secrets"`

	command string            // what the package installs
	pins    []string          // what else the install must hold to (pip requirements)
	args    []string          // how the server is started
	env     map[string]string // what it is started with
}

// MCPSecret is a credential an MCP server reads from its environment.
type MCPSecret struct {
	Env         string   `json:"env"`
	Description string   `json:"description"`
	Hosts       []string `json:"hosts"`
	Required    bool     `json:"required"`
}

// mcpDir is where servers are installed in the guest, one directory each.
const mcpDir = "/opt/emberbox-mcp"

var (
	pypiHosts = []string{"pypi.org", "files.pythonhosted.org"}
	npmHosts  = []string{"registry.npmjs.org"}
)

// mcpCatalog is the curated set: small, pinned, installable from PyPI or
// npm with what the image has (python3 with venv, node with npm).
var mcpCatalog = []MCPEntry{
	{ID: "time", Name: "Time", Description: "The current time in any IANA time zone, and conversions between zones.",
		Registry: "pypi", Package: "mcp-server-time", Version: "2026.10.19", command: "mcp-server-time"},
	{ID: "fetch", Name: "Fetch", Description: "Fetches a URL through the sandbox's egress and answers it as Markdown.",
		Registry: "pypi", Package: "mcp-server-fetch", Version: "2026.10.24", command: "mcp-server-fetch",
		Egress: []string{"the hosts it is asked to fetch"}},
	{ID: "git", Name: "Git", Description: "Reads and changes git repositories in the sandbox: status, diff, log, commit, branches.",
		Registry: "pypi", Package: "mcp-server-git", Version: "2026.10.19", command: "mcp-server-git"},
	{ID: "sqlite", Name: "SQLite", Description: "Queries and changes a SQLite database at /workspace/mcp.sqlite3.",
		Registry: "pypi", Package: "mcp-server-sqlite", Version: "2025.4.25", command: "mcp-server-sqlite",
		// It uses the decorators mcp 2 removed, and asks only mcp>=1.
		pins: []string{"mcp<2"}, args: []string{"--db-path", "/workspace/mcp.sqlite3"}},
	{ID: "filesystem", Name: "Filesystem", Description: "Reads, writes, searches and moves files under /workspace.",
		Registry: "npm", Package: "@modelcontextprotocol/server-filesystem", Version: "2026.8.31", command: "mcp-server-filesystem",
		args: []string{"/workspace"}},
	{ID: "memory", Name: "Memory", Description: "A knowledge graph the agent keeps across calls, in /home/user/.mcp-memory.json.",
		Registry: "npm", Package: "@modelcontextprotocol/server-memory", Version: "2026.8.31", command: "mcp-server-memory",
		env: map[string]string{"MEMORY_FILE_PATH": "/home/user/.mcp-memory.json"}},
	{ID: "github", Name: "GitHub", Description: "Repositories, issues and pull requests on GitHub, with a token the sandbox never sees.",
		Registry: "npm", Package: "@modelcontextprotocol/server-github", Version: "2025.4.8", command: "mcp-server-github",
		Egress: []string{"api.github.com"},
		Secrets: []MCPSecret{{Env: "GITHUB_PERSONAL_ACCESS_TOKEN", Description: "A GitHub token, as an egress secret for api.github.com.",
			Hosts: []string{"api.github.com"}, Required: true}}},
}

// MCPCatalog returns the catalog, each entry's egress including its
// registry's hosts.
func MCPCatalog() []MCPEntry {
	out := make([]MCPEntry, len(mcpCatalog))
	for i, e := range mcpCatalog {
		e.Egress = append(registryHosts(e.Registry), e.Egress...)
		out[i] = e
	}
	return out
}

// LookupMCP returns the catalog's entry id.
func LookupMCP(id string) (MCPEntry, bool) {
	for _, e := range mcpCatalog {
		if e.ID == id {
			return e, true
		}
	}
	return MCPEntry{}, false
}

func registryHosts(registry string) []string {
	if registry == "npm" {
		return append([]string(nil), npmHosts...)
	}
	return append([]string(nil), pypiHosts...)
}

// server is how the gateway installs and runs e, with env added (the
// placeholders of its secrets). Every word of the install script comes
// from the catalog, never from a request.
func (e MCPEntry) server(env map[string]string) mcpgateway.Server {
	dir := mcpDir + "/" + e.ID
	var install string
	switch e.Registry {
	case "npm":
		install = `npm install --global --prefix "$d" --no-audit --no-fund --loglevel=warn '` + e.Package + "@" + e.Version + `'`
	default:
		install = `python3 -m venv "$d" && "$d/bin/pip" install --disable-pip-version-check --no-input -q '` + e.Package + "==" + e.Version + `'`
		for _, p := range e.pins {
			install += ` '` + p + `'`
		}
	}
	// The marker names the install: a changed one (a version, a pin) runs
	// again in a sandbox that has the old one.
	sum := sha256.Sum256([]byte(install))
	marker := dir + "/.installed-" + hex.EncodeToString(sum[:8])
	script := `set -eu; d='` + dir + `'; rm -rf "$d"; mkdir -p "$d"; ` + install + `; chmod -R a+rX "$d"; touch '` + marker + `'`
	s := mcpgateway.Server{ID: e.ID, Install: []string{"/bin/sh", "-c", script}, Installed: marker,
		Run: append([]string{dir + "/bin/" + e.command}, e.args...), User: "user", Cwd: "/workspace"}
	if len(e.env)+len(env) > 0 {
		s.Env = map[string]string{}
		for k, v := range e.env {
			s.Env[k] = v
		}
		for k, v := range env {
			s.Env[k] = v
		}
	}
	return s
}
