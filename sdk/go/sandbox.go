package emberbox

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"strconv"
	"time"
)

// Sandbox is a sandbox as the server describes it.
type Sandbox struct {
	ID               string            `json:"id"`
	Name             *string           `json:"name"`
	Labels           map[string]string `json:"labels"`
	State            string            `json:"state"` // starting|running|pausing|paused|resuming|stopping|stopped|deleted
	VCPU             int               `json:"vcpu"`
	MemoryMiB        int               `json:"memoryMiB"`
	DiskMiB          int               `json:"diskMiB"`
	TimeoutSeconds   int               `json:"timeoutSeconds"`
	OnLeaseEnd       string            `json:"onLeaseEnd"`
	Persistent       bool              `json:"persistent"`
	AutoWake         bool              `json:"autoWake"`
	IdlePauseSeconds int               `json:"idlePauseSeconds"`
	EnvNames         []string          `json:"envNames"`
	CreatedAt        *time.Time        `json:"createdAt"`
	ReadyAt          *time.Time        `json:"readyAt"`
	PausedAt         *time.Time        `json:"pausedAt"`
	EndsAt           *time.Time        `json:"endsAt"` // when the lease ends, if it has one
	EndedAt          *time.Time        `json:"endedAt"`
	StopReason       *string           `json:"stopReason"`
	OwnerKeyID       string            `json:"ownerKeyId,omitempty"`
}

// Terminal states: a sandbox in one never runs again by itself.
func finished(state string) bool {
	switch state {
	case "stopped", "deleted", "failed", "error":
		return true
	}
	return false
}

// CreateRequest is what a new sandbox is to be. Zero fields take the
// server's defaults.
type CreateRequest struct {
	Name      string            `json:"name,omitempty"`
	Labels    map[string]string `json:"labels,omitempty"`
	Env       map[string]string `json:"env,omitempty"`
	VCPU      int               `json:"vcpu,omitempty"`
	MemoryMiB int               `json:"memoryMiB,omitempty"`
	DiskMiB   int               `json:"diskMiB,omitempty"`
	// TimeoutSeconds is the lease; nil or 0: no time limit (idle pause).
	TimeoutSeconds *int   `json:"timeoutSeconds,omitempty"`
	OnLeaseEnd     string `json:"onLeaseEnd,omitempty"` // "stop" or "delete"
	Persistent     *bool  `json:"persistent,omitempty"`
	Snapshot       string `json:"snapshot,omitempty"` // a snapshot's id to start from

	// IdempotencyKey makes a repeated create answer the same sandbox;
	// default a fresh key, kept across the client's own retries.
	IdempotencyKey string `json:"-"`
}

// createWait is how long one create call asks the server to wait for
// running (Prefer: wait).
const createWait = 60

// Create makes a sandbox and waits until it runs (or ctx ends).
func (c *Client) Create(ctx context.Context, cr CreateRequest) (*Sandbox, error) {
	r, err := jsonRequest(http.MethodPost, "/v1/sandboxes", cr)
	if err != nil {
		return nil, err
	}
	r.idemKey = cr.IdempotencyKey
	r.header = http.Header{"Prefer": {"wait=" + strconv.Itoa(createWait)}}
	var sb Sandbox
	if err := c.do(ctx, r, &sb); err != nil {
		return nil, err
	}
	if sb.State == "running" {
		return &sb, nil
	}
	return c.WaitFor(ctx, sb.ID, "running")
}

// Get reads a sandbox.
func (c *Client) Get(ctx context.Context, id string) (*Sandbox, error) {
	if id == "" {
		return nil, errors.New("emberbox: no sandbox id")
	}
	var sb Sandbox
	if err := c.do(ctx, &request{method: http.MethodGet, path: sandboxPath(id, "")}, &sb); err != nil {
		return nil, err
	}
	return &sb, nil
}

