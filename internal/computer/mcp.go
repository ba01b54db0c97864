package computer

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"time"

	"github.com/emberbox/emberbox/internal/errdefs"
	"github.com/emberbox/emberbox/internal/guest"
	"github.com/emberbox/emberbox/internal/mcpgateway"
)

// The MCP gateway of a sandbox (internal/mcpgateway) is a guest process,
// `emberbox-agent mcp-gateway`, started as root with its config on its
// standard input. Like the browser it is known by its command line, and
// what it runs is read back from the status file it keeps, so the host
// holds no state: a restart of the server, a pause and a wake all find it
// as it was.

// DefaultMCPPort is where the gateway listens in the guest by default.
const DefaultMCPPort = 8930

// maxMCPStatus bounds the status file the host reads.
const maxMCPStatus = 1 << 20

// mcpStartWait bounds how long a start waits for the new gateway's first
// status.
const mcpStartWait = time.Minute

// MCPServerRequest is one server a start asks for.
type MCPServerRequest struct {
	ID string
	// Env is added to the server's environment: the placeholders of the
	// egress secrets it was given.
	Env map[string]string
}

// MCPRequest is what a start asks for.
type MCPRequest struct {
	Servers []MCPServerRequest
	Port    int // 0: the running gateway's, else DefaultMCPPort
	// Replace runs exactly Servers; else they join those running.
	Replace bool
	// Public gives the gateway a key of its own, kept across starts until
	// a stop, for URLs that need no preview token.
	Public bool
}

// MCPGateway is the state of a sandbox's gateway.
type MCPGateway struct {
	Running   bool
	Port      int
	Key       string // "" unless public
	ProcessID string
	StartedAt time.Time
	Servers   []mcpgateway.ServerStatus
}

// Check validates r against the catalog.
func (r MCPRequest) Check() error {
	if len(r.Servers) == 0 || len(r.Servers) > mcpgateway.MaxServers {
		return invalid("servers lists 1 to %d MCP servers of GET /v1/mcp/catalog", mcpgateway.MaxServers)
	}
	seen := map[string]bool{}
	for _, s := range r.Servers {
		if _, ok := LookupMCP(s.ID); !ok {
			return errdefs.New(errdefs.ErrInvalidArgument, "mcp_server_unknown", "no MCP server %q in the catalog", clip(printable(s.ID), 64)).
				WithHint("GET /v1/mcp/catalog lists them")
		}
		if seen[s.ID] {
			return invalid("the MCP server %s is listed twice", s.ID)
		}
		seen[s.ID] = true
	}
	if r.Port != 0 && (r.Port < 1024 || r.Port > 65535 || r.Port == CDPPort) {
		return invalid("port must be 1024 to 65535, and not %d (the browser's)", CDPPort)
	}
	return nil
}

func invalid(format string, args ...any) error {
	return errdefs.New(errdefs.ErrInvalidArgument, "invalid_request", format, args...)
}

// StartMCP runs the servers of r in sandbox id's gateway, starting or
// restarting it as needed; servers already running as asked are left as
// they are. It answers once the gateway has said what it runs: servers
// still installing say so.
func (s *Service) StartMCP(ctx context.Context, id string, g Guest, r MCPRequest) (*MCPGateway, error) {
	if err := r.Check(); err != nil {
		return nil, err
	}
	defer s.locks.lock(id + "/mcp")()
	cur, st, err := s.mcpState(ctx, g)
	if err != nil {
		return nil, err
	}
	cfg, err := mcpConfig(r, cur, st)
	if err != nil {
		return nil, err
	}
	if cur.Running && st != nil && reflect.DeepEqual(cfg, st.Config) && !anyFailed(st) {
		return cur, nil
	}
	if cur.Running {
		s.stopGateway(ctx, g, cur.ProcessID)
	}
	stdin, err := json.Marshal(cfg)
	if err != nil {
		return nil, err
	}
	info, err := g.Spawn(ctx, guest.ExecRequest{Argv: []string{agentPath, "mcp-gateway"}, Stdin: stdin,
		User: "root", Cwd: "/", Detach: true})
	if err != nil {
		return nil, fmt.Errorf("starting the MCP gateway: %w", err)
	}
	s.log.Info("mcp gateway started", "sandbox", id, "process", info.ID, "servers", len(cfg.Servers), "port", cfg.Port)
	return s.gatewayUp(ctx, g, info)
}

