package api

import (
	"context"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/emberbox/emberbox/internal/errdefs"
	"github.com/emberbox/emberbox/internal/sandbox"
)

// PreviewManager keeps previews (sandbox.Previews): Config.Previews, or
// the Manager's own, found by type assertion. Without it the preview
// routes answer 503 previews_unavailable.
type PreviewManager interface {
	CreatePreview(ctx context.Context, owner, id string, spec sandbox.PreviewSpec) (*sandbox.Preview, error)
	ListPreviews(ctx context.Context, owner, id string) ([]*sandbox.Preview, error)
	GetPreview(ctx context.Context, owner, id string, port int) (*sandbox.Preview, error)
	DeletePreview(ctx context.Context, owner, id string, port int) (*sandbox.Preview, error)
	RotatePreview(ctx context.Context, owner, id string, port int) (*sandbox.Preview, error)
	// OpenPreview returns the live preview of port of sandbox id, of any
	// owner, for serving its host.
	OpenPreview(ctx context.Context, id string, port int) (*sandbox.Preview, error)
}

func (s *server) previewManager() (PreviewManager, error) {
	pm := s.mgr.Previews
	if pm == nil {
		pm, _ = s.mgr.Sandboxes.(PreviewManager)
	}
	if pm == nil {
		return nil, errdefs.New(errdefs.ErrUnavailable, "previews_unavailable", "this server keeps no previews")
	}
	return pm, nil
}

// previewRequest is the body of POST /v1/sandboxes/{id}/previews.
type previewRequest struct {
	Port         int       `json:"port"`
	Visibility   string    `json:"visibility,omitempty"`
	TTLSeconds   *int64    `json:"ttlSeconds,omitempty"`
	ExpiresAt    *string   `json:"expiresAt,omitempty"`
	EmbedOrigins *[]string `json:"embedOrigins,omitempty"`
}

// previewJSON is a preview as the API answers it. A private one carries a
// fresh token.
type previewJSON struct {
	ID             string     `json:"id"`
	SandboxID      string     `json:"sandboxId"`
	Port           int        `json:"port"`
	Visibility     string     `json:"visibility"`
	URL            string     `json:"url"`
	Token          *string    `json:"token"`
	URLWithToken   *string    `json:"urlWithToken"`
	TokenExpiresAt *time.Time `json:"tokenExpiresAt"`
	TokenHeader    string     `json:"tokenHeader"`
	ExpiresAt      *time.Time `json:"expiresAt"`
	EmbedOrigins   []string   `json:"embedOrigins"`
	CreatedAt      time.Time  `json:"createdAt"`
	UpdatedAt      time.Time  `json:"updatedAt"`
}

// Where a preview's token may be sent.
const (
	previewTokenHeader = "X-Runtime-Preview-Token"
	previewTokenQuery  = "runtime_preview_token"
	previewCookie      = "runtime_preview_token"
	// previewPrefix is where previews were served on the API's host.
	previewPrefix = "/preview/"
)

// previewURL is the address a preview is served at, on a host of its
// own under the preview domain.
func (s previewsAPI) previewURL(r *http.Request, p *sandbox.Preview) string {
	return s.previewDomain.url(p.SandboxID, p.Port, r.Host)
}

func (s previewsAPI) toPreviewJSON(r *http.Request, p *sandbox.Preview, tokenExp time.Time) previewJSON {
	out := previewJSON{
		ID: p.ID, SandboxID: p.SandboxID, Port: p.Port, Visibility: p.Visibility, URL: s.previewURL(r, p),
		TokenHeader: strings.ToLower(previewTokenHeader), ExpiresAt: utcPtr(p.ExpiresAt), EmbedOrigins: p.EmbedOrigins,
		CreatedAt: p.CreatedAt.UTC(), UpdatedAt: p.UpdatedAt.UTC(),
	}
	if out.EmbedOrigins == nil {
		out.EmbedOrigins = []string{}
	}
	if p.Visibility == sandbox.PreviewPrivate {
		tok := p.Token(tokenExp)
		withToken := out.URL + "?" + previewTokenQuery + "=" + url.QueryEscape(tok)
		exp := tokenExp.UTC()
		out.Token, out.URLWithToken, out.TokenExpiresAt = &tok, &withToken, &exp
	}
	return out
}

