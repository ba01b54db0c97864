package e2b

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/emberbox/emberbox/internal/api"
	"github.com/emberbox/emberbox/internal/errdefs"
	"github.com/emberbox/emberbox/internal/sandbox"
)

// Templates E2B's SDKs ask for, all served by the default image (which has
// the code interpreter).
var templates = map[string]bool{"base": true, "code-interpreter-v1": true, "code-interpreter": true}

// templateLabel records the template an E2B create named, shown as a label
// in the Runtime API too.
const templateLabel = "e2b.template"

const (
	clientID   = "emberbox"
	maxBody    = 1 << 20
	maxTimeout = sandbox.MaxTimeoutSeconds
	// E2B's defaults: 15 s for a v1 create, 300 s for a v2 create (which
	// e2b 2.x sends without a timeout unless the caller gives one).
	defaultTimeoutV1 = 15
	defaultTimeoutV2 = 300
	maxMetadata      = 32
	maxMetaLen       = 256
	maxEnvVars       = 32
	maxEnvBytes      = 32 << 10
)

var envNameRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

func (h *Handler) controlMux() *http.ServeMux {
	mux := http.NewServeMux()
	handle := func(pattern string, fn func(http.ResponseWriter, *http.Request, string)) {
		mux.HandleFunc(pattern, func(w http.ResponseWriter, r *http.Request) {
			k, err := h.authenticate(r)
			if err != nil {
				writeError(w, err)
				return
			}
			fn(w, r.WithContext(withGeneration(r.Context(), k.Generation)), k.ID)
		})
	}
	handle("POST /sandboxes", h.create)
	handle("POST /v2/sandboxes", h.create)
	handle("GET /sandboxes", h.listV1)
	handle("GET /v2/sandboxes", h.listV2)
	handle("GET /sandboxes/{id}", h.get)
	handle("DELETE /sandboxes/{id}", h.kill)
	handle("POST /sandboxes/{id}/timeout", h.setTimeout)
	handle("POST /sandboxes/{id}/refreshes", h.refresh)
	handle("POST /sandboxes/{id}/connect", h.connect)
	handle("POST /v2/sandboxes/{id}/connect", h.connect)
	handle("POST /sandboxes/{id}/pause", h.pause)
	handle("POST /sandboxes/{id}/resume", h.resume)
	handle("PUT /sandboxes/{id}/network", h.putNetwork)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		if _, err := h.authenticate(r); err != nil {
			writeError(w, err)
			return
		}
		writeError(w, newError(http.StatusNotImplemented,
			fmt.Sprintf("%s %s is not served by Emberbox's E2B API (see docs/e2b.md); the Runtime API under /v1/ may offer it", r.Method, r.URL.Path)))
	})
	return mux
}

// authenticate reads the key from X-API-KEY (or a bearer token) under the
// API's rate limits: an address that keeps failing is refused before its
// key is looked up, and the key's requests count against its bucket.
func (h *Handler) authenticate(r *http.Request) (api.Key, error) {
	if err := h.authBlocked(r); err != nil {
		return api.Key{}, err
	}
	k, err := h.checkKey(r)
	if err != nil {
		if ae := (*apiError)(nil); errors.As(err, &ae) && ae.Code == http.StatusUnauthorized {
			h.authFailed(r)
		}
		return api.Key{}, err
	}
	if err := h.allow(r, k.ID); err != nil {
		return api.Key{}, err
	}
	return k, nil
}

// checkKey authenticates the request's key.
func (h *Handler) checkKey(r *http.Request) (api.Key, error) {
	secret := r.Header.Get("X-API-Key")
	if secret == "" {
		if a, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); ok {
			secret = strings.TrimSpace(a)
		}
	}
	if secret == "" {
		return api.Key{}, newError(http.StatusUnauthorized, "missing API key: send it in the X-API-KEY header")
	}
	k, err := h.cfg.Keys.Authenticate(r.Context(), secret)
	if err != nil {
		if errdefs.IsNotFound(err) {
			return api.Key{}, newError(http.StatusUnauthorized, "invalid API key")
		}
		return api.Key{}, fmt.Errorf("authenticating an E2B request: %w", err)
	}
	return k, nil
}