// mcpConfig is the gateway config of r, given what runs (cur, st).
func mcpConfig(r MCPRequest, cur *MCPGateway, st *mcpgateway.Status) (mcpgateway.Config, error) {
	cfg := mcpgateway.Config{Port: r.Port}
	if cfg.Port == 0 {
		cfg.Port = DefaultMCPPort
		if cur.Running {
			cfg.Port = cur.Port
		}
	}
	if !r.Replace && st != nil {
		for _, old := range st.Config.Servers {
			if !slices.ContainsFunc(r.Servers, func(n MCPServerRequest) bool { return n.ID == old.ID }) {
				cfg.Servers = append(cfg.Servers, old)
			}
		}
	}
	for _, n := range r.Servers {
		e, _ := LookupMCP(n.ID)
		cfg.Servers = append(cfg.Servers, e.server(n.Env))
	}
	if len(cfg.Servers) > mcpgateway.MaxServers {
		return cfg, errdefs.New(errdefs.ErrConflict, "mcp_too_many", "with those running the gateway would run %d MCP servers, over %d",
			len(cfg.Servers), mcpgateway.MaxServers).WithHint("start with replace: true to run only those asked for")
	}
	if r.Public {
		cfg.Key = cur.Key
		if cfg.Key == "" {
			var b [32]byte
			_, _ = rand.Read(b[:])
			cfg.Key = hex.EncodeToString(b[:])
		}
	}
	return cfg, nil
}

func anyFailed(st *mcpgateway.Status) bool {
	return slices.ContainsFunc(st.Servers, func(s mcpgateway.ServerStatus) bool { return s.State == mcpgateway.StateFailed })
}