// WaitFor waits until the sandbox is in state, asking the server to wait
// up to a minute at a time. It fails when the sandbox ends in another
// finished state.
func (c *Client) WaitFor(ctx context.Context, id, state string) (*Sandbox, error) {
	if id == "" {
		return nil, errors.New("emberbox: no sandbox id")
	}
	for {
		var sb Sandbox
		r := &request{method: http.MethodGet, path: sandboxPath(id, ""),
			query: url.Values{"waitFor": {state}, "timeoutSeconds": {"60"}}}
		if err := c.do(ctx, r, &sb); err != nil {
			return nil, err
		}
		switch {
		case sb.State == state:
			return &sb, nil
		case finished(sb.State):
			return &sb, &APIError{Code: "sandbox_" + sb.State, Status: http.StatusConflict,
				Message: "Sandbox " + id + " is " + sb.State + ", not " + state + "."}
		}
		if err := ctx.Err(); err != nil {
			return nil, err
		}
	}
}

// ListOptions filter a listing.
type ListOptions struct {
	States         []string
	Name           string
	Labels         map[string]string // all must match
	IncludeStopped bool
	Owner          string // admin keys: another key's id, or "all"
	Limit          int    // at most this many; 0: all
}

// List returns the sandboxes that match, reading every page.
func (c *Client) List(ctx context.Context, o ListOptions) ([]Sandbox, error) {
	q := url.Values{}
	for _, s := range o.States {
		q.Add("state", s)
	}
	for k, v := range o.Labels {
		q.Add("label", k+":"+v)
	}
	if o.Name != "" {
		q.Set("name", o.Name)
	}
	if o.IncludeStopped {
		q.Set("includeStopped", "true")
	}
	if o.Owner != "" {
		q.Set("owner", o.Owner)
	}
	q.Set("limit", "100")
	if o.Limit > 0 && o.Limit < 100 {
		q.Set("limit", strconv.Itoa(o.Limit))
	}
	var out []Sandbox
	for {
		var page struct {
			Data       []Sandbox `json:"data"`
			NextCursor *string   `json:"nextCursor"`
		}
		if err := c.do(ctx, &request{method: http.MethodGet, path: "/v1/sandboxes", query: q}, &page); err != nil {
			return nil, err
		}
		out = append(out, page.Data...)
		if o.Limit > 0 && len(out) >= o.Limit {
			return out[:o.Limit], nil
		}
		if page.NextCursor == nil || *page.NextCursor == "" || len(page.Data) == 0 {
			return out, nil
		}
		q.Set("cursor", *page.NextCursor)
	}
}

// lifecycle posts a colon verb, waiting for its end state when wait is set.
func (c *Client) lifecycle(ctx context.Context, id, verb string, body any, wait bool) (*Sandbox, error) {
	if id == "" {
		return nil, errors.New("emberbox: no sandbox id")
	}
	if body == nil {
		body = struct{}{}
	}
	r, err := jsonRequest(http.MethodPost, sandboxPath(id, ":"+verb), body)
	if err != nil {
		return nil, err
	}
	if wait {
		r.header = http.Header{"Prefer": {"wait=60"}}
	}
	var sb Sandbox
	if err := c.do(ctx, r, &sb); err != nil {
		return nil, err
	}
	return &sb, nil
}

// Stop stops a sandbox; with wait, the answer comes once it has stopped
// (or after a minute). Its disk is kept until it is deleted.
func (c *Client) Stop(ctx context.Context, id string, wait bool) (*Sandbox, error) {
	return c.lifecycle(ctx, id, "stop", nil, wait)
}

// Pause saves the sandbox's memory and disk and frees its CPU and memory.
func (c *Client) Pause(ctx context.Context, id string, wait bool) (*Sandbox, error) {
	return c.lifecycle(ctx, id, "pause", nil, wait)
}

// Wake resumes a paused sandbox. timeoutSeconds > 0 gives it a new lease.
func (c *Client) Wake(ctx context.Context, id string, timeoutSeconds int, wait bool) (*Sandbox, error) {
	var body struct {
		TimeoutSeconds *int `json:"timeoutSeconds,omitempty"`
	}
	if timeoutSeconds > 0 {
		body.TimeoutSeconds = &timeoutSeconds
	}
	return c.lifecycle(ctx, id, "wake", body, wait)
}

// Delete deletes a sandbox and its disk. Deleting it again is no error.
func (c *Client) Delete(ctx context.Context, id string) error {
	if id == "" {
		return errors.New("emberbox: no sandbox id")
	}
	return c.do(ctx, &request{method: http.MethodDelete, path: sandboxPath(id, "")}, nil)
}
