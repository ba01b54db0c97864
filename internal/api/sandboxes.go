package api

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/emberbox/emberbox/internal/errdefs"
	"github.com/emberbox/emberbox/internal/sandbox"
)

// jsonTime is a time in RFC 3339 UTC with milliseconds.
type jsonTime time.Time

const timeLayout = "2006-01-02T15:04:05.000Z07:00"

func (t jsonTime) MarshalJSON() ([]byte, error) {
	return []byte(`"` + time.Time(t).UTC().Format(timeLayout) + `"`), nil
}

func optTime(t *time.Time) *jsonTime {
	if t == nil || t.IsZero() {
		return nil
	}
	jt := jsonTime(*t)
	return &jt
}

func optString(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

// sandboxJSON is the wire form of a sandbox.
type sandboxJSON struct {
	ID             string            `json:"id"`
	Kind           string            `json:"kind"`
	Name           *string           `json:"name"`
	Labels         map[string]string `json:"labels"`
	Status         string            `json:"status"`
	State          string            `json:"state"`
	Region         string            `json:"region"`
	VCPU           int               `json:"vcpu"`
	MemoryMiB      int               `json:"memoryMiB"`
	DiskMiB        int               `json:"diskMiB"`
	CPU            string            `json:"cpu"`
	TimeoutSeconds int               `json:"timeoutSeconds"`
	OnLeaseEnd     string            `json:"onLeaseEnd"`
	Pausable       bool              `json:"pausable"`
	Persistent     bool              `json:"persistent"`
	AutoWake       bool              `json:"autoWake"`
	IdlePause      int               `json:"idlePauseSeconds"`
	PausedAt       *jsonTime         `json:"pausedAt"`
	SnapshotID     *string           `json:"snapshotId,omitempty"` // the snapshot it was made from
	ImageID        *string           `json:"imageId,omitempty"`    // its image; absent for the default image
	CreatedAt      *jsonTime         `json:"createdAt"`
	ReadyAt        *jsonTime         `json:"readyAt"`
	ExpiresAt      *jsonTime         `json:"expiresAt"`
	EndsAt         *jsonTime         `json:"endsAt"` // when it stops by itself: the lease end
	EndedAt        *jsonTime         `json:"endedAt"`
	StopReason     *string           `json:"stopReason"`
	EnvNames       []string          `json:"envNames"`
	Accel          *string           `json:"accel"`
	Driver         *string           `json:"driver"`
	Reused         bool              `json:"reused,omitempty"`     // getOrCreate found it
	OwnerKeyID     string            `json:"ownerKeyId,omitempty"` // in an admin's listing of other keys' sandboxes
	// ChargedMicros and Usage: what it has used and cost so far, in a
	// read or a listing (not in the answers of changes).
	ChargedMicros *string    `json:"chargedMicros,omitempty"`
	Usage         *usageJSON `json:"usage,omitempty"`
	// Start reports its image's start command, while the server
	// remembers it (not across restarts).
	Start *startJSON `json:"start,omitempty"`
	// Node is the node of a cluster that runs it (absent off a cluster).
	Node string `json:"node,omitempty"`
}

func (s *server) sandboxJSON(sb *sandbox.Sandbox) sandboxJSON {
	labels := sb.Labels
	if labels == nil {
		labels = map[string]string{}
	}
	env := sb.EnvNames
	if env == nil {
		env = []string{}
	}
	accel := sb.Accel
	if accel == "" && s.accel != nil {
		accel = s.accel()
	}
	var charged *string
	var usage *usageJSON
	if sb.Usage != nil {
		u := toUsageJSON(sb.Usage)
		charged, usage = &u.ChargedMicros, &u
	}
	return sandboxJSON{
		ID: sb.ID, Kind: "sandbox", Name: optString(sb.Name), Labels: labels,
		Status: sb.State.Status(), State: string(sb.State.Wire()), Region: "local",
		VCPU: sb.VCPU, MemoryMiB: sb.MemoryMiB, DiskMiB: sb.DiskMiB, CPU: "shared",
		TimeoutSeconds: sb.TimeoutSeconds, OnLeaseEnd: sb.OnLeaseEnd,
		Pausable: true, Persistent: sb.Persistent, AutoWake: sb.AutoWake, IdlePause: sb.IdlePauseSeconds,
		PausedAt: optTime(sb.PausedAt), SnapshotID: optString(sb.SnapshotID), ImageID: optString(sb.ImageID),
		CreatedAt: optTime(&sb.CreatedAt), ReadyAt: optTime(sb.ReadyAt),
		ExpiresAt: optTime(sb.ExpiresAt), EndsAt: optTime(sb.ExpiresAt), EndedAt: optTime(sb.EndedAt),
		StopReason: optString(sb.StopReason), EnvNames: env,
		Accel: optString(accel), Driver: optString(sb.Driver),
		ChargedMicros: charged, Usage: usage, Start: s.startReport(sb.ID), Node: sb.NodeID,
	}
}

// createRequest is the body of POST /v1/sandboxes. It names every field
// withruntime 0.35.0 may send (_CREATE_FIELDS), so none is refused as
// unknown; the ones this server cannot honour are refused by value instead.
type createRequest struct {
	Name           string            `json:"name"`
	Labels         map[string]string `json:"labels"`
	Env            map[string]string `json:"env"`
	VCPU           *int              `json:"vcpu"`
	MemoryMiB      *int              `json:"memoryMiB"`
	DiskMiB        *int              `json:"diskMiB"`
	TimeoutSeconds *int              `json:"timeoutSeconds"` // left out or 0: no time limit, idle pause instead
	OnLeaseEnd     string            `json:"onLeaseEnd"`
	GetOrCreate    bool              `json:"getOrCreate"`

	AutoWake         *bool  `json:"autoWake"`         // default true
	IdlePauseSeconds *int   `json:"idlePauseSeconds"` // default 300; 0: never
	Persistent       *bool  `json:"persistent"`       // no time limit, never idle-paused
	Snapshot         string `json:"snapshot"`         // a snapshot's id to start from

	// Accepted with the only values that mean something here.
	Region   string `json:"region"`   // "local"
	CPU      string `json:"cpu"`      // "shared"
	Pausable *bool  `json:"pausable"` // every sandbox here can pause
	User     string `json:"user"`     // "sandbox"

	// Accepted and ignored: no billing.
	Funding            string `json:"funding"`
	CPUFloorMillis     *int   `json:"cpuFloorMillis"`
	MaxTotalCostMicros *int64 `json:"maxTotalCostMicros"`
	MaxCostMicros      *int64 `json:"maxCostMicros"`

	Network json.RawMessage `json:"network"` // {internet, allow, deny}
	Image   json.RawMessage `json:"image"`   // an image id, name, name:tag or name@version

	// Known to the wire format, not available on this server.
	SpreadFrom json.RawMessage `json:"spreadFrom"`
	Volumes    json.RawMessage `json:"volumes"`
	Tailscale  json.RawMessage `json:"tailscale"`
	Secrets    json.RawMessage `json:"secrets"`

	noImages  bool // the server has no image catalog
	clustered bool // the server is a node of a cluster (spreadFrom)
}

// spreadIDs reads spreadFrom: an id or a list of them.
func spreadIDs(raw json.RawMessage) ([]string, bool) {
	var ids []string
	if json.Unmarshal(raw, &ids) == nil {
		return ids, true
	}
	var one string
	if json.Unmarshal(raw, &one) == nil && one != "" {
		return []string{one}, true
	}
	return nil, false
}

// unsupportedIssues lists fields set to something this server cannot do.
func (req *createRequest) unsupportedIssues() []issue {
	return append(req.unsupportedSettings(), req.unavailableFeatures()...)
}

// unsupportedSettings lists settings with a value this server does not
// offer.
func (req *createRequest) unsupportedSettings() []issue {
	var issues []issue
	no := func(path, msg string) { issues = append(issues, issue{Path: path, Message: msg}) }
	if req.Region != "" && req.Region != "local" {
		no("region", `must be "local" (the only region of this server)`)
	}
	if req.CPU != "" && req.CPU != "shared" {
		no("cpu", `must be "shared"`)
	}
	if req.Persistent != nil && *req.Persistent && req.TimeoutSeconds != nil && *req.TimeoutSeconds != 0 {
		no("timeoutSeconds", "a persistent sandbox has no time limit; leave it out")
	}
	if req.User != "" && req.User != "sandbox" {
		no("user", `must be "sandbox"`)
	}
	switch req.Funding {
	case "", "trial", "paid":
	default:
		no("funding", `must be "trial" or "paid"`)
	}
	if req.CPUFloorMillis != nil && *req.CPUFloorMillis < 0 {
		no("cpuFloorMillis", "must not be negative")
	}
	return issues
}

// unavailableFeatures lists features asked for that this server, as it
// is configured, does not have.
func (req *createRequest) unavailableFeatures() []issue {
	var issues []issue
	no := func(path, msg string) { issues = append(issues, issue{Path: path, Message: msg}) }
	for _, f := range []struct {
		path string
		raw  json.RawMessage
	}{{"secrets", req.Secrets}, {"tailscale", req.Tailscale}} {
		if len(f.raw) > 0 {
			no(f.path, "is not available on this server")
		}
	}
	if len(req.SpreadFrom) > 0 && string(req.SpreadFrom) != "null" {
		if !req.clustered {
			no("spreadFrom", "is not available on this server (a cluster of nodes spreads; this server is one)")
		} else if ids, ok := spreadIDs(req.SpreadFrom); !ok || len(ids) < 1 || len(ids) > 16 {
			no("spreadFrom", "must be one to 16 ids of your own sandboxes or snapshots")
		}
	}
	if req.noImages && len(req.Image) > 0 && string(req.Image) != "null" {
		no("image", "is not available on this server")
	}
	if req.GetOrCreate && req.Name == "" {
		no("getOrCreate", "needs a name")
	}
	return issues
}

// Limits of create requests beyond those in package sandbox.
const (
	maxVCPU      = 16
	minMemoryMiB = 128
	maxMemoryMiB = 65536
	minDiskMiB   = 3072
	maxDiskMiB   = 65536
	maxLabels    = 32
	maxLabelLen  = 256
	maxEnvVars   = 32
	maxEnvBytes  = 32 << 10
	maxNameLen   = 63
)

var (
	nameRE    = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9._-]*$`)
	envNameRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
)

func intIn(issues []issue, path string, v *int, lo, hi int) []issue {
	if v != nil && (*v < lo || *v > hi) {
		issues = append(issues, issue{Path: path, Message: fmt.Sprintf("must be from %d to %d", lo, hi)})
	}
	return issues
}

func orDefault(v *int, def int) int {
	if v == nil {
		return def
	}
	return *v
}

// nameIssues checks a sandbox's or snapshot's name ("" is none).
func nameIssues(name string) []issue {
	if name != "" && (len(name) > maxNameLen || !nameRE.MatchString(name)) {
		return []issue{{Path: "name", Message: "must be at most 63 characters of a-z A-Z 0-9 . _ -, starting with a letter or digit"}}
	}
	return nil
}

// labelIssues checks labels: count and sizes.
func labelIssues(labels map[string]string) []issue {
	var issues []issue
	if len(labels) > maxLabels {
		issues = append(issues, issue{Path: "labels", Message: fmt.Sprintf("must have at most %d labels", maxLabels)})
	}
	for k, v := range labels {
		if k == "" || len(k) > maxLabelLen || len(v) > maxLabelLen || strings.Contains(k, ":") {
			issues = append(issues, issue{Path: "labels." + k, Message: "keys must be 1 to 256 characters without ':' and values at most 256"})
		}
	}
	return issues
}

// spec validates a create request and fills in defaults.
func (req *createRequest) spec() (sandbox.CreateSpec, error) {
	issues := nameIssues(req.Name)
	issues = append(issues, labelIssues(req.Labels)...)
	issues = append(issues, envIssues("env", req.Env)...)
	issues = append(issues, req.unsupportedIssues()...)
	network, netIssues := parseNetwork(req.Network)
	issues = append(issues, netIssues...)
	mounts, volIssues := parseVolumeMounts(req.Volumes)
	issues = append(issues, volIssues...)
	issues = intIn(issues, "vcpu", req.VCPU, 1, maxVCPU)
	issues = intIn(issues, "memoryMiB", req.MemoryMiB, minMemoryMiB, maxMemoryMiB)
	issues = intIn(issues, "diskMiB", req.DiskMiB, minDiskMiB, maxDiskMiB)
	issues = timeLimitIssues(issues, "timeoutSeconds", req.TimeoutSeconds)
	if req.OnLeaseEnd != "" && !validLeaseEnd(req.OnLeaseEnd) {
		issues = append(issues, issue{Path: "onLeaseEnd", Message: `must be "pause", "stop" or "delete"`})
	}
	idle, idleIssues := idlePause("idlePauseSeconds", req.IdlePauseSeconds)
	issues = append(issues, idleIssues...)
	if req.Snapshot != "" && (req.VCPU != nil || req.MemoryMiB != nil || req.DiskMiB != nil) {
		issues = append(issues, issue{Path: "snapshot", Message: "a copy of a snapshot has the snapshot's shape; leave out vcpu, memoryMiB and diskMiB"})
	}
	if len(issues) > 0 {
		return sandbox.CreateSpec{}, invalid(sortIssues(issues))
	}
	onEnd := req.OnLeaseEnd
	if onEnd == "" {
		onEnd = sandbox.LeaseEndStop
	}
	persistent := req.Persistent != nil && *req.Persistent
	// A sandbox with no time limit pauses when idle instead, unless it is
	// persistent (withruntime: "a new sandbox has 300").
	idleSeconds := sandbox.DefaultIdlePauseSeconds
	if idle != nil {
		idleSeconds = *idle
	}
	if persistent {
		idleSeconds = 0
	}
	return sandbox.CreateSpec{
		Name: req.Name, Labels: req.Labels, Env: req.Env,
		VCPU:             orDefault(req.VCPU, sandbox.DefaultVCPU),
		MemoryMiB:        orDefault(req.MemoryMiB, sandbox.DefaultMemoryMiB),
		DiskMiB:          orDefault(req.DiskMiB, sandbox.DefaultDiskMiB),
		TimeoutSeconds:   orDefault(req.TimeoutSeconds, 0),
		OnLeaseEnd:       onEnd,
		AutoWake:         req.AutoWake,
		IdlePauseSeconds: idleSeconds,
		Persistent:       persistent,
		SnapshotID:       req.Snapshot,
		Network:          network,
		Volumes:          mounts,
	}, nil
}

// envIssues checks environment variables: names, count and total size.
func envIssues(path string, env map[string]string) []issue {
	var issues []issue
	if len(env) > maxEnvVars {
		issues = append(issues, issue{Path: path, Message: fmt.Sprintf("must have at most %d variables", maxEnvVars)})
	}
	size := 0
	for k, v := range env {
		size += len(k) + len(v) + 2
		if !envNameRE.MatchString(k) {
			issues = append(issues, issue{Path: path + "." + k, Message: "names must match [A-Za-z_][A-Za-z0-9_]*"})
		}
		if strings.IndexByte(v, 0) >= 0 {
			issues = append(issues, issue{Path: path + "." + k, Message: "values must not contain NUL"})
		}
	}
	if size > maxEnvBytes {
		issues = append(issues, issue{Path: path, Message: "must be at most 32 KiB in all"})
	}
	return issues
}

func sortIssues(issues []issue) []issue {
	// Stable order for callers and tests: by path.
	for i := 1; i < len(issues); i++ {
		for j := i; j > 0 && issues[j].Path < issues[j-1].Path; j-- {
			issues[j], issues[j-1] = issues[j-1], issues[j]
		}
	}
	return issues
}

// decode decodes the call's JSON body into dst, strictly.
func decode(c *call, dst any) error {
	if issues := decodeStrict(c.body, dst); len(issues) > 0 {
		return invalid(issues)
	}
	return nil
}

// preferWait returns the wait asked for with "Prefer: wait=N", capped.
func preferWait(r *http.Request) time.Duration {
	for _, h := range r.Header.Values("Prefer") {
		for _, pref := range strings.Split(h, ",") {
			name, val, ok := strings.Cut(strings.TrimSpace(pref), "=")
			if !ok || !strings.EqualFold(strings.TrimSpace(name), "wait") {
				continue
			}
			n, err := strconv.Atoi(strings.Trim(strings.TrimSpace(val), `"`))
			if err != nil || n <= 0 {
				return 0
			}
			return min(time.Duration(n)*time.Second, maxPreferWait)
		}
	}
	return 0
}

