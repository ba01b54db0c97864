package api

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"time"

	"github.com/emberbox/emberbox/internal/egress"
	"github.com/emberbox/emberbox/internal/errdefs"
	"github.com/emberbox/emberbox/internal/sandbox"
)

// NetworkManager keeps egress policies (sandbox.Networks): Config.Network,
// or the Manager's own, found by type assertion. Without it the network
// routes answer 503 network_unavailable.
type NetworkManager interface {
	Network(ctx context.Context, owner, id string) (*sandbox.NetworkStatus, error)
	SetNetwork(ctx context.Context, owner, id string, p egress.Policy) (*sandbox.NetworkStatus, error)
}

// networkRequest is the body of PUT /v1/sandboxes/{id}/network and the
// create request's "network" field.
type networkRequest struct {
	Internet *bool    `json:"internet"` // default true
	Allow    []string `json:"allow"`
	Deny     []string `json:"deny"`
	Connect  []string `json:"connect"` // host:port beyond 80/443: every port is open here, so it must be empty
}

// policy validates the request; path prefixes issue paths ("network.").
func (req *networkRequest) policy(path string) (egress.Policy, []issue) {
	p := egress.Policy{Internet: req.Internet == nil || *req.Internet, Allow: req.Allow, Deny: req.Deny}
	var issues []issue
	if len(req.Connect) > 0 {
		issues = append(issues, issue{Path: path + "connect", Message: "is not needed here: allow and deny rules apply to every port"})
	}
	if _, err := egress.Compile(p); err != nil {
		var errs interface{ Unwrap() []error }
		if errors.As(err, &errs) {
			for _, e := range errs.Unwrap() {
				var re *egress.RuleError
				if errors.As(e, &re) {
					issues = append(issues, issue{Path: path + re.Path, Message: re.Message})
				}
			}
		}
		if len(issues) == 0 {
			issues = append(issues, issue{Path: path + "allow", Message: err.Error()})
		}
	}
	return p, issues
}

// parseNetwork decodes the create request's network field.
func parseNetwork(raw json.RawMessage) (*egress.Policy, []issue) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	var req networkRequest
	if issues := decodeStrict(raw, &req); len(issues) > 0 {
		for i := range issues {
			issues[i].Path = "network." + issues[i].Path
		}
		return nil, issues
	}
	p, issues := req.policy("network.")
	return &p, issues
}

type networkJSON struct {
	SandboxID       string          `json:"sandboxId"`
	Internet        bool            `json:"internet"`
	Allow           []string        `json:"allow"`
	Deny            []string        `json:"deny"`
	Connect         []string        `json:"connect"`
	Version         int64           `json:"version"`
	Enforced        bool            `json:"enforced"`
	EnforcedVersion int64           `json:"enforcedVersion"`
	OpenPorts       bool            `json:"openPorts"`
	ForbiddenPorts  []int           `json:"forbiddenPorts"`
	UpdatedAt       time.Time       `json:"updatedAt"`
	Egress          egress.Counters `json:"egress"`
	// LimitedByOperator: the server's ceiling narrowed the policy asked
	// for; internet, allow and deny are the policy that applies.
	LimitedByOperator bool `json:"limitedByOperator,omitempty"`
}

func toNetworkJSON(st *sandbox.NetworkStatus) networkJSON {
	p := st.Network.Policy
	return networkJSON{
		SandboxID: st.SandboxID, Internet: p.Internet, Allow: p.Allow, Deny: p.Deny, Connect: []string{},
		Version: st.Network.Version, Enforced: st.Enforced, EnforcedVersion: st.EnforcedVersion,
		OpenPorts: p.Internet, ForbiddenPorts: egress.MailPorts, UpdatedAt: st.Network.UpdatedAt.UTC(), Egress: st.Counters,
		LimitedByOperator: st.Limited,
	}
}

func (s networkAPI) networkManager() (NetworkManager, error) {
	nm := s.mgr.Network
	if nm == nil {
		nm, _ = s.mgr.Sandboxes.(NetworkManager)
	}
	if nm == nil {
		return nil, errdefs.New(errdefs.ErrUnavailable, "network_unavailable", "this server does not manage egress policies")
	}
	return nm, nil
}

func (s networkAPI) get(w http.ResponseWriter, r *http.Request, c *call) error {
	nm, err := s.networkManager()
	if err != nil {
		return err
	}
	st, err := nm.Network(r.Context(), c.owner, r.PathValue("id"))
	return reply(w, st, err, toNetworkJSON)
}

func (s networkAPI) put(w http.ResponseWriter, r *http.Request, c *call) error {
	var req networkRequest
	if err := decode(c, &req); err != nil {
		return err
	}
	p, issues := req.policy("")
	if len(issues) > 0 {
		return invalid(sortIssues(issues))
	}
	nm, err := s.networkManager()
	if err != nil {
		return err
	}
	st, err := nm.SetNetwork(r.Context(), c.owner, r.PathValue("id"), p)
	return reply(w, st, err, toNetworkJSON)
}