type generationKey struct{}

// withGeneration records the generation of the caller's secret, which the
// tokens of its answers are bound to.
func withGeneration(ctx context.Context, g string) context.Context {
	return context.WithValue(ctx, generationKey{}, g)
}

func generationFrom(ctx context.Context) string {
	g, _ := ctx.Value(generationKey{}).(string)
	return g
}

func readBody(r *http.Request) ([]byte, error) {
	body, err := io.ReadAll(io.LimitReader(r.Body, maxBody+1))
	if err != nil {
		return nil, newError(http.StatusBadRequest, "reading the body: "+err.Error())
	}
	if len(body) > maxBody {
		return nil, newError(http.StatusRequestEntityTooLarge, "the body is larger than 1 MiB")
	}
	return body, nil
}

func unmarshal(body []byte, v any) error {
	if len(strings.TrimSpace(string(body))) == 0 {
		return nil
	}
	if err := json.Unmarshal(body, v); err != nil {
		return newError(http.StatusBadRequest, "invalid JSON body: "+err.Error())
	}
	return nil
}

func decode(r *http.Request, v any) error {
	body, err := readBody(r)
	if err != nil {
		return err
	}
	return unmarshal(body, v)
}

// newSandbox is E2B's NewSandbox (v1 and v2 create bodies). Fields E2B
// added that Emberbox cannot honour are refused when set, never ignored.
type newSandbox struct {
	TemplateID          string            `json:"templateID"`
	Timeout             *int              `json:"timeout"`
	AutoPause           bool              `json:"autoPause"`
	AutoResume          *autoResume       `json:"autoResume"`
	Secure              *bool             `json:"secure"`
	AllowInternetAccess *bool             `json:"allow_internet_access"`
	Network             *networkConfig    `json:"network"`
	Metadata            map[string]string `json:"metadata"`
	EnvVars             map[string]string `json:"envVars"`
	MCP                 json.RawMessage   `json:"mcp"`
	VolumeMounts        []json.RawMessage `json:"volumeMounts"`
	IAM                 json.RawMessage   `json:"iam"`
}

type autoResume struct {
	Enabled bool `json:"enabled"`
}

type networkConfig struct {
	AllowPublicTraffic *bool           `json:"allowPublicTraffic"`
	AllowOut           []string        `json:"allowOut"`
	DenyOut            []string        `json:"denyOut"`
	EgressProxy        json.RawMessage `json:"egressProxy"`
	MaskRequestHost    *string         `json:"maskRequestHost"`
	Rules              json.RawMessage `json:"rules"`
}

func isSet(raw json.RawMessage) bool {
	s := strings.TrimSpace(string(raw))
	return s != "" && s != "null" && s != "{}" && s != "[]"
}

