package emberbox

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"strconv"
	"time"
)

// EgressSecret is a credential sandboxes use without seeing it: they get
// Placeholder in the variable Env, and the server's egress gate puts the
// value into HTTPS requests to Hosts that Rules allow. The server never
// answers the value.
type EgressSecret struct {
	Name        string   `json:"name"`
	Env         string   `json:"env"`
	Placeholder string   `json:"placeholder"` // emberbox-secret-…
	Hosts       []string `json:"hosts"`       // names or *.domain patterns
	// Header, when set, is the header the value is put in, as Format with
	// {value} replaced; nil: the placeholder is replaced in the usual
	// credential headers (Authorization, X-Api-Key, ...).
	Header *string      `json:"header"`
	Format *string      `json:"format"`
	Rules  []EgressRule `json:"rules"` // none: every request to the hosts
	// Only names the sandboxes that get it; nil: every sandbox of the key.
	Only      *EgressScope `json:"only,omitempty"`
	Enforced  bool         `json:"enforced"`
	CreatedAt time.Time    `json:"createdAt"`
	UpdatedAt time.Time    `json:"updatedAt"`
}

// EgressRule allows the requests of its methods (every method when none)
// to its paths, each exact or a prefix ending in "/*".
type EgressRule struct {
	Methods []string `json:"methods,omitempty"`
	Paths   []string `json:"paths"`
}

// EgressScope names the sandboxes of the key that get a secret: those
// whose labels hold every pair of any one selector, and those named. The
// zero scope is every sandbox of the key.
type EgressScope struct {
	Labels    []map[string]string `json:"labels,omitempty"`
	Sandboxes []string            `json:"sandboxes,omitempty"`
}

// EgressSecretSpec is what SetEgressSecret stores.
type EgressSecretSpec struct {
	// Value is the credential: 1 to 8192 bytes of visible ASCII and spaces.
	Value  string       `json:"value"`
	Hosts  []string     `json:"hosts"`
	Header string       `json:"header,omitempty"`
	Format string       `json:"format,omitempty"` // e.g. "token {value}"; default "{value}"
	Rules  []EgressRule `json:"rules,omitempty"`
	// Only: nil keeps a replaced secret's scope (a new one: every sandbox).
	Only *EgressScope `json:"only,omitempty"`
	// Env is the variable sandboxes see the placeholder in; "": the name
	// (or a replaced secret's variable).
	Env string `json:"env,omitempty"`
}

// EgressSecretsPage is one page of the key's secrets, by name.
type EgressSecretsPage struct {
	Secrets []EgressSecret `json:"secrets"`
	// Next is the name to read the next page after; "" after the last.
	Next string `json:"-"`
}

// secretPath is the path of secret name, and what follows it.
func secretPath(name, suffix string) string {
	return "/v1/egress-secrets/" + url.PathEscape(name) + suffix
}

// putSecret puts body at secret name's path (and suffix) and answers the
// secret as it then is.
func (c *Client) putSecret(ctx context.Context, name, suffix string, body any) (*EgressSecret, error) {
	if name == "" {
		return nil, errors.New("emberbox: no secret name")
	}
	r, err := jsonRequest(http.MethodPut, secretPath(name, suffix), body)
	if err != nil {
		return nil, err
	}
	var sc EgressSecret
	if err := c.do(ctx, r, &sc); err != nil {
		return nil, err
	}
	return &sc, nil
}

// SetEgressSecret stores a secret, or replaces the one of that name (its
// placeholder stays, so running sandboxes keep working). The answer never
// holds the value. Sandboxes in scope get the placeholder within seconds.
func (c *Client) SetEgressSecret(ctx context.Context, name string, spec EgressSecretSpec) (*EgressSecret, error) {
	if spec.Value == "" {
		return nil, errors.New("emberbox: no secret value")
	}
	return c.putSecret(ctx, name, "", spec)
}

