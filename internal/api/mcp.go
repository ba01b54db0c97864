package api

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/emberbox/emberbox/internal/computer"
	"github.com/emberbox/emberbox/internal/guest"
	"github.com/emberbox/emberbox/internal/mcpgateway"
	"github.com/emberbox/emberbox/internal/sandbox"
)

// MCP servers in a sandbox (withruntime's sbx.mcp and runtime.mcp): the
// catalog's servers, installed and run by the gateway in the guest
// (computer.StartMCP), served over MCP's streamable HTTP at
// /mcp/<id> on the preview of the gateway's port: an origin of its own.
// A private gateway's URLs need the preview's token in a header; a public
// one's need the gateway's key instead.

// mcpRequest is the body of POST …/mcp.
type mcpRequest struct {
	Servers []mcpServerRequest `json:"servers"`
	Port    int                `json:"port"`
	Replace bool               `json:"replace"`
	Public  bool               `json:"public"`
}

// mcpServerRequest names a catalog server and the egress secrets it gets:
// its variable to the secret's name.
type mcpServerRequest struct {
	ID      string            `json:"id"`
	Secrets map[string]string `json:"secrets"`
}

// mcpJSON is a sandbox's gateway as the API answers it.
type mcpJSON struct {
	SandboxID string          `json:"sandboxId"`
	Running   bool            `json:"running"`
	Port      int             `json:"port"`
	Public    bool            `json:"public"`
	Servers   []mcpServerJSON `json:"servers"`
	// Headers go with every request to a server's URL.
	Headers        map[string]string `json:"headers"`
	TokenExpiresAt *time.Time        `json:"tokenExpiresAt"`
	StartedAt      *time.Time        `json:"startedAt"`
}

// mcpServerJSON is one server: status installing (or starting), running
// or failed, with the error and its log's tail.
type mcpServerJSON struct {
	ID        string     `json:"id"`
	Name      string     `json:"name"`
	Status    string     `json:"status"`
	URL       *string    `json:"url"`
	Error     *string    `json:"error"`
	Log       *string    `json:"log"`
	StartedAt *time.Time `json:"startedAt"`
	// Restarts counts the gateway's restarts of a server that ended; the
	// error says why it last ended while it starts again.
	Restarts int `json:"restarts"`
	// ServerInfo is what the server says it is, once it runs.
	ServerInfo *mcpServerInfo `json:"serverInfo"`
}

type mcpServerInfo struct {
	Name    string `json:"name"`
	Version string `json:"version"`
}

func (s mcpAPI) catalog(w http.ResponseWriter, r *http.Request, c *call) error {
	if s.computer == nil {
		return mcpUnavailable()
	}
	writeJSON(w, http.StatusOK, map[string]any{"data": computer.MCPCatalog()})
	return nil
}

func mcpUnavailable() error {
	return newError(http.StatusNotImplemented, "mcp_unavailable", "This server runs no MCP servers.")
}

// mcpGuest is guest for the MCP routes, which a server built without
// computer use refuses.
func (s mcpAPI) mcpGuest(r *http.Request, c *call) (*sandbox.Sandbox, guest.Handle, error) {
	sb, g, err := s.guest(r, c)
	if err != nil {
		return nil, guest.Handle{}, err
	}
	if s.computer == nil {
		return nil, guest.Handle{}, mcpUnavailable()
	}
	return sb, g, nil
}

func (s mcpAPI) start(w http.ResponseWriter, r *http.Request, c *call) error {
	var body mcpRequest
	if err := decode(c, &body); err != nil {
		return err
	}
	req := computer.MCPRequest{Port: body.Port, Replace: body.Replace, Public: body.Public}
	for _, srv := range body.Servers {
		req.Servers = append(req.Servers, computer.MCPServerRequest{ID: srv.ID})
	}
	if err := req.Check(); err != nil {
		return err
	}
	sb, g, err := s.mcpGuest(r, c)
	if err != nil {
		return err
	}
	for i, srv := range body.Servers {
		env, err := s.mcpSecrets(c.owner, sb, srv)
		if err != nil {
			return err
		}
		req.Servers[i].Env = env
	}
	gw, err := s.computer.StartMCP(r.Context(), sb.ID, g, req)
	if err != nil {
		return err
	}
	return s.answer(w, r, c, sb, gw)
}