// settle waits up to d for the sandbox to reach state, returning it as it
// then is; sb is returned if the wait cannot tell.
func (s *server) settle(ctx context.Context, owner string, sb *sandbox.Sandbox, d time.Duration, state sandbox.State) (*sandbox.Sandbox, error) {
	if d <= 0 || sb.State == state || sb.State.Terminal() {
		return sb, nil
	}
	wctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	got, err := s.mgr.WaitFor(wctx, owner, sb.ID, state)
	if err != nil {
		if errdefs.IsNotFound(err) {
			return sb, nil
		}
		return nil, err
	}
	return got, nil
}

func (s sandboxesAPI) create(w http.ResponseWriter, r *http.Request, c *call) error {
	var req createRequest
	if err := decode(c, &req); err != nil {
		return err
	}
	req.noImages = s.images == nil
	req.clustered = s.nodes != nil
	spec, err := req.spec()
	if err != nil {
		return err
	}
	if req.clustered {
		if err := s.checkSpreadFrom(r, c.owner, req.SpreadFrom); err != nil {
			return err
		}
	}
	if len(req.Image) > 0 && string(req.Image) != "null" {
		if err := s.createImageSpec(r, c.owner, req.Image, &req, &spec); err != nil {
			return err
		}
	}
	if s.idem != nil {
		// Validated by idempotent, which runs this handler for a key.
		spec.IdempotencyKey = r.Header.Get("Idempotency-Key")
	}
	var sb *sandbox.Sandbox
	reused := false
	if req.GetOrCreate {
		// The sandbox that holds the name, ready to use: running as it is,
		// woken if paused, restarted if stopped and persistent. Two such
		// creates at once may both miss it; the manager's name_taken then
		// refuses the second.
		if sb, err = s.findForGetOrCreate(r.Context(), c.owner, spec.Name); err != nil {
			return err
		}
		reused = sb != nil
	}
	if sb == nil {
		if sb, err = s.mgr.Create(r.Context(), c.owner, spec); err != nil {
			return err
		}
	}
	if sb, err = s.settle(r.Context(), c.owner, sb, preferWait(r), sandbox.StateRunning); err != nil {
		return err
	}
	out := s.sandboxJSON(sb)
	out.Reused = reused
	writeJSON(w, http.StatusOK, out)
	return nil
}

