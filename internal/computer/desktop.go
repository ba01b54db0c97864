package computer

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/emberbox/emberbox/internal/errdefs"
	"github.com/emberbox/emberbox/internal/guest"
)

// The desktop: an X display (Xvfb) with a window manager (openbox), from
// the computer-use layer, as the sandbox user. Programs of the guest's own
// image reach it too (DISPLAY=:1; its socket is in the guest's /tmp).
// Input is xdotool's, screenshots ffmpeg's. Like the browser it is a
// process of the guest, found by its command line.

// Display is the desktop's X display.
const Display = ":1"

const (
	desktopMarker = "# Emberbox desktop"
	desktopWait   = 2 * time.Minute
	// MaxScreenshot bounds a screenshot's bytes.
	MaxScreenshot = 32 << 20
)

// desktopScript runs the display and the window manager; it ends when
// the display does. $1 is the screen's size, WxH.
const desktopScript = desktopMarker + `
set -u
Xvfb ` + Display + ` -screen 0 "${1}x24" -nolisten tcp -dpi 96 &
x=$!
i=0
while [ ! -S /tmp/.X11-unix/X1 ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done
DISPLAY=` + Display + ` openbox >/dev/null 2>&1 &
wait $x
`

// DesktopOptions is what a desktop start asks for; zero sizes take the
// defaults.
type DesktopOptions struct{ Width, Height int }

// Check validates o and fills in its defaults.
func (o DesktopOptions) Check() (DesktopOptions, error) {
	b, err := BrowserOptions{Headless: true, Width: o.Width, Height: o.Height}.Check()
	return DesktopOptions{Width: b.Width, Height: b.Height}, err
}

// Desktop is the state of a sandbox's desktop.
type Desktop struct {
	Running       bool
	Width, Height int
	ProcessID     string
	StartedAt     time.Time
}

// StartDesktop starts the desktop of sandbox id in g, or answers the one
// running there.
func (s *Service) StartDesktop(ctx context.Context, id string, g Guest, opt DesktopOptions) (*Desktop, error) {
	opt, err := opt.Check()
	if err != nil {
		return nil, err
	}
	defer s.locks.lock(id + "/desktop")()
	return s.startDesktop(ctx, g, opt)
}

// startDesktop is StartDesktop with the desktop's lock held.
func (s *Service) startDesktop(ctx context.Context, g Guest, opt DesktopOptions) (*Desktop, error) {
	procs, err := processes(ctx, g)
	if err != nil {
		return nil, err
	}
	if p := findDesktop(procs); p != nil {
		d := desktopOf(p)
		return &d, s.desktopReady(ctx, g, p)
	}
	if err := needLayer(ctx, g); err != nil {
		return nil, err
	}
	size := strconv.Itoa(opt.Width) + "x" + strconv.Itoa(opt.Height)
	info, err := g.Spawn(ctx, guest.ExecRequest{User: "root", Cwd: "/tmp", Detach: true,
		Argv: layerArgv("/bin/sh", "-c", desktopScript, "emberbox-desktop", size)})
	if err != nil {
		return nil, fmt.Errorf("starting the desktop: %w", err)
	}
	if err := s.desktopReady(ctx, g, info); err != nil {
		kill(ctx, g, info.ID)
		return nil, err
	}
	s.log.Info("desktop started", "process", info.ID, "size", size)
	d := desktopOf(info)
	return &d, nil
}

// GetDesktop reports the desktop of g: Running false if there is none.
func (s *Service) GetDesktop(ctx context.Context, g Guest) (*Desktop, error) {
	procs, err := processes(ctx, g)
	if err != nil {
		return nil, err
	}
	p := findDesktop(procs)
	if p == nil {
		return &Desktop{}, nil
	}
	d := desktopOf(p)
	return &d, nil
}

// StopDesktop ends the desktop of sandbox id and what runs on it (a
// browser with a window), reporting whether one ran.
func (s *Service) StopDesktop(ctx context.Context, id string, g Guest) (bool, error) {
	defer s.locks.lock(id + "/desktop")()
	procs, err := processes(ctx, g)
	if err != nil {
		return false, err
	}
	stopped := false
	for i := range procs {
		p := procs[i]
		if running(p) && (isDesktop(p) || isBrowser(p) && !browserOf(&p).Headless) {
			kill(ctx, g, p.ID)
			waitEnded(ctx, g, p.ID)
			stopped = stopped || isDesktop(p)
		}
	}
	return stopped, nil
}

