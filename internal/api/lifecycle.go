package api

import (
	"net/http"
	"strings"

	"github.com/emberbox/emberbox/internal/sandbox"
)

// answerSettled answers a lifecycle call: its error, or sb once it reaches
// want within the caller's Prefer: wait.
func (s sandboxesAPI) answerSettled(w http.ResponseWriter, r *http.Request, c *call, sb *sandbox.Sandbox, err error, want sandbox.State) error {
	if err != nil {
		return err
	}
	if sb, err = s.settle(r.Context(), c.owner, sb, preferWait(r), want); err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, s.sandboxJSON(sb))
	return nil
}

// pause answers POST /v1/sandboxes/{id}:pause; with Prefer: wait it
// waits for paused.
func (s sandboxesAPI) pause(w http.ResponseWriter, r *http.Request, c *call) error {
	if err := decode(c, &struct{}{}); err != nil {
		return err
	}
	sb, err := s.mgr.Pause(r.Context(), c.owner, r.PathValue("id"))
	return s.answerSettled(w, r, c, sb, err, sandbox.StatePaused)
}

type wakeRequest struct {
	TimeoutSeconds *int `json:"timeoutSeconds"`
}

// wake answers POST /v1/sandboxes/{id}:wake; with Prefer: wait it
// waits for running.
func (s sandboxesAPI) wake(w http.ResponseWriter, r *http.Request, c *call) error {
	var req wakeRequest
	if err := decode(c, &req); err != nil {
		return err
	}
	if issues := timeLimitIssues(nil, "timeoutSeconds", req.TimeoutSeconds); len(issues) > 0 {
		return invalid(issues)
	}
	sb, err := s.mgr.Wake(r.Context(), c.owner, r.PathValue("id"), req.TimeoutSeconds)
	return s.answerSettled(w, r, c, sb, err, sandbox.StateRunning)
}

// restart answers POST /v1/sandboxes/{id}:restart.
func (s sandboxesAPI) restart(w http.ResponseWriter, r *http.Request, c *call) error {
	if err := decode(c, &struct{}{}); err != nil {
		return err
	}
	sb, err := s.mgr.Restart(r.Context(), c.owner, r.PathValue("id"))
	return s.answerSettled(w, r, c, sb, err, sandbox.StateRunning)
}

// updateRequest is the body of POST /v1/sandboxes/{id}:update, as
// withruntime's Sandbox.update sends it (its keyword arguments in camel
// case). A field left out, or null, stays as it is.
type updateRequest struct {
	Name             *string            `json:"name"`
	Labels           map[string]string  `json:"labels"`
	Env              map[string]*string `json:"env"`
	AutoWake         *bool              `json:"autoWake"`
	User             *string            `json:"user"`
	IdlePauseSeconds *int               `json:"idlePauseSeconds"`
	Persistent       *bool              `json:"persistent"`
	TimeoutSeconds   *int               `json:"timeoutSeconds"`
	OnTimeout        *string            `json:"onTimeout"`
	OnLeaseEnd       *string            `json:"onLeaseEnd"` // the create's name for onTimeout

	// Accepted and ignored: no billing.
	MaxTotalCostMicros *int64 `json:"maxTotalCostMicros"`
}

