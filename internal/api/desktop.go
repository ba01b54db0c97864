package api

import (
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/emberbox/emberbox/internal/computer"
	"github.com/emberbox/emberbox/internal/guest"
	"github.com/emberbox/emberbox/internal/liveview"
	"github.com/emberbox/emberbox/internal/sandbox"
)

// A sandbox's desktop (withruntime's sbx.desktop): an X display with a
// window manager, driven by :act and seen by screenshots
// (computer.Service).

// desktopRequest is the body of POST …/desktop:start.
type desktopRequest struct {
	Width  int `json:"width"`
	Height int `json:"height"`
}

// actRequest is the body of POST …/desktop:act: the SDK's shape, which
// computer.Action declares.
type actRequest = computer.Action

// desktopJSON is a sandbox's desktop as the API answers it.
type desktopJSON struct {
	SandboxID string     `json:"sandboxId"`
	State     string     `json:"state"` // running, stopped
	Running   bool       `json:"running"`
	Width     int        `json:"width"`
	Height    int        `json:"height"`
	Display   string     `json:"display"` // DISPLAY inside the sandbox
	StartedAt *time.Time `json:"startedAt"`
	// StreamURL is the live view, with a token; null: no desktop runs.
	StreamURL      *string    `json:"streamUrl"`
	TokenExpiresAt *time.Time `json:"tokenExpiresAt"`
}