func (n *newSandbox) spec(defaultTimeout int) (sandbox.CreateSpec, error) {
	bad := func(msg string) (sandbox.CreateSpec, error) {
		return sandbox.CreateSpec{}, newError(http.StatusBadRequest, msg)
	}
	tmpl := n.TemplateID
	if !templates[tmpl] {
		return sandbox.CreateSpec{}, newError(http.StatusNotFound,
			fmt.Sprintf("template %q not found: Emberbox serves the templates base and code-interpreter-v1 (its default image)", tmpl))
	}
	switch {
	case isSet(n.MCP):
		return bad("mcp is not supported by Emberbox")
	case len(n.VolumeMounts) > 0:
		return bad("volumeMounts are not supported by Emberbox yet")
	case isSet(n.IAM):
		return bad("iam is not supported by Emberbox")
	}
	if err := checkTimeout(n.Timeout); err != nil {
		return sandbox.CreateSpec{}, err
	}
	timeout := defaultTimeout
	if n.Timeout != nil {
		timeout = *n.Timeout
	}
	labels, err := n.labels()
	if err != nil {
		return sandbox.CreateSpec{}, err
	}
	if err := n.checkEnv(); err != nil {
		return sandbox.CreateSpec{}, err
	}
	spec := sandbox.CreateSpec{
		VCPU:           sandbox.DefaultVCPU,
		MemoryMiB:      sandbox.DefaultMemoryMiB,
		DiskMiB:        sandbox.DefaultDiskMiB,
		Labels:         labels,
		Env:            n.EnvVars,
		TimeoutSeconds: timeout,
		OnLeaseEnd:     sandbox.LeaseEndDelete,
	}
	if n.AutoPause {
		spec.OnLeaseEnd = sandbox.LeaseEndPause
	}
	if n.AutoResume != nil {
		v := n.AutoResume.Enabled
		spec.AutoWake = &v
	}
	pol, err := n.policy()
	if err != nil {
		return sandbox.CreateSpec{}, err
	}
	spec.Network = pol
	return spec, nil
}

// labels are the sandbox's labels: its metadata and the template it was
// created from.
func (n *newSandbox) labels() (map[string]string, error) {
	if len(n.Metadata) > maxMetadata-1 {
		return nil, newError(http.StatusBadRequest, fmt.Sprintf("metadata may have at most %d entries", maxMetadata-1))
	}
	labels := map[string]string{templateLabel: n.TemplateID}
	for k, v := range n.Metadata {
		if k == "" || len(k) > maxMetaLen || len(v) > maxMetaLen || strings.Contains(k, ":") || k == templateLabel {
			return nil, newError(http.StatusBadRequest,
				fmt.Sprintf("metadata key %q: keys must be 1 to 256 characters without ':', values at most 256", k))
		}
		labels[k] = v
	}
	return labels, nil
}

// checkEnv bounds the sandbox's environment: how many variables, their
// names, their size in all.
func (n *newSandbox) checkEnv() error {
	if len(n.EnvVars) > maxEnvVars {
		return newError(http.StatusBadRequest, fmt.Sprintf("envVars may have at most %d entries", maxEnvVars))
	}
	envBytes := 0
	for k, v := range n.EnvVars {
		if !envNameRE.MatchString(k) {
			return newError(http.StatusBadRequest, fmt.Sprintf("envVars: %q is not a variable name", k))
		}
		envBytes += len(k) + len(v)
	}
	if envBytes > maxEnvBytes {
		return newError(http.StatusBadRequest, "envVars are larger than 32 KiB")
	}
	return nil
}

func (h *Handler) create(w http.ResponseWriter, r *http.Request, owner string) {
	body, err := readBody(r)
	if err != nil {
		writeError(w, err)
		return
	}
	var req newSandbox
	if err := unmarshal(body, &req); err != nil {
		writeError(w, err)
		return
	}
	def := defaultTimeoutV1
	if strings.HasPrefix(r.URL.Path, "/v2/") {
		def = defaultTimeoutV2
	}
	spec, err := req.spec(def)
	if err != nil {
		writeError(w, err)
		return
	}
	h.createOnce(w, r, owner, body, func(key string) (string, error) {
		spec.IdempotencyKey = key
		sb, err := h.cfg.Manager.Create(r.Context(), owner, spec)
		if err != nil {
			return "", err
		}
		return sb.ID, nil
	})
}