// gatewayUp waits for the gateway of process p to write its first status.
func (s *Service) gatewayUp(ctx context.Context, g Guest, p *guest.ProcessInfo) (*MCPGateway, error) {
	wctx, cancel := context.WithTimeout(ctx, mcpStartWait)
	defer cancel()
	for {
		cur, err := g.Process(wctx, p.ID)
		if err == nil && !running(*cur) {
			return nil, errdefs.New(errdefs.ErrInternal, "mcp_failed", "the MCP gateway ended as it started: %s", tail(ctx, g, p.ID))
		}
		if err == nil {
			if st, err := readMCPStatus(wctx, g); err == nil && st.PID == cur.PID {
				return gatewayOf(cur, st), nil
			}
		}
		select {
		case <-wctx.Done():
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			return nil, errdefs.New(errdefs.ErrUnavailable, "mcp_failed", "the MCP gateway did not start within %s", mcpStartWait)
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// GetMCP reports the gateway of g: Running false if there is none.
func (s *Service) GetMCP(ctx context.Context, g Guest) (*MCPGateway, error) {
	cur, _, err := s.mcpState(ctx, g)
	return cur, err
}

// mcpState finds the gateway of g and reads its status (nil when it has
// none yet, or one of another process).
func (s *Service) mcpState(ctx context.Context, g Guest) (*MCPGateway, *mcpgateway.Status, error) {
	procs, err := processes(ctx, g)
	if err != nil {
		return nil, nil, err
	}
	cur, st := mcpStateOf(ctx, g, procs)
	return cur, st, nil
}

// mcpStateOf is mcpState of the guest's processes procs.
func mcpStateOf(ctx context.Context, g Guest, procs []guest.ProcessInfo) (*MCPGateway, *mcpgateway.Status) {
	p := findGateway(procs)
	if p == nil {
		return &MCPGateway{}, nil
	}
	st, err := readMCPStatus(ctx, g)
	if err != nil || st.PID != p.PID {
		return &MCPGateway{Running: true, ProcessID: p.ID, StartedAt: p.StartedAt}, nil
	}
	return gatewayOf(p, st), st
}

// StopMCP ends the gateway of sandbox id and its servers, answering the
// gateway it stopped (nil: none ran).
func (s *Service) StopMCP(ctx context.Context, id string, g Guest) (*MCPGateway, error) {
	defer s.locks.lock(id + "/mcp")()
	procs, err := processes(ctx, g)
	if err != nil {
		return nil, err
	}
	cur, _ := mcpStateOf(ctx, g, procs)
	if !cur.Running {
		return nil, nil
	}
	if cur.Port == 0 {
		cur.Port = DefaultMCPPort // its status unread: the port it most likely has
	}
	for _, p := range procs {
		if isGateway(p) && running(p) {
			s.stopGateway(ctx, g, p.ID)
		}
	}
	s.log.Info("mcp gateway stopped", "sandbox", id)
	return cur, nil
}

// stopGateway kills a gateway's process group, its servers with it.
func (s *Service) stopGateway(ctx context.Context, g Guest, pid string) {
	kill(ctx, g, pid)
	waitEnded(ctx, g, pid)
}

func isGateway(p guest.ProcessInfo) bool {
	return len(p.Argv) == 2 && p.Argv[0] == agentPath && p.Argv[1] == "mcp-gateway"
}

func findGateway(procs []guest.ProcessInfo) *guest.ProcessInfo {
	for i := range procs {
		if isGateway(procs[i]) && running(procs[i]) {
			return &procs[i]
		}
	}
	return nil
}

// readMCPStatus reads the gateway's status file, which only root may
// read (it holds a public gateway's key): written in the guest, so
// bounded and checked before it is believed.
func readMCPStatus(ctx context.Context, g Guest) (*mcpgateway.Status, error) {
	res, err := g.Exec(ctx, guest.ExecRequest{Argv: []string{"cat", mcpgateway.StatusPath}, User: "root",
		MaxOutput: maxMCPStatus, TimeoutMs: 30_000}, nil)
	if err != nil {
		return nil, err
	}
	if res.ExitCode == nil || *res.ExitCode != 0 {
		return nil, errdefs.New(errdefs.ErrNotFound, "file_not_found", "no MCP gateway status")
	}
	var st mcpgateway.Status
	if err := json.Unmarshal(res.Stdout, &st); err != nil {
		return nil, fmt.Errorf("the MCP gateway's status: %w", err)
	}
	if err := st.Config.Check(); err != nil {
		return nil, fmt.Errorf("the MCP gateway's status: %w", err)
	}
	return &st, nil
}

// gatewayOf is the gateway of process p with status st, its text made
// safe to answer.
func gatewayOf(p *guest.ProcessInfo, st *mcpgateway.Status) *MCPGateway {
	gw := &MCPGateway{Running: true, Port: st.Config.Port, Key: st.Config.Key, ProcessID: p.ID, StartedAt: p.StartedAt}
	for _, spec := range st.Config.Servers {
		ss := mcpgateway.ServerStatus{ID: spec.ID, State: mcpgateway.StateStarting}
		for _, got := range st.Servers {
			if got.ID == spec.ID {
				ss = got
			}
		}
		switch ss.State {
		case mcpgateway.StateInstalling, mcpgateway.StateStarting, mcpgateway.StateRunning, mcpgateway.StateFailed:
		default:
			ss.State = mcpgateway.StateFailed
		}
		ss.Error, ss.LogTail = clip(ss.Error, 1000), clip(ss.LogTail, 4096)
		ss.Restarts = max(0, ss.Restarts)
		ss.Name, ss.Version = clip(printable(ss.Name), 100), clip(printable(ss.Version), 50)
		gw.Servers = append(gw.Servers, ss)
	}
	return gw
}