// findForGetOrCreate returns owner's sandbox named name made ready to
// use, or nil when a new one must be created.
func (s sandboxesAPI) findForGetOrCreate(ctx context.Context, owner, name string) (*sandbox.Sandbox, error) {
	found, _, err := s.mgr.List(ctx, sandbox.ListOptions{OwnerKeyID: owner, Name: name, Limit: 1,
		States: []sandbox.State{sandbox.StateStarting, sandbox.StateRunning, sandbox.StatePausing,
			sandbox.StatePaused, sandbox.StateResuming, sandbox.StateStopped}})
	if err != nil || len(found) == 0 {
		return nil, err
	}
	sb := found[0]
	switch {
	case sb.State == sandbox.StatePaused || sb.State == sandbox.StatePausing:
		woken, err := s.mgr.Wake(ctx, owner, sb.ID, nil)
		if errdefs.Code(err) == "not_paused" {
			return s.mgr.Get(ctx, owner, sb.ID)
		}
		return woken, err
	case sb.State == sandbox.StateStopped && sb.Persistent:
		return s.mgr.Restart(ctx, owner, sb.ID)
	case sb.State == sandbox.StateStopped:
		return nil, nil
	}
	return sb, nil
}

var knownStates = map[sandbox.State]bool{
	sandbox.StateStarting: true, sandbox.StateRunning: true, sandbox.StatePausing: true,
	sandbox.StatePaused: true, sandbox.StateResuming: true, sandbox.StateStopping: true,
	sandbox.StateStopped: true, sandbox.StateDeleted: true,
}