// ListEgressSecrets reads a page of the key's secrets by name: limit of
// them (0: the server's default, 100) after the name after ("" for the
// first page). No value is ever in it.
func (c *Client) ListEgressSecrets(ctx context.Context, limit int, after string) (*EgressSecretsPage, error) {
	q := url.Values{}
	if limit > 0 {
		q.Set("limit", strconv.Itoa(limit))
	}
	if after != "" {
		q.Set("after", after)
	}
	var page struct {
		Secrets []EgressSecret `json:"secrets"`
		Next    *string        `json:"next"`
	}
	if err := c.do(ctx, &request{method: http.MethodGet, path: "/v1/egress-secrets", query: q}, &page); err != nil {
		return nil, err
	}
	return &EgressSecretsPage{Secrets: page.Secrets, Next: deref(page.Next)}, nil
}

// ScopeEgressSecret says which sandboxes of the key get a secret; the zero
// scope is every one. It needs no value: a scope is not the credential.
func (c *Client) ScopeEgressSecret(ctx context.Context, name string, only EgressScope) (*EgressSecret, error) {
	return c.putSecret(ctx, name, "/sandboxes", only)
}

// NarrowEgressSecret replaces a secret's hosts, rules or both (nil: as
// they are) with narrower ones, without the value. Widening them takes the
// value again (SetEgressSecret); the server refuses it here with 400
// not_narrower.
func (c *Client) NarrowEgressSecret(ctx context.Context, name string, hosts []string, rules []EgressRule) (*EgressSecret, error) {
	if hosts == nil && rules == nil {
		return nil, errors.New("emberbox: narrowing a secret takes hosts, rules or both")
	}
	body := struct {
		Hosts []string     `json:"hosts,omitempty"`
		Rules []EgressRule `json:"rules,omitempty"`
	}{hosts, rules}
	return c.putSecret(ctx, name, "/rules", body)
}

// DeleteEgressSecret erases a secret: its placeholder stops working at
// once. One that is not there is a 404 (see IsNotFound).
func (c *Client) DeleteEgressSecret(ctx context.Context, name string) error {
	if name == "" {
		return errors.New("emberbox: no secret name")
	}
	return c.do(ctx, &request{method: http.MethodDelete, path: secretPath(name, "")}, nil)
}

// EgressCA is one of the CAs guests trust for egress secrets' hosts.
type EgressCA struct {
	ID          string     `json:"id"`          // SHA-256 fingerprint of the certificate, hex
	Certificate string     `json:"certificate"` // PEM
	NotAfter    time.Time  `json:"notAfter"`
	AddedAt     time.Time  `json:"addedAt"`
	RetireAt    *time.Time `json:"retireAt"` // nil for the newest
	Newest      bool       `json:"newest"`   // gates sign with it for every guest known to trust it
	// Guests counts the running sandboxes (of the node that answered)
	// known to trust it, and the others.
	Guests struct {
		Trusting int `json:"trusting"`
		NotKnown int `json:"notKnown"`
	} `json:"guests"`
}

// EgressCARotation is what RotateEgressCA did.
type EgressCARotation struct {
	New      EgressCA   `json:"new"`
	Previous []EgressCA `json:"previous"` // the CAs still trusted, until their RetireAt
}

// EgressCAs lists the egress CAs in force, oldest first (admin keys).
func (c *Client) EgressCAs(ctx context.Context) ([]EgressCA, error) {
	var out struct {
		CAs []EgressCA `json:"cas"`
	}
	if err := c.do(ctx, &request{method: http.MethodGet, path: "/v1/egress-ca"}, &out); err != nil {
		return nil, err
	}
	return out.CAs, nil
}

// RotateEgressCA makes a new egress CA (admin keys). Running guests hold it
// when the call returns, and gates sign with it for each guest known to
// trust it; the CAs in force before stay trusted for keep (0 retires them
// at once, as for a key that may have leaked; the server bounds it to 30
// days).
func (c *Client) RotateEgressCA(ctx context.Context, keep time.Duration) (*EgressCARotation, error) {
	if keep < 0 {
		return nil, errors.New("emberbox: a negative keep")
	}
	r, err := jsonRequest(http.MethodPost, "/v1/egress-ca:rotate", map[string]int64{"keepPreviousSeconds": int64(keep / time.Second)})
	if err != nil {
		return nil, err
	}
	var out EgressCARotation
	if err := c.do(ctx, r, &out); err != nil {
		return nil, err
	}
	return &out, nil
}