// mcpSecrets resolves the secrets of srv to their placeholders: each must
// be one the catalog says the server reads, name a secret of the key
// that reaches sb, and every required one must be given.
func (s mcpAPI) mcpSecrets(owner string, sb *sandbox.Sandbox, srv mcpServerRequest) (map[string]string, error) {
	e, _ := computer.LookupMCP(srv.ID)
	for _, need := range e.Secrets {
		if _, ok := srv.Secrets[need.Env]; need.Required && !ok {
			return nil, newError(http.StatusBadRequest, "mcp_secret_required", "The MCP server "+e.ID+" needs the secret "+need.Env+".").
				withHint("Store it with PUT /v1/egress-secrets/{name} (hosts: " + strings.Join(need.Hosts, ", ") + "), then pass secrets: {\"" + need.Env + "\": \"<name>\"}.")
		}
	}
	if len(srv.Secrets) == 0 {
		return nil, nil
	}
	if s.secrets == nil {
		return nil, newError(http.StatusNotImplemented, "egress_secrets_unavailable", "This server keeps no egress secrets.")
	}
	env := map[string]string{}
	for variable, name := range srv.Secrets {
		declared := false
		for _, need := range e.Secrets {
			declared = declared || need.Env == variable
		}
		if !declared {
			return nil, newError(http.StatusBadRequest, "invalid_request", fmt.Sprintf("The MCP server %s reads no secret %.64q.", e.ID, variable)).
				withHint("GET /v1/mcp/catalog lists each server's secrets.")
		}
		p, ok := s.secrets.Placeholder(owner, name, sb.ID, sb.Labels)
		if !ok {
			return nil, newError(http.StatusNotFound, "secret_not_found", fmt.Sprintf("No egress secret %.64q reaches this sandbox.", name)).
				withHint("GET /v1/egress-secrets lists them; PUT …/sandboxes sets which sandboxes one reaches.")
		}
		env[variable] = p
	}
	return env, nil
}

func (s mcpAPI) get(w http.ResponseWriter, r *http.Request, c *call) error {
	sb, g, err := s.mcpGuest(r, c)
	if err != nil {
		return err
	}
	gw, err := s.computer.GetMCP(r.Context(), g)
	if err != nil {
		return err
	}
	return s.answer(w, r, c, sb, gw)
}

func (s mcpAPI) stop(w http.ResponseWriter, r *http.Request, c *call) error {
	sb, g, err := s.mcpGuest(r, c)
	if err != nil {
		return err
	}
	stopped, err := s.computer.StopMCP(r.Context(), sb.ID, g)
	if err != nil {
		return err
	}
	// Its URLs end with it.
	if stopped != nil {
		s.unsharePort(r.Context(), c.owner, sb.ID, stopped.Port)
	}
	writeJSON(w, http.StatusOK, map[string]any{"sandboxId": sb.ID, "stopped": stopped != nil})
	return nil
}

// answer writes gw, with fresh URLs and headers while it runs.
func (s mcpAPI) answer(w http.ResponseWriter, r *http.Request, c *call, sb *sandbox.Sandbox, gw *computer.MCPGateway) error {
	out := mcpJSON{SandboxID: sb.ID, Running: gw.Running, Port: gw.Port, Public: gw.Key != "",
		Servers: []mcpServerJSON{}, Headers: map[string]string{}}
	if !gw.Running {
		writeJSON(w, http.StatusOK, out)
		return nil
	}
	at := gw.StartedAt.UTC()
	out.StartedAt = &at
	base := ""
	if gw.Port != 0 {
		p, err := s.gatewayPreview(r.Context(), c.owner, sb.ID, gw.Port, gw.Key != "")
		if err != nil {
			return err
		}
		base = s.previewDomain.url(sb.ID, gw.Port, r.Host) // ends in /
		if gw.Key != "" {
			out.Headers[mcpgateway.KeyHeader] = gw.Key
		} else {
			exp, err := p.TokenExpiry(s.now(), 0, nil)
			if err != nil {
				return err
			}
			out.Headers[previewTokenHeader] = p.Token(exp)
			out.TokenExpiresAt = &exp
		}
	}
	for _, ss := range gw.Servers {
		out.Servers = append(out.Servers, mcpServerOf(ss, base))
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

func mcpServerOf(ss mcpgateway.ServerStatus, base string) mcpServerJSON {
	js := mcpServerJSON{ID: ss.ID, Status: ss.State, StartedAt: ss.StartedAt, Restarts: ss.Restarts}
	if e, ok := computer.LookupMCP(ss.ID); ok {
		js.Name = e.Name
	}
	if ss.State == mcpgateway.StateStarting {
		js.Status = mcpgateway.StateInstalling // the API's three: installing, running, failed
	}
	if base != "" {
		u := base + "mcp/" + ss.ID
		js.URL = &u
	}
	if ss.Error != "" {
		js.Error = &ss.Error
	}
	if ss.LogTail != "" {
		js.Log = &ss.LogTail
	}
	if ss.Name != "" {
		js.ServerInfo = &mcpServerInfo{Name: ss.Name, Version: ss.Version}
	}
	return js
}

// gatewayPreview is the preview of the gateway's port, private or public
// as the gateway is: one of the other kind is replaced, so a gateway
// without a key is never public.
func (s mcpAPI) gatewayPreview(ctx context.Context, owner, id string, port int, public bool) (*sandbox.Preview, error) {
	spec := sandbox.PreviewSpec{Port: port, Visibility: sandbox.PreviewPrivate}
	if public {
		spec.Visibility = sandbox.PreviewPublic
	}
	p, err := s.sharePort(ctx, owner, id, spec)
	if err != nil || p.Visibility == spec.Visibility {
		return p, err
	}
	s.unsharePort(ctx, owner, id, port)
	return s.sharePort(ctx, owner, id, spec)
}
