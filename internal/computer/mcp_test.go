package computer

import (
	"context"
	"encoding/json"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/emberbox/emberbox/internal/errdefs"
	"github.com/emberbox/emberbox/internal/mcpgateway"
)

// statusOf is the status a gateway of config stdin writes at first: each
// server in state.
func statusOf(state string) func([]byte, int) string {
	return func(stdin []byte, pid int) string {
		var cfg mcpgateway.Config
		if err := json.Unmarshal(stdin, &cfg); err != nil {
			return ""
		}
		st := mcpgateway.Status{PID: pid, Config: cfg}
		for _, s := range cfg.Servers {
			st.Servers = append(st.Servers, mcpgateway.ServerStatus{ID: s.ID, State: state})
		}
		b, _ := json.Marshal(st)
		return string(b)
	}
}

func ids(gw *MCPGateway) []string {
	var out []string
	for _, s := range gw.Servers {
		out = append(out, s.ID)
	}
	return out
}

func TestStartMCP(t *testing.T) {
	g := newFakeGuest(t)
	g.gateway = statusOf(mcpgateway.StateInstalling)
	s := New(nil)
	ctx := context.Background()
	if gw, err := s.GetMCP(ctx, g); err != nil || gw.Running {
		t.Fatalf("before a start: %+v, %v", gw, err)
	}
	gw, err := s.StartMCP(ctx, "sbx_a", g, MCPRequest{Servers: []MCPServerRequest{{ID: "time"}}})
	if err != nil {
		t.Fatal(err)
	}
	if !gw.Running || gw.Port != DefaultMCPPort || gw.Key != "" || !slices.Equal(ids(gw), []string{"time"}) || gw.Servers[0].State != mcpgateway.StateInstalling {
		t.Fatalf("started %+v", gw)
	}
	sp := g.spawned[0]
	var cfg mcpgateway.Config
	if err := json.Unmarshal(sp.Stdin, &cfg); err != nil || sp.User != "root" || !sp.Detach || !slices.Equal(sp.Argv, []string{agentPath, "mcp-gateway"}) {
		t.Fatalf("spawned %q as %q, stdin %s", sp.Argv, sp.User, sp.Stdin)
	}
	srv := cfg.Servers[0]
	if srv.User != "user" || srv.Run[0] != "/opt/emberbox-mcp/time/bin/mcp-server-time" ||
		!strings.Contains(srv.Install[2], "'mcp-server-time==2026.10.19'") || !strings.Contains(srv.Install[2], srv.Installed) {
		t.Fatalf("the server's spec: %+v", srv)
	}

	// The same start again changes nothing.
	if again, err := s.StartMCP(ctx, "sbx_a", g, MCPRequest{Servers: []MCPServerRequest{{ID: "time"}}}); err != nil || again.ProcessID != gw.ProcessID || len(g.spawned) != 1 {
		t.Fatalf("the same start again: %+v, %v; %d spawns", again, err, len(g.spawned))
	}
	// Another server joins those running; the gateway restarts with both.
	gw, err = s.StartMCP(ctx, "sbx_a", g, MCPRequest{Servers: []MCPServerRequest{{ID: "github", Env: map[string]string{"GITHUB_PERSONAL_ACCESS_TOKEN": "ebx_placeholder"}}}})
	if err != nil || !slices.Equal(ids(gw), []string{"time", "github"}) || len(g.spawned) != 2 {
		t.Fatalf("a second server: %+v, %v", gw, err)
	}
	if first, _ := g.Process(ctx, "proc_1"); running(*first) {
		t.Fatal("the first gateway still runs after the restart")
	}
	_ = json.Unmarshal(g.spawned[1].Stdin, &cfg)
	if cfg.Servers[1].Env["GITHUB_PERSONAL_ACCESS_TOKEN"] != "ebx_placeholder" {
		t.Fatalf("github's env: %v", cfg.Servers[1].Env)
	}
	// Replace runs exactly those asked for.
	gw, err = s.StartMCP(ctx, "sbx_a", g, MCPRequest{Servers: []MCPServerRequest{{ID: "git"}}, Replace: true, Port: 9000})
	if err != nil || !slices.Equal(ids(gw), []string{"git"}) || gw.Port != 9000 {
		t.Fatalf("replace: %+v, %v", gw, err)
	}
	// A public gateway has a key, kept by the next public start.
	gw, err = s.StartMCP(ctx, "sbx_a", g, MCPRequest{Servers: []MCPServerRequest{{ID: "time"}}, Public: true})
	if err != nil || !regexp.MustCompile(`^[0-9a-f]{64}$`).MatchString(gw.Key) || gw.Port != 9000 {
		t.Fatalf("public: %+v, %v", gw, err)
	}
	key := gw.Key
	if gw, err = s.StartMCP(ctx, "sbx_a", g, MCPRequest{Servers: []MCPServerRequest{{ID: "fetch"}}, Public: true}); err != nil || gw.Key != key {
		t.Fatalf("a second public start: %+v, %v", gw, err)
	}
	stopped, err := s.StopMCP(ctx, "sbx_a", g)
	if err != nil || stopped == nil || stopped.Port != 9000 {
		t.Fatalf("stop: %+v, %v", stopped, err)
	}
	if gw, _ := s.GetMCP(ctx, g); gw.Running {
		t.Fatal("a stopped gateway still runs")
	}
	if stopped, _ := s.StopMCP(ctx, "sbx_a", g); stopped != nil {
		t.Fatal("a second stop stopped something")
	}
}