func (s sandboxesAPI) get(w http.ResponseWriter, r *http.Request, c *call) error {
	id := r.PathValue("id")
	q := r.URL.Query()
	var issues []issue
	waitFor := sandbox.State(q.Get("waitFor"))
	if waitFor != "" && !knownStates[waitFor] {
		issues = append(issues, issue{Path: "waitFor", Message: "must be one of starting, running, pausing, paused, resuming, stopping, stopped, deleted"})
	}
	timeout := defaultWaitForState
	if v := q.Get("timeoutSeconds"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			issues = append(issues, issue{Path: "timeoutSeconds", Message: "must be a whole number of seconds"})
		}
		timeout = min(time.Duration(n)*time.Second, maxPreferWait)
	}
	if len(issues) > 0 {
		return invalid(issues)
	}
	sb, err := s.mgr.Get(r.Context(), c.owner, id)
	if err != nil {
		return err
	}
	if waitFor != "" {
		if sb, err = s.settle(r.Context(), c.owner, sb, timeout, waitFor); err != nil {
			return err
		}
	}
	if err := s.mgr.AttachUsage(r.Context(), sb); err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, s.sandboxJSON(sb))
	return nil
}

// dataJSON is a short list.
type dataJSON[T any] struct {
	Data []T `json:"data"`
}

