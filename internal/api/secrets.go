package api

import (
	"net/http"

	"github.com/emberbox/emberbox/internal/secrets"
)

// Egress secrets (internal/secrets): values sandboxes use without seeing.

// secretsAPI serves /v1/egress-secrets.
type secretsAPI struct{ *server }

// secretJSON is the wire form of a secret: never its value.
type secretJSON struct {
	Name        string             `json:"name"`
	Env         string             `json:"env"`
	Placeholder string             `json:"placeholder"`
	Hosts       []string           `json:"hosts"`
	Header      *string            `json:"header"`
	Format      *string            `json:"format"`
	Rules       []secrets.Rule     `json:"rules"`
	Only        *secrets.Scope     `json:"only,omitempty"` // absent: every sandbox of the key
	API         *secrets.APIPolicy `json:"api,omitempty"`
	Enforced    bool               `json:"enforced"`
	CreatedAt   jsonTime           `json:"createdAt"`
	UpdatedAt   jsonTime           `json:"updatedAt"`
}

func toSecretJSON(sc *secrets.Secret) secretJSON {
	rules := sc.Rules
	if rules == nil {
		rules = []secrets.Rule{}
	}
	return secretJSON{Name: sc.Name, Env: sc.Env, Placeholder: sc.Placeholder, Hosts: sc.Hosts, Header: optString(sc.Header),
		Format: optString(sc.Format), Rules: rules, Only: sc.Only, API: sc.API, Enforced: true,
		CreatedAt: jsonTime(sc.CreatedAt), UpdatedAt: jsonTime(sc.UpdatedAt)}
}

func (s secretsAPI) svc() (*secrets.Service, error) {
	if s.secrets == nil {
		return nil, newError(http.StatusNotImplemented, "egress_secrets_unavailable", "This server keeps no egress secrets.")
	}
	return s.secrets, nil
}

// scopeJSON is a scope as the SDK sends it; apps are not served here.
type scopeJSON struct {
	Labels    []map[string]string `json:"labels"`
	Sandboxes []string            `json:"sandboxes"`
	Apps      []string            `json:"apps"`
}

func (sj *scopeJSON) scope() (*secrets.Scope, error) {
	if sj == nil {
		return nil, nil
	}
	if len(sj.Apps) > 0 {
		return nil, newError(http.StatusNotImplemented, "apps_unavailable", "This server has no Apps to scope a secret to.")
	}
	return &secrets.Scope{Labels: sj.Labels, Sandboxes: sj.Sandboxes}, nil
}

type setSecretRequest struct {
	Value     string         `json:"value"`
	Hosts     []string       `json:"hosts"`
	Header    string         `json:"header"`
	Format    string         `json:"format"`
	Rules     []secrets.Rule `json:"rules"`
	Only      *scopeJSON     `json:"only"`
	Env       *string        `json:"env"`
	GithubApp any            `json:"githubApp"`
	Git       any            `json:"git"`
	API       *apiPolicyJSON `json:"api"`
}

// apiPolicyJSON is a secret's api policy as the SDK sends it; this
// server honours the hour's budgets of calls and writes.
type apiPolicyJSON struct {
	CallsPerHour  *int  `json:"callsPerHour"`
	WritesPerHour *int  `json:"writesPerHour"`
	Keep          *int  `json:"keep"`
	Copies        *bool `json:"copies"`
	Fresh         *int  `json:"fresh"`
	Graphql       any   `json:"graphql"`
}

func (p *apiPolicyJSON) policy() (*secrets.APIPolicy, error) {
	if p == nil {
		return nil, nil
	}
	if p.Keep != nil || p.Copies != nil || p.Fresh != nil || p.Graphql != nil {
		return nil, newError(http.StatusNotImplemented, "api_policy_unavailable",
			"This server honours an api policy's callsPerHour and writesPerHour, not keep, copies, fresh or graphql.")
	}
	out := &secrets.APIPolicy{WritesPerHour: p.WritesPerHour}
	if p.CallsPerHour != nil {
		out.CallsPerHour = *p.CallsPerHour
	}
	return out, nil
}

func (s secretsAPI) set(w http.ResponseWriter, r *http.Request, c *call) error {
	svc, err := s.svc()
	if err != nil {
		return err
	}
	var req setSecretRequest
	if err := decode(c, &req); err != nil {
		return err
	}
	switch {
	case req.GithubApp != nil:
		return newError(http.StatusNotImplemented, "github_app_unavailable", "This server does not make GitHub App tokens.")
	case req.Git != nil:
		return newError(http.StatusNotImplemented, "git_policy_unavailable", "This server does not check git pushes.")
	}
	only, err := req.Only.scope()
	if err != nil {
		return err
	}
	pol, err := req.API.policy()
	if err != nil {
		return err
	}
	sc, err := svc.Set(r.Context(), c.owner, r.PathValue("name"), secrets.Spec{Value: req.Value, Hosts: req.Hosts,
		Header: req.Header, Format: req.Format, Rules: req.Rules, Only: only, API: pol, Env: req.Env})
	return reply(w, sc, err, toSecretJSON)
}

func (s secretsAPI) scope(w http.ResponseWriter, r *http.Request, c *call) error {
	svc, err := s.svc()
	if err != nil {
		return err
	}
	var req scopeJSON
	if err := decode(c, &req); err != nil {
		return err
	}
	only, err := req.scope()
	if err != nil {
		return err
	}
	sc, err := svc.SetScope(r.Context(), c.owner, r.PathValue("name"), *only)
	return reply(w, sc, err, toSecretJSON)
}

type narrowRequest struct {
	Hosts []string       `json:"hosts"`
	Rules []secrets.Rule `json:"rules"`
}

func (s secretsAPI) narrow(w http.ResponseWriter, r *http.Request, c *call) error {
	svc, err := s.svc()
	if err != nil {
		return err
	}
	var req narrowRequest
	if err := decode(c, &req); err != nil {
		return err
	}
	sc, err := svc.Narrow(r.Context(), c.owner, r.PathValue("name"), req.Hosts, req.Rules)
	return reply(w, sc, err, toSecretJSON)
}

// secretsPage is a page of secrets as the SDK reads it.
type secretsPage struct {
	Secrets []secretJSON `json:"secrets"`
	Next    *string      `json:"next"`
}

func (s secretsAPI) list(w http.ResponseWriter, r *http.Request, c *call) error {
	svc, err := s.svc()
	if err != nil {
		return err
	}
	q := r.URL.Query()
	var issues []issue
	limit := limitParam(q.Get("limit"), 100, &issues)
	if len(issues) > 0 {
		return invalid(issues)
	}
	list, err := svc.List(r.Context(), c.owner, limit+1, q.Get("after"))
	if err != nil {
		return err
	}
	page := secretsPage{Secrets: []secretJSON{}}
	for i, sc := range list {
		if i == limit {
			page.Next = &list[i-1].Name
			break
		}
		page.Secrets = append(page.Secrets, toSecretJSON(sc))
	}
	writeJSON(w, http.StatusOK, page)
	return nil
}

type deletedSecretJSON struct {
	Name     string `json:"name"`
	Deleted  bool   `json:"deleted"`
	Enforced bool   `json:"enforced"`
}

func (s secretsAPI) delete(w http.ResponseWriter, r *http.Request, c *call) error {
	svc, err := s.svc()
	if err != nil {
		return err
	}
	sc, err := svc.Delete(r.Context(), c.owner, r.PathValue("name"))
	return reply(w, sc, err, func(sc *secrets.Secret) deletedSecretJSON {
		return deletedSecretJSON{Name: sc.Name, Deleted: true, Enforced: true}
	})
}