func utcPtr(t *time.Time) *time.Time {
	if t == nil {
		return nil
	}
	u := t.UTC()
	return &u
}

// portParam reads the {port} path value.
func portParam(r *http.Request) (int, error) {
	port, err := strconv.Atoi(r.PathValue("port"))
	if err != nil || port < 1 || port > 65535 {
		return 0, invalid([]issue{{Path: "port", Message: "must be 1 to 65535"}})
	}
	return port, nil
}

// tokenBounds reads a token's ttlSeconds and expiresAt.
func tokenBounds(ttl *int64, at *string) (time.Duration, *time.Time, []issue) {
	var d time.Duration
	var issues []issue
	if ttl != nil {
		if *ttl < int64(sandbox.MinPreviewTTL/time.Second) || *ttl > int64(sandbox.MaxPreviewTTL/time.Second) {
			issues = append(issues, issue{Path: "ttlSeconds", Message: "must be 60 to 604800"})
		} else {
			d = time.Duration(*ttl) * time.Second
		}
	}
	var t *time.Time
	if at != nil {
		parsed, err := time.Parse(time.RFC3339Nano, *at)
		if err != nil {
			issues = append(issues, issue{Path: "expiresAt", Message: "must be an RFC 3339 time"})
		} else {
			t = &parsed
		}
	}
	return d, t, issues
}

func (s previewsAPI) create(w http.ResponseWriter, r *http.Request, c *call) error {
	var req previewRequest
	if err := decode(c, &req); err != nil {
		return err
	}
	var issues []issue
	if req.Port < 1 || req.Port > 65535 {
		issues = append(issues, issue{Path: "port", Message: "must be 1 to 65535"})
	}
	if req.Visibility != "" && req.Visibility != sandbox.PreviewPrivate && req.Visibility != sandbox.PreviewPublic {
		issues = append(issues, issue{Path: "visibility", Message: "must be private or public"})
	}
	ttl, at, more := tokenBounds(req.TTLSeconds, req.ExpiresAt)
	issues = append(issues, more...)
	if req.EmbedOrigins != nil {
		if len(*req.EmbedOrigins) > sandbox.MaxEmbedOrigins {
			issues = append(issues, issue{Path: "embedOrigins", Message: "at most 16"})
		}
		for i, o := range *req.EmbedOrigins {
			if !validOrigin(o) {
				issues = append(issues, issue{Path: "embedOrigins." + strconv.Itoa(i), Message: "must be an origin such as https://app.example.com or https://*.example.com"})
			}
		}
	}
	if len(issues) > 0 {
		return invalid(issues)
	}
	pm, err := s.previewManager()
	if err != nil {
		return err
	}
	p, err := pm.CreatePreview(r.Context(), c.owner, r.PathValue("id"), sandbox.PreviewSpec{
		Port: req.Port, Visibility: req.Visibility, TTL: ttl, ExpiresAt: at, EmbedOrigins: req.EmbedOrigins})
	if err != nil {
		return err
	}
	return s.answerPreview(w, r, p, 0, nil)
}

// validOrigin accepts scheme://host[:port], the host possibly starting
// with "*.": it goes into a Content-Security-Policy header, so nothing
// else may pass.
func validOrigin(o string) bool {
	if len(o) > 253 {
		return false
	}
	rest, ok := strings.CutPrefix(o, "https://")
	if !ok {
		if rest, ok = strings.CutPrefix(o, "http://"); !ok {
			return false
		}
	}
	rest = strings.TrimPrefix(rest, "*.")
	if rest == "" {
		return false
	}
	for _, ch := range rest {
		if !(ch >= 'a' && ch <= 'z' || ch >= 'A' && ch <= 'Z' || ch >= '0' && ch <= '9' || ch == '.' || ch == '-' || ch == ':') {
			return false
		}
	}
	return true
}

func (s previewsAPI) answerPreview(w http.ResponseWriter, r *http.Request, p *sandbox.Preview, ttl time.Duration, at *time.Time) error {
	exp, err := p.TokenExpiry(s.now(), ttl, at)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, s.toPreviewJSON(r, p, exp))
	return nil
}