// listJSON is a page of a list.
type listJSON[T any] struct {
	Data       []T     `json:"data"`
	NextCursor *string `json:"nextCursor"`
}

func (s sandboxesAPI) list(w http.ResponseWriter, r *http.Request, c *call) error {
	q := r.URL.Query()
	opts := sandbox.ListOptions{OwnerKeyID: c.owner, Name: q.Get("name"), Cursor: q.Get("cursor"), Limit: 50}
	var issues []issue
	for _, v := range q["state"] {
		for _, st := range strings.Split(v, ",") {
			if !knownStates[sandbox.State(st)] {
				issues = append(issues, issue{Path: "state", Message: fmt.Sprintf("%q is not a state", st)})
				continue
			}
			opts.States = append(opts.States, sandbox.State(st))
			if sandbox.State(st) == sandbox.StateStopping {
				// A sandbox being deleted shows as stopping.
				opts.States = append(opts.States, sandbox.StateDeleting)
			}
		}
	}
	for _, v := range q["label"] {
		k, val, ok := strings.Cut(v, ":")
		if !ok || k == "" {
			issues = append(issues, issue{Path: "label", Message: "must be key:value"})
			continue
		}
		if opts.Labels == nil {
			opts.Labels = map[string]string{}
		}
		opts.Labels[k] = val
	}
	// owner: an admin key may list another key's sandboxes, or every
	// key's ("all"); a tenant key only its own.
	if o := q.Get("owner"); o != "" && o != c.owner {
		if c.role != RoleAdmin {
			return errAdminOnly("owner")
		}
		opts.OwnerKeyID = o
		if o == "all" {
			opts.OwnerKeyID, opts.AllOwners = "", true
		}
	}
	var err error
	if opts.IncludeStopped, err = boolParam(q.Get("includeStopped")); err != nil {
		issues = append(issues, issue{Path: "includeStopped", Message: "must be true or false"})
	}
	opts.Limit = limitParam(q.Get("limit"), opts.Limit, &issues)
	if len(issues) > 0 {
		return invalid(issues)
	}
	sbs, next, err := s.mgr.List(r.Context(), opts)
	if err == nil {
		err = s.mgr.AttachUsage(r.Context(), sbs...)
	}
	if err != nil {
		return err
	}
	out := listJSON[sandboxJSON]{Data: make([]sandboxJSON, 0, len(sbs)), NextCursor: optString(next)}
	for _, sb := range sbs {
		j := s.sandboxJSON(sb)
		if opts.OwnerKeyID != c.owner {
			j.OwnerKeyID = sb.OwnerKeyID // an admin's listing says whose
		}
		out.Data = append(out.Data, j)
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

func boolParam(v string) (bool, error) {
	if v == "" {
		return false, nil
	}
	return strconv.ParseBool(v)
}

func (s sandboxesAPI) stop(w http.ResponseWriter, r *http.Request, c *call) error {
	if err := decode(c, &struct{}{}); err != nil {
		return err
	}
	sb, err := s.mgr.Stop(r.Context(), c.owner, r.PathValue("id"))
	return s.answerSettled(w, r, c, sb, err, sandbox.StateStopped)
}

type deletedJSON struct {
	ID        string    `json:"id"`
	Status    string    `json:"status"`
	State     string    `json:"state"`
	DeletedAt *jsonTime `json:"deletedAt"`
}

func (s sandboxesAPI) delete(w http.ResponseWriter, r *http.Request, c *call) error {
	if err := decode(c, &struct{}{}); err != nil {
		return err
	}
	sb, err := s.mgr.Delete(r.Context(), c.owner, r.PathValue("id"))
	if err != nil {
		return err
	}
	if sb, err = s.settle(r.Context(), c.owner, sb, preferWait(r), sandbox.StateDeleted); err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, deletedJSON{ID: sb.ID, Status: "deleted", State: string(sb.State.Wire()), DeletedAt: optTime(sb.DeletedAt)})
	return nil
}

type extendRequest struct {
	Seconds *int `json:"seconds"`
}

func (s sandboxesAPI) extend(w http.ResponseWriter, r *http.Request, c *call) error {
	var req extendRequest
	if err := decode(c, &req); err != nil {
		return err
	}
	maxSec := int(sandbox.MaxExtendAhead / time.Second)
	if req.Seconds == nil {
		return invalid([]issue{{Path: "seconds", Message: "is required"}})
	}
	if issues := intIn(nil, "seconds", req.Seconds, 1, maxSec); len(issues) > 0 {
		return invalid(issues)
	}
	sb, err := s.mgr.Extend(r.Context(), c.owner, r.PathValue("id"), time.Duration(*req.Seconds)*time.Second)
	return reply(w, sb, err, s.sandboxJSON)
}

func (s *server) health(w http.ResponseWriter, r *http.Request, c *call) error {
	out := map[string]any{"status": "ok", "version": s.version}
	if s.accel != nil {
		out["accel"] = s.accel()
	}
	if s.confine != nil {
		out["confinement"] = s.confine()
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// limitParam reads a listing's limit, 1..100 ("" keeps def), adding an
// issue if it is not one.
func limitParam(v string, def int, issues *[]issue) int {
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 || n > 100 {
		*issues = append(*issues, issue{Path: "limit", Message: "must be from 1 to 100"})
	}
	return n
}