func (req *updateRequest) spec() (sandbox.UpdateSpec, error) {
	var issues []issue
	if req.Name != nil {
		issues = append(issues, nameIssues(*req.Name)...)
	}
	issues = append(issues, labelIssues(req.Labels)...)
	env := map[string]string{}
	for k, v := range req.Env {
		if v != nil {
			env[k] = *v
		} else {
			env[k] = ""
		}
	}
	issues = append(issues, envIssues("env", env)...)
	if req.User != nil && *req.User != "sandbox" {
		issues = append(issues, issue{Path: "user", Message: `must be "sandbox"`})
	}
	idle, idleIssues := idlePause("idlePauseSeconds", req.IdlePauseSeconds)
	issues = append(issues, idleIssues...)
	issues = timeLimitIssues(issues, "timeoutSeconds", req.TimeoutSeconds)
	onEnd := req.OnTimeout
	if onEnd == nil {
		onEnd = req.OnLeaseEnd
	}
	if onEnd != nil && !validLeaseEnd(*onEnd) {
		issues = append(issues, issue{Path: "onTimeout", Message: `must be "pause", "stop" or "delete"`})
	}
	if len(issues) > 0 {
		return sandbox.UpdateSpec{}, invalid(sortIssues(issues))
	}
	return sandbox.UpdateSpec{Name: req.Name, Labels: req.Labels, Env: req.Env, AutoWake: req.AutoWake,
		IdlePauseSeconds: idle, Persistent: req.Persistent, TimeoutSeconds: req.TimeoutSeconds, OnLeaseEnd: onEnd}, nil
}

// update answers POST /v1/sandboxes/{id}:update.
func (s sandboxesAPI) update(w http.ResponseWriter, r *http.Request, c *call) error {
	var req updateRequest
	if err := decode(c, &req); err != nil {
		return err
	}
	u, err := req.spec()
	if err != nil {
		return err
	}
	sb, err := s.mgr.Update(r.Context(), c.owner, r.PathValue("id"), u)
	return reply(w, sb, err, s.sandboxJSON)
}

func validLeaseEnd(v string) bool {
	return v == sandbox.LeaseEndStop || v == sandbox.LeaseEndDelete || v == sandbox.LeaseEndPause
}

// timeLimitIssues checks a time limit: 0 (none) or within the API's range.
func timeLimitIssues(issues []issue, path string, v *int) []issue {
	if v != nil && *v != 0 {
		return intIn(issues, path, v, sandbox.MinTimeoutSeconds, sandbox.MaxTimeoutSeconds)
	}
	return issues
}

// idlePause checks an idle pause: 0 (never) or up to a day, a shorter one
// than the minimum raised to it, as withruntime documents.
func idlePause(path string, v *int) (*int, []issue) {
	if v == nil {
		return nil, nil
	}
	if *v < 0 || *v > sandbox.MaxIdlePauseSeconds {
		return nil, []issue{{Path: path, Message: "must be 0 (never) or from 60 to 86400"}}
	}
	n := *v
	if n > 0 && n < sandbox.MinIdlePauseSeconds {
		n = sandbox.MinIdlePauseSeconds
	}
	return &n, nil
}

// switchImageRequest is the body of POST /v1/sandboxes/{id}:switch-image,
// as withruntime's Sandbox.switch_image sends it.
type switchImageRequest struct {
	Image string  `json:"image"`
	Keep  *string `json:"keep"`
}

// switchImage answers POST /v1/sandboxes/{id}:switch-image once the
// sandbox runs on the new image, or with switch_undone once it runs on its
// old one again. Images are off in a cluster, and so is this.
func (s sandboxesAPI) switchImage(w http.ResponseWriter, r *http.Request, c *call) error {
	var req switchImageRequest
	if err := decode(c, &req); err != nil {
		return err
	}
	var issues []issue
	if strings.TrimSpace(req.Image) == "" {
		issues = append(issues, issue{Path: "image", Message: "must be an image id, name, name:tag or name@version"})
	}
	if req.Keep != nil && *req.Keep != sandbox.SwitchKeepWorkspace {
		issues = append(issues, issue{Path: "keep", Message: `must be "workspace", the only thing a switch keeps besides volumes, env, name and previews`})
	}
	if len(issues) > 0 {
		return invalid(issues)
	}
	id := r.PathValue("id")
	if _, err := s.mgr.Get(r.Context(), c.owner, id); err != nil {
		return err
	}
	svc, err := s.imagesOn()
	if err != nil {
		return err
	}
	ref, _, err := svc.ForCreate(r.Context(), c.owner, req.Image)
	if err != nil {
		return err
	}
	sb, err := s.mgr.SwitchImage(r.Context(), c.owner, id, ref)
	return reply(w, sb, err, s.sandboxJSON)
}