func (s previewsAPI) list(w http.ResponseWriter, r *http.Request, c *call) error {
	pm, err := s.previewManager()
	if err != nil {
		return err
	}
	ps, err := pm.ListPreviews(r.Context(), c.owner, r.PathValue("id"))
	if err != nil {
		return err
	}
	out := make([]previewJSON, 0, len(ps))
	for _, p := range ps {
		exp, err := p.TokenExpiry(s.now(), 0, nil)
		if err != nil {
			return err
		}
		out = append(out, s.toPreviewJSON(r, p, exp))
	}
	writeJSON(w, http.StatusOK, map[string]any{"data": out})
	return nil
}

func (s previewsAPI) get(w http.ResponseWriter, r *http.Request, c *call) error {
	port, err := portParam(r)
	if err != nil {
		return err
	}
	q := r.URL.Query()
	var ttlp *int64
	var atp *string
	if v := q.Get("ttlSeconds"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return invalid([]issue{{Path: "ttlSeconds", Message: "must be an integer"}})
		}
		ttlp = &n
	}
	if v := q.Get("expiresAt"); v != "" {
		atp = &v
	}
	ttl, at, issues := tokenBounds(ttlp, atp)
	if len(issues) > 0 {
		return invalid(issues)
	}
	pm, err := s.previewManager()
	if err != nil {
		return err
	}
	p, err := pm.GetPreview(r.Context(), c.owner, r.PathValue("id"), port)
	if err != nil {
		return err
	}
	return s.answerPreview(w, r, p, ttl, at)
}

func (s previewsAPI) rotate(w http.ResponseWriter, r *http.Request, c *call) error {
	port, err := portParam(r)
	if err != nil {
		return err
	}
	pm, err := s.previewManager()
	if err != nil {
		return err
	}
	p, err := pm.RotatePreview(r.Context(), c.owner, r.PathValue("id"), port)
	if err != nil {
		return err
	}
	return s.answerPreview(w, r, p, 0, nil)
}

func (s previewsAPI) delete(w http.ResponseWriter, r *http.Request, c *call) error {
	port, err := portParam(r)
	if err != nil {
		return err
	}
	pm, err := s.previewManager()
	if err != nil {
		return err
	}
	p, err := pm.DeletePreview(r.Context(), c.owner, r.PathValue("id"), port)
	if err != nil {
		return err
	}
	s.previewConns.closeAll(p.ID)
	writeJSON(w, http.StatusOK, map[string]any{"id": p.ID, "sandboxId": p.SandboxID, "port": p.Port, "deleted": true})
	return nil
}

// sharePort returns the preview of sandbox id's port, which it creates
// with spec (private unless spec says otherwise) if the port has none:
// what the browser, the desktop and the MCP gateway share their ports by.
func (s *server) sharePort(ctx context.Context, owner, id string, spec sandbox.PreviewSpec) (*sandbox.Preview, error) {
	pm, err := s.previewManager()
	if err != nil {
		return nil, err
	}
	p, err := pm.GetPreview(ctx, owner, id, spec.Port)
	if errdefs.IsNotFound(err) {
		if spec.Visibility == "" {
			spec.Visibility = sandbox.PreviewPrivate
		}
		p, err = pm.CreatePreview(ctx, owner, id, spec)
	}
	return p, err
}

// withToken is u with a fresh token of p as runtime_preview_token, and
// when that expires; a public preview's u as it is.
func (s *server) withToken(p *sandbox.Preview, u string) (string, *time.Time, error) {
	if p.Visibility == sandbox.PreviewPublic {
		return u, nil, nil
	}
	exp, err := p.TokenExpiry(s.now(), 0, nil)
	if err != nil {
		return "", nil, err
	}
	sep := "?"
	if strings.Contains(u, "?") {
		sep = "&"
	}
	return u + sep + previewTokenQuery + "=" + url.QueryEscape(p.Token(exp)), &exp, nil
}

// unsharePort deletes the preview of sandbox id's port, if it has one,
// and closes its connections: a shared port's URLs end with what served
// them.
func (s *server) unsharePort(ctx context.Context, owner, id string, port int) {
	pm, err := s.previewManager()
	if err != nil {
		return
	}
	if p, err := pm.DeletePreview(ctx, owner, id, port); err == nil {
		s.previewConns.closeAll(p.ID)
	}
}