// waitRunning waits until the sandbox runs: E2B's create and resume answer
// only then, and the SDK talks to envd at once.
func (h *Handler) waitRunning(ctx context.Context, owner, id string) (*sandbox.Sandbox, error) {
	ctx, cancel := context.WithTimeout(ctx, h.cfg.CreateWait)
	defer cancel()
	sb, err := h.cfg.Manager.WaitFor(ctx, owner, id, sandbox.StateRunning)
	if err != nil {
		return nil, err
	}
	if sb.State != sandbox.StateRunning {
		msg := fmt.Sprintf("sandbox %s did not start: it is %s", id, sb.State)
		if sb.StopReason != "" {
			msg += " (" + sb.StopReason + ")"
		}
		if ctx.Err() != nil {
			msg = fmt.Sprintf("sandbox %s is still %s after %s", id, sb.State, h.cfg.CreateWait)
		}
		return nil, newError(http.StatusInternalServerError, msg+"; see GET /v1/sandboxes/"+id+"/events")
	}
	return sb, nil
}

// sandboxJSON is E2B's Sandbox: what a create, connect or resume answers.
// Its tokens are bound to the generation of the caller's secret in ctx.
func (h *Handler) sandboxJSON(ctx context.Context, sb *sandbox.Sandbox) map[string]any {
	gen := generationFrom(ctx)
	tmpl := templateOf(sb)
	m := map[string]any{
		"sandboxID":          sb.ID,
		"templateID":         tmpl,
		"alias":              tmpl,
		"clientID":           clientID,
		"envdVersion":        h.cfg.EnvdVersion,
		"envdAccessToken":    h.cfg.Tokens.Make(purposeEnvd, sb.ID, sb.OwnerKeyID, gen),
		"trafficAccessToken": h.cfg.Tokens.Make(purposeTraffic, sb.ID, sb.OwnerKeyID, gen),
		"domain":             nil,
	}
	if h.cfg.Domain != "" {
		m["domain"] = h.cfg.Domain
	}
	return m
}

func templateOf(sb *sandbox.Sandbox) string {
	if t := sb.Labels[templateLabel]; t != "" {
		return t
	}
	return "base"
}

// e2bState is the state E2B knows a sandbox in; ok is false for a sandbox
// E2B would not show (stopped, deleted: E2B has no stopped state).
func e2bState(s sandbox.State) (string, bool) {
	switch s {
	case sandbox.StateStarting, sandbox.StateRunning:
		return "running", true
	case sandbox.StatePausing, sandbox.StatePaused, sandbox.StateResuming:
		return "paused", true
	}
	return "", false
}

func metadataOf(sb *sandbox.Sandbox) map[string]string {
	md := make(map[string]string, len(sb.Labels))
	for k, v := range sb.Labels {
		if k != templateLabel {
			md[k] = v
		}
	}
	return md
}

func (h *Handler) listedJSON(sb *sandbox.Sandbox, state string) map[string]any {
	started := sb.CreatedAt
	if sb.ReadyAt != nil {
		started = *sb.ReadyAt
	}
	end := time.Now().Add(time.Duration(sb.TimeoutSeconds) * time.Second)
	if sb.ExpiresAt != nil {
		end = *sb.ExpiresAt
	}
	tmpl := templateOf(sb)
	return map[string]any{
		"sandboxID":   sb.ID,
		"templateID":  tmpl,
		"alias":       tmpl,
		"clientID":    clientID,
		"startedAt":   started.UTC().Format(time.RFC3339Nano),
		"endAt":       end.UTC().Format(time.RFC3339Nano),
		"cpuCount":    sb.VCPU,
		"memoryMB":    sb.MemoryMiB,
		"diskSizeMB":  sb.DiskMiB,
		"metadata":    metadataOf(sb),
		"state":       state,
		"envdVersion": h.cfg.EnvdVersion,
	}
}

// lookup returns owner's sandbox as E2B sees it: one stopped or deleted
// is not found.
func (h *Handler) lookup(ctx context.Context, owner, id string) (*sandbox.Sandbox, string, error) {
	sb, err := h.cfg.Manager.Get(ctx, owner, id)
	if err != nil {
		if errdefs.IsNotFound(err) {
			return nil, "", newError(http.StatusNotFound, fmt.Sprintf("sandbox %q not found", id))
		}
		return nil, "", err
	}
	st, ok := e2bState(sb.State)
	if !ok {
		return nil, "", newError(http.StatusNotFound, fmt.Sprintf("sandbox %q not found: it is %s", id, sb.State))
	}
	return sb, st, nil
}

