package catalog

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/emberbox/emberbox/internal/guest"
	"github.com/emberbox/emberbox/internal/sandbox"
)

// Start commands: an image's start runs in each sandbox of it once the
// agent answers, before the sandbox is running, and the create waits until
// it is ready (or its readiness time is up: the sandbox runs anyway, with
// the report saying so).

// DefaultReadyTimeout bounds the wait for readiness when the image names
// none.
const DefaultReadyTimeout = 60 * time.Second

// readyPoll is how often readiness is checked.
const readyPoll = 200 * time.Millisecond

// maxStartReports bounds the reports remembered (the oldest go first).
const maxStartReports = 10000

// StartReport is the outcome of a sandbox's start command.
type StartReport struct {
	Command string
	Ready   bool
	ReadyMs int64
	Error   string
}

// startReports keeps each sandbox's report in memory: the SDK keeps the
// create's, and the server answers a read with it until it restarts.
type startReports struct {
	mu    sync.Mutex
	m     map[string]StartReport
	order []string
}

func (r *startReports) put(id string, rep StartReport) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.m == nil {
		r.m = map[string]StartReport{}
	}
	if _, ok := r.m[id]; !ok {
		r.order = append(r.order, id)
		if len(r.order) > maxStartReports {
			delete(r.m, r.order[0])
			r.order = r.order[1:]
		}
	}
	r.m[id] = rep
}

// StartReport returns the report of a sandbox's start command, if the
// server has one.
func (s *Service) StartReport(sandboxID string) (StartReport, bool) {
	s.starts.mu.Lock()
	defer s.starts.mu.Unlock()
	rep, ok := s.starts.m[sandboxID]
	return rep, ok
}

// Preparer returns the sandbox.Preparer that runs start commands.
func (s *Service) Preparer() sandbox.Preparer { return startPreparer{s} }

type startPreparer struct{ s *Service }

func (startPreparer) Name() string { return "image_start" }

// startGuest is what a start command needs of the guest: its process and
// the port that says it is ready.
type startGuest interface {
	guest.ProcessRunner
	guest.PortDialer
}

// Prepare implements sandbox.Preparer. It runs again after a server
// restart (and for a copy of a memory snapshot), so a start command
// already running is not started twice.
func (p startPreparer) Prepare(ctx context.Context, sb *sandbox.Sandbox, g guest.Handle) error {
	// Internal owners ("system:build": build sandboxes) build on an
	// image; they do not serve it.
	if sb.ImageID == "" || strings.HasPrefix(sb.OwnerKeyID, "system:") {
		return nil
	}
	img, err := p.s.st.GetImage(ctx, sb.ImageID)
	if err != nil {
		return fmt.Errorf("reading image %s: %w", sb.ImageID, err)
	}
	if img.Start == nil {
		return nil
	}
	rep := p.s.runStart(ctx, img, g)
	if ctx.Err() != nil {
		return ctx.Err()
	}
	p.s.starts.put(sb.ID, rep)
	typ, msg := "start_ready", fmt.Sprintf("the image's start command is ready after %d ms", rep.ReadyMs)
	if !rep.Ready {
		typ, msg = "start_not_ready", "the image's start command is not ready: "+rep.Error
		p.s.log.Warn("an image's start command is not ready", "sandbox_id", sb.ID, "image_id", img.ID, "err", rep.Error)
	}
	if p.s.cfg.Events != nil {
		data := map[string]any{"imageId": img.ID, "command": rep.Command, "ready": rep.Ready, "readyMs": rep.ReadyMs}
		if err := p.s.cfg.Events.AppendEvent(context.WithoutCancel(ctx), sb.ID, typ, msg, data); err != nil {
			p.s.log.Warn("recording a start event", "sandbox_id", sb.ID, "err", err)
		}
	}
	return nil
}

// execAs is an exec request that runs command as the image's user, in
// its workdir, with its env.
func execAs(img *Image, command string) guest.ExecRequest {
	req := guest.ExecRequest{Command: command, Cwd: img.Workdir, Env: img.Env}
	switch img.User {
	case "", "user":
	case "root", "0":
		req.User = "root"
	default:
		// Another account of the image: switch to it from root.
		req.User = "root"
		req.Command = "exec runuser -u " + shellQuote(img.User) + " -- bash -c " + shellQuote(command)
	}
	return req
}

func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

func (s *Service) runStart(ctx context.Context, img *Image, g startGuest) StartReport {
	st := img.Start
	rep := StartReport{Command: st.Command}
	begin := time.Now()
	var procID string
	if procs, err := g.Processes(ctx); err == nil {
		for _, pi := range procs {
			if pi.Command == execAs(img, st.Command).Command && pi.State == "running" {
				procID = pi.ID
			}
		}
	}
	if procID == "" {
		req := execAs(img, st.Command)
		req.Detach = true
		pi, err := g.Spawn(ctx, req)
		if err != nil {
			rep.Error = "starting the command: " + err.Error()
			return rep
		}
		procID = pi.ID
	}
	timeout := DefaultReadyTimeout
	if st.ReadyTimeoutSeconds > 0 {
		timeout = time.Duration(st.ReadyTimeoutSeconds) * time.Second
	}
	wctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	tick := time.NewTicker(readyPoll)
	defer tick.Stop()
	for {
		ready, stop := s.readyOnce(wctx, img, g, procID)
		if ready {
			rep.Ready, rep.ReadyMs = true, time.Since(begin).Milliseconds()
			return rep
		}
		if stop != "" {
			rep.Error = stop
			return rep
		}
		select {
		case <-wctx.Done():
			rep.Error = fmt.Sprintf("not ready within %s", timeout)
			return rep
		case <-tick.C:
		}
	}
}

// readyOnce checks readiness once; stop says why waiting is pointless.
func (s *Service) readyOnce(ctx context.Context, img *Image, g startGuest, procID string) (ready bool, stop string) {
	st := img.Start
	if pi, err := g.Process(ctx, procID); err == nil && pi.State != "running" {
		code := -1
		if pi.ExitCode != nil {
			code = *pi.ExitCode
		}
		if st.ReadyPort == 0 && st.ReadyCommand == "" && code == 0 {
			return true, ""
		}
		return false, fmt.Sprintf("the command exited with code %d before it was ready", code)
	}
	switch {
	case st.ReadyPort > 0:
		c, err := g.DialPort(ctx, st.ReadyPort)
		if err != nil {
			return false, ""
		}
		c.Close()
		return true, ""
	case st.ReadyCommand != "":
		req := execAs(img, st.ReadyCommand)
		req.TimeoutMs = 10000
		res, err := g.Exec(ctx, req, nil)
		return err == nil && res.ExitCode != nil && *res.ExitCode == 0, ""
	}
	// No readiness check: started is ready.
	return true, ""
}
