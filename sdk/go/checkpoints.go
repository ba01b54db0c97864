package emberbox

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"time"
)

// Checkpoint is a memory snapshot (memory, processes and disk) of one
// sandbox, as the server describes it. A sandbox can be rolled back to one
// of its checkpoints, or branched from one into new sandboxes.
type Checkpoint struct {
	ID        string  `json:"id"` // ckpt_…
	Kind      string  `json:"kind"`
	SandboxID string  `json:"sandboxId"`
	Label     *string `json:"label"`
	State     string  `json:"state"` // capturing|ready|failed
	SizeBytes int64   `json:"sizeBytes"`
	// BaseID: its memory is stored as what differs from that checkpoint's
	// (kept while this one exists); nil when it is whole.
	BaseID    *string    `json:"baseId"`
	CreatedAt time.Time  `json:"createdAt"`
	ReadyAt   *time.Time `json:"readyAt"`
	Error     *string    `json:"error"` // why it failed
	Shape     Shape      `json:"shape"`
}

// Shape is the size of the sandbox a checkpoint was taken of.
type Shape struct {
	VCPU      int `json:"vcpu"`
	MemoryMiB int `json:"memoryMiB"`
	DiskMiB   int `json:"diskMiB"`
}

// checkpointPath is the path of a sandbox's checkpoint cid ("" for the
// collection), and what follows it.
func checkpointPath(id, cid, suffix string) string {
	p := sandboxPath(id, "/checkpoints")
	if cid != "" {
		p += "/" + url.PathEscape(cid)
	}
	return p + suffix
}

func checkpointIDs(id, cid string) error {
	if id == "" {
		return errors.New("emberbox: no sandbox id")
	}
	if cid == "" {
		return errors.New("emberbox: no checkpoint id")
	}
	return nil
}

// Checkpoint takes a checkpoint of a sandbox, labelled label ("" for
// none; at most 63 bytes of UTF-8, no control characters), and answers once
// the capture is over. A paused sandbox is woken for it and paused again.
// The server deletes the oldest checkpoints beyond its per-sandbox cap
// (default 20); over the key's checkpoint byte quota it answers 409
// quota_exceeded. A capture that failed is returned with an *APIError whose
// code is checkpoint_failed.
func (c *Client) Checkpoint(ctx context.Context, id, label string) (*Checkpoint, error) {
	if id == "" {
		return nil, errors.New("emberbox: no sandbox id")
	}
	body := struct {
		Label string `json:"label,omitempty"`
	}{label}
	r, err := jsonRequest(http.MethodPost, checkpointPath(id, "", ""), body)
	if err != nil {
		return nil, err
	}
	var ck Checkpoint
	if err := c.do(ctx, r, &ck); err != nil {
		return nil, err
	}
	if ck.State == "failed" {
		msg := "Checkpoint " + ck.ID + " of sandbox " + id + " failed."
		if ck.Error != nil && *ck.Error != "" {
			msg = "Checkpoint " + ck.ID + " of sandbox " + id + " failed: " + *ck.Error
		}
		return &ck, &APIError{Code: "checkpoint_failed", Status: http.StatusConflict, Message: msg}
	}
	return &ck, nil
}

// Checkpoints lists a sandbox's checkpoints, oldest first.
func (c *Client) Checkpoints(ctx context.Context, id string) ([]Checkpoint, error) {
	if id == "" {
		return nil, errors.New("emberbox: no sandbox id")
	}
	var out struct {
		Checkpoints []Checkpoint `json:"checkpoints"`
	}
	if err := c.do(ctx, &request{method: http.MethodGet, path: checkpointPath(id, "", "")}, &out); err != nil {
		return nil, err
	}
	return out.Checkpoints, nil
}

// GetCheckpoint reads one checkpoint of a sandbox; one that is not there
// is a 404 checkpoint_not_found (see IsNotFound).
func (c *Client) GetCheckpoint(ctx context.Context, id, cid string) (*Checkpoint, error) {
	if err := checkpointIDs(id, cid); err != nil {
		return nil, err
	}
	var ck Checkpoint
	if err := c.do(ctx, &request{method: http.MethodGet, path: checkpointPath(id, cid, "")}, &ck); err != nil {
		return nil, err
	}
	return &ck, nil
}

// DeleteCheckpoint deletes a checkpoint of a sandbox. Deleting the sandbox
// deletes its checkpoints too.
func (c *Client) DeleteCheckpoint(ctx context.Context, id, cid string) error {
	if err := checkpointIDs(id, cid); err != nil {
		return err
	}
	return c.do(ctx, &request{method: http.MethodDelete, path: checkpointPath(id, cid, "")}, nil)
}

// RestoreCheckpoint rolls a sandbox back to one of its checkpoints and
// answers once it runs again in the checkpoint's state: the same id, and
// the processes and servers of that moment. With keep, the server first
// takes a checkpoint of the present state (labelled "before-restore"), so
// that later work is not lost.
func (c *Client) RestoreCheckpoint(ctx context.Context, id, cid string, keep bool) (*Sandbox, error) {
	if err := checkpointIDs(id, cid); err != nil {
		return nil, err
	}
	body := struct {
		Keep bool `json:"keep"`
	}{keep}
	r, err := jsonRequest(http.MethodPost, checkpointPath(id, cid, ":restore"), body)
	if err != nil {
		return nil, err
	}
	var sb Sandbox
	if err := c.do(ctx, r, &sb); err != nil {
		return nil, err
	}
	return &sb, nil
}

// BranchOptions say what sandboxes a branch makes.
type BranchOptions struct {
	Count  int               // 1..10; 0: one
	Name   string            // a name for the new sandboxes, as :fork takes it; "" for none
	Labels map[string]string // labels of the new sandboxes
}

// BranchCheckpoint makes new sandboxes that start from a checkpoint of a
// sandbox, as :fork does from its present state, and answers them once
// every one runs. The sandbox itself is left as it is.
func (c *Client) BranchCheckpoint(ctx context.Context, id, cid string, o BranchOptions) ([]Sandbox, error) {
	if err := checkpointIDs(id, cid); err != nil {
		return nil, err
	}
	body := struct {
		Count  int               `json:"count"`
		Name   string            `json:"name,omitempty"`
		Labels map[string]string `json:"labels,omitempty"`
	}{Count: o.Count, Name: o.Name, Labels: o.Labels}
	if body.Count == 0 {
		body.Count = 1
	}
	r, err := jsonRequest(http.MethodPost, checkpointPath(id, cid, ":branch"), body)
	if err != nil {
		return nil, err
	}
	var out struct {
		Sandboxes []Sandbox `json:"sandboxes"`
	}
	if err := c.do(ctx, r, &out); err != nil {
		return nil, err
	}
	return out.Sandboxes, nil
}