func (h *Handler) get(w http.ResponseWriter, r *http.Request, owner string) {
	sb, st, err := h.lookup(r.Context(), owner, r.PathValue("id"))
	if err != nil {
		writeError(w, err)
		return
	}
	m := h.listedJSON(sb, st)
	m["envdAccessToken"] = h.cfg.Tokens.Make(purposeEnvd, sb.ID, sb.OwnerKeyID, generationFrom(r.Context()))
	m["domain"] = nil
	if h.cfg.Domain != "" {
		m["domain"] = h.cfg.Domain
	}
	onTimeout := "kill"
	if sb.OnLeaseEnd == sandbox.LeaseEndPause {
		onTimeout = "pause"
	}
	m["lifecycle"] = map[string]any{"autoResume": sb.AutoWake, "onTimeout": onTimeout}
	writeJSON(w, http.StatusOK, m)
}

// listQuery reads E2B's metadata filter: a URL-encoded query string of
// key=value pairs, all of which must match.
func listQuery(q url.Values) (map[string]string, error) {
	raw := q.Get("metadata")
	if raw == "" {
		return nil, nil
	}
	vals, err := url.ParseQuery(raw)
	if err != nil {
		return nil, newError(http.StatusBadRequest, "metadata must be a URL-encoded query string")
	}
	md := make(map[string]string, len(vals))
	for k, v := range vals {
		if len(v) > 0 {
			md[k] = v[0]
		}
	}
	if len(md) > maxMetadata {
		return nil, newError(http.StatusBadRequest, "too many metadata filters")
	}
	return md, nil
}

func (h *Handler) listV1(w http.ResponseWriter, r *http.Request, owner string) {
	md, err := listQuery(r.URL.Query())
	if err != nil {
		writeError(w, err)
		return
	}
	out := []map[string]any{}
	cursor := ""
	for range 100 { // at most 10,000 sandboxes, 100 at a time
		sbs, next, err := h.cfg.Manager.List(r.Context(), sandbox.ListOptions{
			OwnerKeyID: owner, Labels: md, Limit: 100, Cursor: cursor,
			States: []sandbox.State{sandbox.StateStarting, sandbox.StateRunning},
		})
		if err != nil {
			writeError(w, err)
			return
		}
		for _, sb := range sbs {
			if st, ok := e2bState(sb.State); ok {
				out = append(out, h.listedJSON(sb, st))
			}
		}
		if next == "" {
			break
		}
		cursor = next
	}
	writeJSON(w, http.StatusOK, out)
}

func (h *Handler) listV2(w http.ResponseWriter, r *http.Request, owner string) {
	q := r.URL.Query()
	md, err := listQuery(q)
	if err != nil {
		writeError(w, err)
		return
	}
	states := []sandbox.State{sandbox.StateStarting, sandbox.StateRunning, sandbox.StatePausing, sandbox.StatePaused, sandbox.StateResuming}
	if s := q.Get("state"); s != "" {
		states = states[:0]
		for _, v := range strings.Split(s, ",") {
			switch v {
			case "running":
				states = append(states, sandbox.StateStarting, sandbox.StateRunning)
			case "paused":
				states = append(states, sandbox.StatePausing, sandbox.StatePaused, sandbox.StateResuming)
			default:
				writeError(w, newError(http.StatusBadRequest, fmt.Sprintf("state %q: must be running or paused", v)))
				return
			}
		}
	}
	limit := 100
	if l := q.Get("limit"); l != "" {
		n, err := strconv.Atoi(l)
		if err != nil || n < 1 || n > 100 {
			writeError(w, newError(http.StatusBadRequest, "limit must be between 1 and 100"))
			return
		}
		limit = n
	}
	sbs, next, err := h.cfg.Manager.List(r.Context(), sandbox.ListOptions{
		OwnerKeyID: owner, Labels: md, States: states, Limit: limit, Cursor: q.Get("nextToken"),
	})
	if err != nil {
		if errdefs.IsInvalidArgument(err) {
			err = newError(http.StatusBadRequest, "nextToken: "+err.Error())
		}
		writeError(w, err)
		return
	}
	out := make([]map[string]any, 0, len(sbs))
	for _, sb := range sbs {
		if st, ok := e2bState(sb.State); ok {
			out = append(out, h.listedJSON(sb, st))
		}
	}
	if next != "" {
		w.Header().Set("X-Next-Token", next)
	}
	writeJSON(w, http.StatusOK, out)
}