// desktopReady waits until the display of p answers.
func (s *Service) desktopReady(ctx context.Context, g Guest, p *guest.ProcessInfo) error {
	wctx, cancel := context.WithTimeout(ctx, desktopWait)
	defer cancel()
	for {
		res, err := g.Exec(wctx, displayExec([]string{"xdotool", "getdisplaygeometry"}, 64), nil)
		if err == nil && res.ExitCode != nil && *res.ExitCode == 0 {
			return nil
		}
		if cur, perr := g.Process(wctx, p.ID); perr == nil && !running(*cur) {
			return errdefs.New(errdefs.ErrInternal, "desktop_failed", "the desktop ended as it started: %s", tail(ctx, g, p.ID))
		}
		select {
		case <-wctx.Done():
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return errdefs.New(errdefs.ErrUnavailable, "desktop_failed", "the desktop's display did not answer within %s", desktopWait)
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// needLayer refuses a sandbox without the computer-use layer, which the
// desktop's software comes from.
func needLayer(ctx context.Context, g Guest) error {
	res, err := g.Exec(ctx, guest.ExecRequest{Argv: []string{"/bin/sh", "-c", "[ -x " + layerDir + "/usr/bin/Xvfb ] && [ -x " + agentPath + " ]"},
		TimeoutMs: 30_000}, nil)
	if err != nil {
		return fmt.Errorf("looking for the desktop's software: %w", err)
	}
	if res.ExitCode == nil || *res.ExitCode != 0 {
		return errdefs.New(errdefs.ErrConflict, "desktop_unavailable",
			"this sandbox has no computer-use layer: it was booted by a server without one").
			WithHint("restart the sandbox (POST /v1/sandboxes/{id}:restart) to boot it with the layer")
	}
	return nil
}

// layerArgv runs argv from the layer as the sandbox user (spawned as root).
func layerArgv(argv ...string) []string {
	return append([]string{agentPath, "layer-exec", "user"}, argv...)
}

// displayExec is a short command of the layer on the desktop's display.
func displayExec(argv []string, maxOut int64) guest.ExecRequest {
	return guest.ExecRequest{Argv: layerArgv(argv...), User: "root", Cwd: "/tmp", TimeoutMs: 60_000,
		MaxOutput: maxOut, Env: map[string]string{"DISPLAY": Display}}
}

func isDesktop(p guest.ProcessInfo) bool {
	return slices.ContainsFunc(p.Argv, func(a string) bool { return strings.HasPrefix(a, desktopMarker) })
}

func findDesktop(procs []guest.ProcessInfo) *guest.ProcessInfo {
	for i := range procs {
		if isDesktop(procs[i]) && running(procs[i]) {
			return &procs[i]
		}
	}
	return nil
}

// desktopOf reads a desktop's size back from its command line.
func desktopOf(p *guest.ProcessInfo) Desktop {
	d := Desktop{Running: true, ProcessID: p.ID, StartedAt: p.StartedAt}
	if len(p.Argv) > 0 {
		w, h, _ := strings.Cut(p.Argv[len(p.Argv)-1], "x")
		d.Width, _ = strconv.Atoi(w)
		d.Height, _ = strconv.Atoi(h)
	}
	return d
}

// runningDesktop returns the running desktop of g, or desktop_not_running.
func runningDesktop(ctx context.Context, g Guest) (*Desktop, error) {
	procs, err := processes(ctx, g)
	if err != nil {
		return nil, err
	}
	p := findDesktop(procs)
	if p == nil {
		return nil, errdefs.New(errdefs.ErrConflict, "desktop_not_running", "the sandbox's desktop is not running").
			WithHint("start it with POST /v1/sandboxes/{id}/desktop:start")
	}
	d := desktopOf(p)
	return &d, nil
}

// Screenshot answers the desktop's screen as PNG, or as JPEG of quality
// (1 to 100) when jpeg.
func (s *Service) Screenshot(ctx context.Context, g Guest, jpeg bool, quality int) ([]byte, error) {
	d, err := runningDesktop(ctx, g)
	if err != nil {
		return nil, err
	}
	var raw [8]byte
	_, _ = rand.Read(raw[:])
	name := "/tmp/.emberbox-screenshot-" + hex.EncodeToString(raw[:])
	argv := []string{"ffmpeg", "-nostdin", "-loglevel", "error", "-f", "x11grab", "-draw_mouse", "1",
		"-video_size", fmt.Sprintf("%dx%d", d.Width, d.Height), "-i", Display, "-frames:v", "1"}
	if jpeg {
		// ffmpeg's JPEG scale runs from 2 (best) to 31.
		argv = append(argv, "-q:v", strconv.Itoa(2+(100-quality)*29/99), "-f", "image2", "-c:v", "mjpeg", name+".jpg")
		name += ".jpg"
	} else {
		argv = append(argv, "-f", "image2", "-c:v", "png", name+".png")
		name += ".png"
	}
	res, err := g.Exec(ctx, displayExec(argv, 4096), nil)
	if err != nil {
		return nil, fmt.Errorf("taking a screenshot: %w", err)
	}
	defer removeQuietly(ctx, g, name)
	if res.ExitCode == nil || *res.ExitCode != 0 {
		return nil, errdefs.New(errdefs.ErrInternal, "screenshot_failed", "the screenshot failed: %s",
			clip(printable(string(res.Stderr)), 500))
	}
	_, rc, err := g.ReadFile(ctx, name)
	if err != nil {
		return nil, fmt.Errorf("reading the screenshot: %w", err)
	}
	defer rc.Close()
	b, err := io.ReadAll(io.LimitReader(rc, MaxScreenshot+1))
	if err != nil {
		return nil, fmt.Errorf("reading the screenshot: %w", err)
	}
	if len(b) > MaxScreenshot {
		return nil, errdefs.New(errdefs.ErrInternal, "screenshot_failed", "the screenshot is over %d MiB", MaxScreenshot>>20)
	}
	return b, nil
}

// removeQuietly removes a file of the guest, even after ctx ends.
func removeQuietly(ctx context.Context, g Guest, name string) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	_, _ = g.Remove(ctx, name, false)
}

// vncPort is where the desktop's VNC server listens in the guest, on
// 127.0.0.1 (liveview.Port).
const vncPort = 5900

// vncArgv starts the desktop's VNC server: shared, for as long as the
// display lives, without a password of its own (only the preview's
// authenticated path reaches its loopback port).
var vncArgv = []string{"x11vnc", "-display", Display, "-rfbport", "5900", "-localhost", "-shared", "-forever",
	"-nopw", "-quiet", "-noxdamage", "-nowf"}

// ViewConn connects to the VNC server of sandbox id's desktop, which it
// starts on the first view: nothing runs for the live view until someone
// watches. The VNC server ends with the display.
func (s *Service) ViewConn(ctx context.Context, id string, g Guest) (net.Conn, error) {
	if c, err := g.DialPort(ctx, vncPort); err == nil {
		return c, nil
	}
	defer s.locks.lock(id + "/view")()
	if c, err := g.DialPort(ctx, vncPort); err == nil {
		return c, nil
	}
	if _, err := runningDesktop(ctx, g); err != nil {
		return nil, err
	}
	info, err := g.Spawn(ctx, guest.ExecRequest{Argv: layerArgv(vncArgv...), User: "root", Cwd: "/tmp", Detach: true,
		Env: map[string]string{"DISPLAY": Display}})
	if err != nil {
		return nil, fmt.Errorf("starting the desktop's VNC server: %w", err)
	}
	s.log.Info("desktop view started", "sandbox", id, "process", info.ID)
	wctx, cancel := context.WithTimeout(ctx, desktopWait)
	defer cancel()
	for {
		c, err := g.DialPort(wctx, vncPort)
		if err == nil {
			return c, nil
		}
		if p, perr := g.Process(wctx, info.ID); perr == nil && !running(*p) {
			return nil, errdefs.New(errdefs.ErrInternal, "desktop_failed", "the VNC server ended as it started: %s", tail(ctx, g, info.ID))
		}
		select {
		case <-wctx.Done():
			kill(ctx, g, info.ID)
			return nil, errdefs.New(errdefs.ErrUnavailable, "desktop_failed", "the VNC server did not listen within %s", desktopWait)
		case <-time.After(250 * time.Millisecond):
		}
	}
}
