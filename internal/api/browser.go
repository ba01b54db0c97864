package api

import (
	"context"
	"net/http"
	"strings"
	"time"

	"github.com/emberbox/emberbox/internal/computer"
	"github.com/emberbox/emberbox/internal/guest"
	"github.com/emberbox/emberbox/internal/sandbox"
)

// A sandbox's browser (withruntime's sbx.browser): Chromium in the guest,
// driven over CDP (computer.Service). Its cdpUrl is on the private preview
// of port 9222, an origin of its own: the WebSocket goes through the
// preview proxy and the guest stream, authenticated by the preview's
// token, revoked by :stop (which deletes the preview) or the preview's
// :rotate.

// browserRequest is the body of POST …/browser:start.
type browserRequest struct {
	Headless *bool `json:"headless"` // default true
	Width    int   `json:"width"`
	Height   int   `json:"height"`
}

// browserJSON is a sandbox's browser as the API answers it.
type browserJSON struct {
	SandboxID string `json:"sandboxId"`
	State     string `json:"state"` // running, stopped
	Running   bool   `json:"running"`
	// CDPURL is the browser's DevTools WebSocket, with a token; null
	// when it does not run or does not answer yet.
	CDPURL         *string    `json:"cdpUrl"`
	TokenExpiresAt *time.Time `json:"tokenExpiresAt"`
	// LocalURL is where processes of the sandbox reach it.
	LocalURL  string     `json:"localUrl"`
	Headless  bool       `json:"headless"`
	Width     int        `json:"width"`
	Height    int        `json:"height"`
	Version   string     `json:"version"`
	StartedAt *time.Time `json:"startedAt"`
	// StreamURL is the desktop's live view; null: no desktop.
	StreamURL *string `json:"streamUrl"`
}

// browserGuest is guest for the browser's routes, which a server built
// without computer use refuses.
func (s browserAPI) browserGuest(r *http.Request, c *call) (*sandbox.Sandbox, guest.Handle, error) {
	sb, g, err := s.guest(r, c)
	if err != nil {
		return nil, guest.Handle{}, err
	}
	if s.computer == nil {
		return nil, guest.Handle{}, newError(http.StatusNotImplemented, "browser_unavailable", "This server runs no browsers.")
	}
	return sb, g, nil
}

func (s browserAPI) start(w http.ResponseWriter, r *http.Request, c *call) error {
	var body browserRequest
	if err := decode(c, &body); err != nil {
		return err
	}
	opt := computer.BrowserOptions{Headless: body.Headless == nil || *body.Headless, Width: body.Width, Height: body.Height}
	if _, err := opt.Check(); err != nil {
		return err
	}
	sb, g, err := s.browserGuest(r, c)
	if err != nil {
		return err
	}
	b, err := s.computer.StartBrowser(r.Context(), sb.ID, g, opt)
	if err != nil {
		return err
	}
	return s.answer(w, r, c, sb, b)
}

func (s browserAPI) get(w http.ResponseWriter, r *http.Request, c *call) error {
	sb, g, err := s.browserGuest(r, c)
	if err != nil {
		return err
	}
	b, err := s.computer.GetBrowser(r.Context(), g)
	if err != nil {
		return err
	}
	return s.answer(w, r, c, sb, b)
}

func (s browserAPI) stop(w http.ResponseWriter, r *http.Request, c *call) error {
	sb, g, err := s.browserGuest(r, c)
	if err != nil {
		return err
	}
	stopped, err := s.computer.StopBrowser(r.Context(), sb.ID, g)
	if err != nil {
		return err
	}
	// Its URLs end with it.
	s.unsharePort(r.Context(), c.owner, sb.ID, computer.CDPPort)
	writeJSON(w, http.StatusOK, map[string]any{"sandboxId": sb.ID, "stopped": stopped})
	return nil
}

// answer writes b, with a fresh cdpUrl when it answers.
func (s browserAPI) answer(w http.ResponseWriter, r *http.Request, c *call, sb *sandbox.Sandbox, b *computer.Browser) error {
	out := browserJSON{SandboxID: sb.ID, State: "stopped", Running: b.Running,
		LocalURL: "http://127.0.0.1:9222", Headless: b.Headless, Width: b.Width, Height: b.Height, Version: b.Version}
	if b.Running {
		out.State = "running"
		at := b.StartedAt.UTC()
		out.StartedAt = &at
	}
	if b.Running && b.DebuggerPath != "" {
		u, exp, err := s.cdpURL(r.Context(), r.Host, c.owner, sb.ID, b.DebuggerPath)
		if err != nil {
			return err
		}
		out.CDPURL, out.TokenExpiresAt = &u, exp
	}
	if b.Running && !b.Headless {
		// Its window is on the desktop, whose live view shows it.
		u, _, err := s.streamURL(r, c.owner, sb.ID)
		if err != nil {
			return err
		}
		out.StreamURL = &u
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// cdpURL is the address of the DevTools path of sandbox id's browser on
// the preview of its port, which it shares privately if it does not yet.
func (s browserAPI) cdpURL(ctx context.Context, reqHost, owner, id, path string) (string, *time.Time, error) {
	p, err := s.sharePort(ctx, owner, id, sandbox.PreviewSpec{Port: computer.CDPPort})
	if err != nil {
		return "", nil, err
	}
	u := s.previewDomain.url(id, computer.CDPPort, reqHost) // http(s)://host/
	u = "ws" + strings.TrimPrefix(u, "http")
	return s.withToken(p, strings.TrimSuffix(u, "/")+path)
}