func TestStartMCPRefusals(t *testing.T) {
	g := newFakeGuest(t)
	g.gateway = statusOf(mcpgateway.StateRunning)
	s := New(nil)
	ctx := context.Background()
	for name, c := range map[string]struct {
		r    MCPRequest
		code string
	}{
		"none":     {MCPRequest{}, "invalid_request"},
		"unknown":  {MCPRequest{Servers: []MCPServerRequest{{ID: "rm-rf"}}}, "mcp_server_unknown"},
		"twice":    {MCPRequest{Servers: []MCPServerRequest{{ID: "time"}, {ID: "time"}}}, "invalid_request"},
		"cdp port": {MCPRequest{Servers: []MCPServerRequest{{ID: "time"}}, Port: CDPPort}, "invalid_request"},
		"low port": {MCPRequest{Servers: []MCPServerRequest{{ID: "time"}}, Port: 80}, "invalid_request"},
	} {
		if _, err := s.StartMCP(ctx, "sbx_a", g, c.r); errdefs.Code(err) != c.code {
			t.Errorf("%s: %v, want %s", name, err, c.code)
		}
	}
	if len(g.spawned) != 0 {
		t.Fatalf("a refused start spawned %d", len(g.spawned))
	}
	// Eight running, a ninth is refused unless it replaces them.
	var all []MCPServerRequest
	for _, e := range MCPCatalog() {
		all = append(all, MCPServerRequest{ID: e.ID})
	}
	if len(all) >= mcpgateway.MaxServers {
		t.Fatalf("the catalog outgrew the gateway: %d", len(all))
	}
	if _, err := s.StartMCP(ctx, "sbx_a", g, MCPRequest{Servers: all}); err != nil {
		t.Fatal(err)
	}
	if gw, _ := s.GetMCP(ctx, g); len(gw.Servers) != len(all) {
		t.Fatalf("%d servers run, want %d", len(gw.Servers), len(all))
	}
}

func TestStartMCPGatewayFails(t *testing.T) {
	g := newFakeGuest(t)
	g.gatewayExit = true
	_, err := New(nil).StartMCP(context.Background(), "sbx_a", g, MCPRequest{Servers: []MCPServerRequest{{ID: "time"}}})
	if errdefs.Code(err) != "mcp_failed" || !strings.Contains(err.Error(), "address already in use") {
		t.Fatalf("a gateway that ends at once: %v", err)
	}
}

// TestMCPStatusFromAHostileGuest: what the guest wrote is bounded and
// checked before it is answered.
func TestMCPStatusFromAHostileGuest(t *testing.T) {
	g := newFakeGuest(t)
	g.gateway = func(stdin []byte, pid int) string {
		var cfg mcpgateway.Config
		_ = json.Unmarshal(stdin, &cfg)
		st := mcpgateway.Status{PID: pid, Config: cfg, Servers: []mcpgateway.ServerStatus{
			{ID: "time", State: "owned", Error: strings.Repeat("e", 5000), Name: "a\x1b[31mb", Restarts: -7}}}
		b, _ := json.Marshal(st)
		return string(b)
	}
	s := New(nil)
	ctx := context.Background()
	gw, err := s.StartMCP(ctx, "sbx_a", g, MCPRequest{Servers: []MCPServerRequest{{ID: "time"}}})
	if err != nil {
		t.Fatal(err)
	}
	ss := gw.Servers[0]
	if ss.State != mcpgateway.StateFailed || len(ss.Error) != 1000 || ss.Name != "a[31mb" || ss.Restarts != 0 {
		t.Fatalf("a hostile status: %+v", ss)
	}
	// A status that is not the running gateway's is not believed.
	g.files[mcpgateway.StatusPath] = `{"pid":1,"config":{"port":1,"servers":[{"id":"x","run":["y"],"user":"u","cwd":"/"}]}}`
	if gw, err := s.GetMCP(ctx, g); err != nil || !gw.Running || len(gw.Servers) != 0 {
		t.Fatalf("another process's status: %+v, %v", gw, err)
	}
	g.files[mcpgateway.StatusPath] = "not json"
	if gw, err := s.GetMCP(ctx, g); err != nil || !gw.Running || len(gw.Servers) != 0 {
		t.Fatalf("a garbled status: %+v, %v", gw, err)
	}
}

func TestMCPCatalog(t *testing.T) {
	seen := map[string]bool{}
	for _, e := range MCPCatalog() {
		if !mcpgateway.ValidID(e.ID) || seen[e.ID] || e.Name == "" || e.Description == "" || e.Version == "" || e.command == "" {
			t.Errorf("entry %+v", e)
		}
		seen[e.ID] = true
		if e.Registry != "pypi" && e.Registry != "npm" || len(e.Egress) == 0 {
			t.Errorf("%s: registry %q, egress %v", e.ID, e.Registry, e.Egress)
		}
		// The install script is the catalog's words alone: nothing a
		// shell would read twice.
		if strings.ContainsAny(e.Package+e.Version+e.command+strings.Join(e.pins, ""), "'\"$`\\ ;&|") {
			t.Errorf("%s: a package, version or command a shell would read", e.ID)
		}
	}
	if e, ok := LookupMCP("github"); !ok || len(e.Secrets) != 1 || !e.Secrets[0].Required {
		t.Errorf("github's secrets: %+v", e.Secrets)
	}
	// MCPCatalog's egress is its copy.
	c := MCPCatalog()
	c[0].Egress[0] = "changed"
	if MCPCatalog()[0].Egress[0] == "changed" {
		t.Error("the catalog's slices are shared")
	}
}