// answer writes d, with a fresh streamUrl while it runs.
func (s desktopAPI) answer(w http.ResponseWriter, r *http.Request, c *call, sb *sandbox.Sandbox, d *computer.Desktop) error {
	out := desktopJSON{SandboxID: sb.ID, State: "stopped", Running: d.Running, Width: d.Width, Height: d.Height,
		Display: computer.Display}
	if d.Running {
		out.State = "running"
		at := d.StartedAt.UTC()
		out.StartedAt = &at
		u, exp, err := s.streamURL(r, c.owner, sb.ID)
		if err != nil {
			return err
		}
		out.StreamURL, out.TokenExpiresAt = &u, exp
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// streamURL is the live view of sandbox id's desktop: the private preview
// of its VNC port, which the API's host's pages (the console) may frame.
func (s *server) streamURL(r *http.Request, owner, id string) (string, *time.Time, error) {
	scheme := "http://"
	if r.TLS != nil {
		scheme = "https://"
	}
	embed := []string{scheme + r.Host}
	p, err := s.sharePort(r.Context(), owner, id, sandbox.PreviewSpec{Port: liveview.Port, EmbedOrigins: &embed})
	if err != nil {
		return "", nil, err
	}
	return s.withToken(p, s.previewDomain.url(id, liveview.Port, r.Host))
}

// desktopGuest is guest for the desktop's routes, which a server built
// without computer use refuses.
func (s desktopAPI) desktopGuest(r *http.Request, c *call) (*sandbox.Sandbox, guest.Handle, error) {
	sb, g, err := s.guest(r, c)
	if err != nil {
		return nil, guest.Handle{}, err
	}
	if s.computer == nil {
		return nil, guest.Handle{}, newError(http.StatusNotImplemented, "desktop_unavailable", "This server runs no desktops.")
	}
	return sb, g, nil
}

func (s desktopAPI) start(w http.ResponseWriter, r *http.Request, c *call) error {
	var body desktopRequest
	if err := decode(c, &body); err != nil {
		return err
	}
	opt := computer.DesktopOptions{Width: body.Width, Height: body.Height}
	if _, err := opt.Check(); err != nil {
		return err
	}
	sb, g, err := s.desktopGuest(r, c)
	if err != nil {
		return err
	}
	d, err := s.computer.StartDesktop(r.Context(), sb.ID, g, opt)
	if err != nil {
		return err
	}
	return s.answer(w, r, c, sb, d)
}

func (s desktopAPI) get(w http.ResponseWriter, r *http.Request, c *call) error {
	sb, g, err := s.desktopGuest(r, c)
	if err != nil {
		return err
	}
	d, err := s.computer.GetDesktop(r.Context(), g)
	if err != nil {
		return err
	}
	return s.answer(w, r, c, sb, d)
}

func (s desktopAPI) stop(w http.ResponseWriter, r *http.Request, c *call) error {
	sb, g, err := s.desktopGuest(r, c)
	if err != nil {
		return err
	}
	stopped, err := s.computer.StopDesktop(r.Context(), sb.ID, g)
	if err != nil {
		return err
	}
	// Its live view ends with it.
	s.unsharePort(r.Context(), c.owner, sb.ID, liveview.Port)
	writeJSON(w, http.StatusOK, map[string]any{"sandboxId": sb.ID, "stopped": stopped})
	return nil
}

func (s desktopAPI) act(w http.ResponseWriter, r *http.Request, c *call) error {
	var body actRequest
	if err := decode(c, &body); err != nil {
		return err
	}
	sb, g, err := s.desktopGuest(r, c)
	if err != nil {
		return err
	}
	out, err := s.computer.Act(r.Context(), sb.ID, g, body)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

func (s desktopAPI) screenshot(w http.ResponseWriter, r *http.Request, c *call) error {
	q := r.URL.Query()
	format := q.Get("format")
	jpeg := format == "jpeg" || format == "jpg"
	if !jpeg && format != "" && format != "png" {
		return invalid([]issue{{Path: "format", Message: "must be png or jpeg"}})
	}
	quality := 80
	if v := q.Get("quality"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 100 {
			return invalid([]issue{{Path: "quality", Message: "must be from 1 to 100"}})
		}
		quality = n
	}
	_, g, err := s.desktopGuest(r, c)
	if err != nil {
		return err
	}
	b, err := s.computer.Screenshot(r.Context(), g, jpeg, quality)
	if err != nil {
		return err
	}
	ct := "image/png"
	if jpeg {
		ct = "image/jpeg"
	}
	w.Header().Set("Content-Type", ct)
	w.Header().Set("Content-Length", strconv.Itoa(len(b)))
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(b)
	return nil
}

// recordingRequest is the body of POST …/desktop/recordings.
type recordingRequest struct {
	FPS        int  `json:"fps"`
	MaxSeconds int  `json:"maxSeconds"`
	MaxMiB     int  `json:"maxMiB"`
	CRF        *int `json:"crf"`
}

// recordingJSON is a recording as the API answers it.
type recordingJSON struct {
	ID         string     `json:"id"`
	SandboxID  string     `json:"sandboxId"`
	State      string     `json:"state"` // recording, ready, failed
	FPS        int        `json:"fps,omitempty"`
	MaxSeconds int        `json:"maxSeconds,omitempty"`
	MaxMiB     int        `json:"maxMiB,omitempty"`
	SizeBytes  int64      `json:"sizeBytes"`
	StartedAt  time.Time  `json:"startedAt"`
	EndedAt    *time.Time `json:"endedAt"`
	Error      string     `json:"error,omitempty"`
}

func toRecordingJSON(id string) func(r *computer.Recording) recordingJSON {
	return func(r *computer.Recording) recordingJSON {
		out := recordingJSON{ID: r.ID, SandboxID: id, State: r.State, FPS: r.FPS, MaxSeconds: r.MaxSeconds,
			MaxMiB: r.MaxMiB, SizeBytes: r.SizeBytes, StartedAt: r.StartedAt.UTC(), Error: r.Error}
		if r.EndedAt != nil {
			at := r.EndedAt.UTC()
			out.EndedAt = &at
		}
		return out
	}
}

func (s desktopAPI) startRecording(w http.ResponseWriter, r *http.Request, c *call) error {
	var body recordingRequest
	if err := decode(c, &body); err != nil {
		return err
	}
	opt := computer.RecordingOptions{FPS: body.FPS, MaxSeconds: body.MaxSeconds, MaxMiB: body.MaxMiB, CRF: body.CRF}
	if _, err := opt.Check(); err != nil {
		return err
	}
	sb, g, err := s.desktopGuest(r, c)
	if err != nil {
		return err
	}
	rec, err := s.computer.StartRecording(r.Context(), sb.ID, g, opt)
	return reply(w, rec, err, toRecordingJSON(sb.ID))
}

func (s desktopAPI) listRecordings(w http.ResponseWriter, r *http.Request, c *call) error {
	sb, g, err := s.desktopGuest(r, c)
	if err != nil {
		return err
	}
	recs, err := s.computer.Recordings(r.Context(), g)
	if err != nil {
		return err
	}
	out := make([]recordingJSON, 0, len(recs))
	for i := range recs {
		out = append(out, toRecordingJSON(sb.ID)(&recs[i]))
	}
	writeJSON(w, http.StatusOK, map[string]any{"data": out})
	return nil
}

func (s desktopAPI) getRecording(w http.ResponseWriter, r *http.Request, c *call) error {
	sb, g, err := s.desktopGuest(r, c)
	if err != nil {
		return err
	}
	rec, err := s.computer.Recording(r.Context(), g, r.PathValue("rec"))
	return reply(w, rec, err, toRecordingJSON(sb.ID))
}

func (s desktopAPI) stopRecording(w http.ResponseWriter, r *http.Request, c *call) error {
	sb, g, err := s.desktopGuest(r, c)
	if err != nil {
		return err
	}
	rec, err := s.computer.StopRecording(r.Context(), g, r.PathValue("rec"))
	return reply(w, rec, err, toRecordingJSON(sb.ID))
}

func (s desktopAPI) recordingVideo(w http.ResponseWriter, r *http.Request, c *call) error {
	_, g, err := s.desktopGuest(r, c)
	if err != nil {
		return err
	}
	size, rc, err := s.computer.OpenRecording(r.Context(), g, r.PathValue("rec"))
	if err != nil {
		return err
	}
	defer rc.Close()
	h := w.Header()
	h.Set("Content-Type", "video/mp4")
	h.Set("Content-Length", strconv.FormatInt(size, 10))
	h.Set("Content-Disposition", `attachment; filename="`+r.PathValue("rec")+`.mp4"`)
	w.WriteHeader(http.StatusOK)
	_, _ = io.CopyN(w, rc, size)
	return nil
}

func (s desktopAPI) deleteRecording(w http.ResponseWriter, r *http.Request, c *call) error {
	sb, g, err := s.desktopGuest(r, c)
	if err != nil {
		return err
	}
	deleted, err := s.computer.DeleteRecording(r.Context(), g, r.PathValue("rec"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, map[string]any{"id": r.PathValue("rec"), "sandboxId": sb.ID, "deleted": deleted})
	return nil
}