func (h *Handler) kill(w http.ResponseWriter, r *http.Request, owner string) {
	id := r.PathValue("id")
	sb, err := h.cfg.Manager.Get(r.Context(), owner, id)
	if err == nil && (sb.State == sandbox.StateDeleting || sb.State == sandbox.StateDeleted) {
		err = newError(http.StatusNotFound, fmt.Sprintf("sandbox %q not found", id))
	}
	if err == nil {
		_, err = h.cfg.Manager.Delete(r.Context(), owner, id)
	}
	if err != nil {
		if errdefs.IsNotFound(err) {
			err = newError(http.StatusNotFound, fmt.Sprintf("sandbox %q not found", id))
		}
		writeError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// checkTimeout checks a timeout in seconds, if given.
func checkTimeout(t *int) error {
	if t != nil && (*t < 1 || *t > maxTimeout) {
		return newError(http.StatusBadRequest, fmt.Sprintf("timeout must be between 1 and %d seconds", maxTimeout))
	}
	return nil
}

type timeoutBody struct {
	Timeout *int `json:"timeout"`
}

// setTimeout sets the sandbox to end timeout seconds from now, shorter or
// longer (E2B's semantics; Emberbox's own extend never shortens).
func (h *Handler) setTimeout(w http.ResponseWriter, r *http.Request, owner string) {
	var b timeoutBody
	if err := decode(r, &b); err != nil {
		writeError(w, err)
		return
	}
	if b.Timeout == nil {
		writeError(w, newError(http.StatusBadRequest, "timeout is required"))
		return
	}
	if err := checkTimeout(b.Timeout); err != nil {
		writeError(w, err)
		return
	}
	if err := h.retime(r.Context(), owner, r.PathValue("id"), *b.Timeout); err != nil {
		writeError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (h *Handler) retime(ctx context.Context, owner, id string, seconds int) error {
	if _, _, err := h.lookup(ctx, owner, id); err != nil {
		return err
	}
	_, err := h.cfg.Manager.Update(ctx, owner, id, sandbox.UpdateSpec{TimeoutSeconds: &seconds})
	return err
}

type refreshBody struct {
	Duration *int `json:"duration"`
}

// refresh is E2B's keep-alive: the sandbox lives duration seconds (default
// 60) from now, never less than it already would.
func (h *Handler) refresh(w http.ResponseWriter, r *http.Request, owner string) {
	var b refreshBody
	if err := decode(r, &b); err != nil {
		writeError(w, err)
		return
	}
	d := 60
	if b.Duration != nil {
		d = *b.Duration
	}
	if d < 1 || d > 3600 {
		writeError(w, newError(http.StatusBadRequest, "duration must be between 1 and 3600 seconds"))
		return
	}
	id := r.PathValue("id")
	if _, _, err := h.lookup(r.Context(), owner, id); err != nil {
		writeError(w, err)
		return
	}
	if _, err := h.cfg.Manager.Extend(r.Context(), owner, id, time.Duration(d)*time.Second); err != nil {
		writeError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

type connectBody struct {
	Timeout *int  `json:"timeout"`
	Memory  *bool `json:"memory"`
}

// connect answers a running sandbox (200) or resumes a paused one (201),
// setting its timeout when given.
func (h *Handler) connect(w http.ResponseWriter, r *http.Request, owner string) {
	var b connectBody
	if err := decode(r, &b); err != nil {
		writeError(w, err)
		return
	}
	if err := checkTimeout(b.Timeout); err != nil {
		writeError(w, err)
		return
	}
	if b.Memory != nil && !*b.Memory {
		writeError(w, newError(http.StatusBadRequest, "memory: false (a cold boot from disk) is not supported; Emberbox resumes with memory"))
		return
	}
	h.wakeOrAnswer(w, r, owner, b.Timeout, false)
}

type resumeBody struct {
	Timeout   *int `json:"timeout"`
	AutoPause bool `json:"autoPause"`
}

func (h *Handler) resume(w http.ResponseWriter, r *http.Request, owner string) {
	var b resumeBody
	if err := decode(r, &b); err != nil {
		writeError(w, err)
		return
	}
	if err := checkTimeout(b.Timeout); err != nil {
		writeError(w, err)
		return
	}
	if b.AutoPause {
		// E2B's resume sets what the next timeout does.
		pause := sandbox.LeaseEndPause
		if _, st, err := h.lookup(r.Context(), owner, r.PathValue("id")); err == nil && st == "paused" {
			if _, err := h.cfg.Manager.Update(r.Context(), owner, r.PathValue("id"), sandbox.UpdateSpec{OnLeaseEnd: &pause}); err != nil {
				writeError(w, err)
				return
			}
		} // else wakeOrAnswer gives the refusal

	}
	h.wakeOrAnswer(w, r, owner, b.Timeout, true)
}

// wakeOrAnswer resumes a paused sandbox and answers it running; a running
// one is answered as it is (or 409 when mustBePaused).
func (h *Handler) wakeOrAnswer(w http.ResponseWriter, r *http.Request, owner string, timeout *int, mustBePaused bool) {
	id := r.PathValue("id")
	sb, st, err := h.lookup(r.Context(), owner, id)
	if err != nil {
		writeError(w, err)
		return
	}
	status := http.StatusOK
	if st == "paused" {
		if sb, err = h.cfg.Manager.Wake(r.Context(), owner, id, timeout); err != nil && !errdefs.IsConflict(err) {
			writeError(w, err)
			return
		}
		status = http.StatusCreated
	} else {
		if mustBePaused {
			writeError(w, newError(http.StatusConflict, fmt.Sprintf("sandbox %q is already running", id)))
			return
		}
		if timeout != nil {
			if err := h.retime(r.Context(), owner, id, *timeout); err != nil {
				writeError(w, err)
				return
			}
		}
	}
	if sb, err = h.waitRunning(r.Context(), owner, id); err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, status, h.sandboxJSON(r.Context(), sb))
}

func (h *Handler) pause(w http.ResponseWriter, r *http.Request, owner string) {
	id := r.PathValue("id")
	_, st, err := h.lookup(r.Context(), owner, id)
	if err != nil {
		writeError(w, err)
		return
	}
	if st == "paused" {
		writeError(w, newError(http.StatusConflict, fmt.Sprintf("sandbox %q is already paused", id)))
		return
	}
	if _, err := h.cfg.Manager.Pause(r.Context(), owner, id); err != nil {
		writeError(w, err)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), h.cfg.CreateWait)
	defer cancel()
	sb, err := h.cfg.Manager.WaitFor(ctx, owner, id, sandbox.StatePaused)
	if err == nil && sb.State != sandbox.StatePaused {
		err = newError(http.StatusInternalServerError, fmt.Sprintf("sandbox %s did not pause: it is %s", id, sb.State))
	}
	if err != nil {
		writeError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}
