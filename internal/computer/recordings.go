package computer

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/emberbox/emberbox/internal/errdefs"
	"github.com/emberbox/emberbox/internal/guest"
)

// Recordings of the desktop: ffmpeg from the layer encodes the display to
// H.264 in an MP4 file of the guest's /tmp, one at a time. The file never
// outgrows maxMiB (ffmpeg's -fs) and a recording does not start without
// room for it and a margin on the guest's disk. A recording is its file
// and, while it records, its process: nothing is kept on the host.

// RecordingsDir is where recordings are written in the guest.
const RecordingsDir = "/tmp/emberbox-recordings"

// Bounds and defaults of recordings.
const (
	DefaultFPS, MaxFPS             = 10, 30
	DefaultMaxSeconds, MaxSeconds  = 600, 3600
	DefaultMaxMiB, MaxRecordingMiB = 256, 2048
	DefaultCRF, MaxCRF             = 28, 51
	// diskMargin is the room a recording leaves free on the guest's disk.
	diskMarginMiB = 256
	// MaxRecordings bounds the recordings kept in a sandbox.
	MaxRecordings = 32
)

const recordingMarker = "# Emberbox recording"

// recordingScript records the display: $1 the id, $2 fps, $3 seconds,
// $4 bytes, $5 crf, $6 the screen's size.
const recordingScript = recordingMarker + `
mkdir -p ` + RecordingsDir + ` || exit 1
exec ffmpeg -nostdin -loglevel error -y -f x11grab -draw_mouse 1 -framerate "$2" -video_size "$6" -i ` + Display + ` \
	-t "$3" -fs "$4" -c:v libx264 -preset ultrafast -tune zerolatency -crf "$5" -pix_fmt yuv420p \
	-movflags +faststart "` + RecordingsDir + `/$1.mp4"
`

var recordingID = regexp.MustCompile(`^rec_[0-9a-f]{16}$`)

// RecordingOptions is what a recording's start asks for; zeros take the
// defaults.
type RecordingOptions struct {
	FPS, MaxSeconds, MaxMiB int
	CRF                     *int
}

// Check validates o and fills in its defaults.
func (o RecordingOptions) Check() (RecordingOptions, error) {
	if o.FPS == 0 {
		o.FPS = DefaultFPS
	}
	if o.MaxSeconds == 0 {
		o.MaxSeconds = DefaultMaxSeconds
	}
	if o.MaxMiB == 0 {
		o.MaxMiB = DefaultMaxMiB
	}
	if o.CRF == nil {
		crf := DefaultCRF
		o.CRF = &crf
	}
	switch {
	case o.FPS < 1 || o.FPS > MaxFPS:
		return o, invalidAction(fmt.Sprintf("fps must be from 1 to %d", MaxFPS))
	case o.MaxSeconds < 1 || o.MaxSeconds > MaxSeconds:
		return o, invalidAction(fmt.Sprintf("maxSeconds must be from 1 to %d", MaxSeconds))
	case o.MaxMiB < 1 || o.MaxMiB > MaxRecordingMiB:
		return o, invalidAction(fmt.Sprintf("maxMiB must be from 1 to %d", MaxRecordingMiB))
	case *o.CRF < 0 || *o.CRF > MaxCRF:
		return o, invalidAction(fmt.Sprintf("crf must be from 0 to %d", MaxCRF))
	}
	return o, nil
}

// Recording is one recording of a sandbox's desktop.
type Recording struct {
	ID    string
	State string // recording, ready, failed
	// Options are known while its process is known to the guest.
	FPS, MaxSeconds, MaxMiB int
	SizeBytes               int64
	StartedAt               time.Time
	EndedAt                 *time.Time
	Error                   string // failed: why
}

// StartRecording starts recording the desktop of sandbox id.
func (s *Service) StartRecording(ctx context.Context, id string, g Guest, opt RecordingOptions) (*Recording, error) {
	opt, err := opt.Check()
	if err != nil {
		return nil, err
	}
	defer s.locks.lock(id + "/recordings")()
	d, err := runningDesktop(ctx, g)
	if err != nil {
		return nil, err
	}
	recs, err := s.recordings(ctx, g)
	if err != nil {
		return nil, err
	}
	for _, r := range recs {
		if r.State == "recording" {
			return nil, errdefs.New(errdefs.ErrConflict, "recording_running", "recording %s is under way; one at a time", r.ID).
				WithHint("stop it first: POST …/desktop/recordings/{id}:stop")
		}
	}
	if len(recs) >= MaxRecordings {
		return nil, errdefs.New(errdefs.ErrConflict, "too_many_recordings", "the sandbox keeps %d recordings, the most it may", len(recs)).
			WithHint("delete one: DELETE …/desktop/recordings/{id}")
	}
	if err := roomFor(ctx, g, opt.MaxMiB); err != nil {
		return nil, err
	}
	var raw [8]byte
	_, _ = rand.Read(raw[:])
	rid := "rec_" + hex.EncodeToString(raw[:])
	argv := layerArgv("/bin/sh", "-c", recordingScript, "emberbox-recording", rid, strconv.Itoa(opt.FPS),
		strconv.Itoa(opt.MaxSeconds), strconv.FormatInt(int64(opt.MaxMiB)<<20, 10), strconv.Itoa(*opt.CRF),
		fmt.Sprintf("%dx%d", d.Width, d.Height))
	info, err := g.Spawn(ctx, guest.ExecRequest{Argv: argv, User: "root", Cwd: "/tmp", Detach: true,
		Env: map[string]string{"DISPLAY": Display}})
	if err != nil {
		return nil, fmt.Errorf("starting the recording: %w", err)
	}
	if err := recordingBegun(ctx, g, info.ID, rid); err != nil {
		kill(ctx, g, info.ID)
		return nil, err
	}
	r := recordingOf(info)
	return &r, nil
}

// recordingBegun waits until the recording's file has its first bytes:
// ffmpeg takes seconds to start under emulation, and a stop before that
// would leave no video.
func recordingBegun(ctx context.Context, g Guest, pid, rid string) error {
	wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	for {
		files, _ := g.List(wctx, guest.FileRequest{Path: RecordingsDir, Depth: 1, Limit: 1000})
		for _, f := range files {
			if f.Name == rid+".mp4" && f.Size > 0 {
				return nil
			}
		}
		if p, err := g.Process(wctx, pid); err == nil && !running(*p) {
			return errdefs.New(errdefs.ErrInternal, "recording_failed", "the recording ended as it started: %s", tail(ctx, g, pid))
		}
		select {
		case <-wctx.Done():
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return errdefs.New(errdefs.ErrUnavailable, "recording_failed", "the recording wrote nothing within 2 minutes")
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// roomFor refuses a recording of maxMiB the guest's disk has no room for.
func roomFor(ctx context.Context, g Guest, maxMiB int) error {
	res, err := g.Exec(ctx, guest.ExecRequest{Argv: []string{"df", "-Pk", "/tmp"}, MaxOutput: 4096, TimeoutMs: 30_000}, nil)
	if err != nil || res.ExitCode == nil || *res.ExitCode != 0 {
		return nil // no df: -fs still bounds the file
	}
	lines := strings.Split(strings.TrimSpace(string(res.Stdout)), "\n")
	f := strings.Fields(lines[len(lines)-1])
	if len(f) < 4 {
		return nil
	}
	availKiB, err := strconv.ParseInt(f[3], 10, 64)
	if err != nil {
		return nil
	}
	if availKiB>>10 < int64(maxMiB+diskMarginMiB) {
		return errdefs.New(errdefs.ErrConflict, "disk_full",
			"the sandbox's disk has %d MiB free: not enough for a recording of up to %d MiB and %d MiB to spare",
			availKiB>>10, maxMiB, diskMarginMiB).
			WithHint("ask for a smaller maxMiB, or free room in the sandbox")
	}
	return nil
}

// Recordings lists the recordings of g, newest first.
func (s *Service) Recordings(ctx context.Context, g Guest) ([]Recording, error) {
	return s.recordings(ctx, g)
}

// recordings joins the recordings' files and processes.
func (s *Service) recordings(ctx context.Context, g Guest) ([]Recording, error) {
	procs, err := processes(ctx, g)
	if err != nil {
		return nil, err
	}
	byID := map[string]*Recording{}
	for i := range procs {
		if rid := recordingIDOf(procs[i]); rid != "" {
			r := recordingOf(&procs[i])
			if old := byID[rid]; old == nil || r.StartedAt.After(old.StartedAt) {
				byID[rid] = &r
			}
		}
	}
	files, err := g.List(ctx, guest.FileRequest{Path: RecordingsDir, Depth: 1, Limit: 1000})
	if err != nil && !errdefs.IsNotFound(err) {
		return nil, fmt.Errorf("listing the recordings: %w", err)
	}
	onDisk := map[string]bool{}
	for _, f := range files {
		rid, ok := strings.CutSuffix(f.Name, ".mp4")
		if !ok || !recordingID.MatchString(rid) || f.Type != "file" {
			continue
		}
		onDisk[rid] = true
		r := byID[rid]
		if r == nil {
			r = &Recording{ID: rid, State: "ready", StartedAt: f.ModifiedAt}
			byID[rid] = r
		}
		r.SizeBytes = f.Size
	}
	out := make([]Recording, 0, len(byID))
	for rid, r := range byID {
		if r.State != "recording" && !onDisk[rid] {
			continue // deleted; its process is only history
		}
		if r.State == "ready" && r.SizeBytes == 0 {
			r.State, r.Error = "failed", "no video was written"
		}
		out = append(out, *r)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].StartedAt.After(out[j].StartedAt) })
	return out, nil
}

// Recording reports one recording.
func (s *Service) Recording(ctx context.Context, g Guest, rid string) (*Recording, error) {
	if !recordingID.MatchString(rid) {
		return nil, recordingNotFound(rid)
	}
	recs, err := s.recordings(ctx, g)
	if err != nil {
		return nil, err
	}
	for i := range recs {
		if recs[i].ID == rid {
			return &recs[i], nil
		}
	}
	return nil, recordingNotFound(rid)
}

// StopRecording ends a recording and answers once its file is complete.
func (s *Service) StopRecording(ctx context.Context, g Guest, rid string) (*Recording, error) {
	if !recordingID.MatchString(rid) {
		return nil, recordingNotFound(rid)
	}
	procs, err := processes(ctx, g)
	if err != nil {
		return nil, err
	}
	for i := range procs {
		if recordingIDOf(procs[i]) == rid && running(procs[i]) {
			// ffmpeg finishes the file on SIGINT, which can take a while
			// under emulation.
			if _, err := g.Signal(ctx, procs[i].ID, "INT"); err != nil {
				return nil, fmt.Errorf("stopping the recording: %w", err)
			}
			waitEndedFor(ctx, g, procs[i].ID, 2*time.Minute)
		}
	}
	return s.Recording(ctx, g, rid)
}

// OpenRecording answers a finished recording's video.
func (s *Service) OpenRecording(ctx context.Context, g Guest, rid string) (int64, io.ReadCloser, error) {
	r, err := s.Recording(ctx, g, rid)
	if err != nil {
		return 0, nil, err
	}
	if r.State != "ready" {
		return 0, nil, errdefs.New(errdefs.ErrConflict, "recording_not_ready", "recording %s is %s", rid, r.State).
			WithHint("stop it first: POST …/desktop/recordings/{id}:stop")
	}
	fe, rc, err := g.ReadFile(ctx, RecordingsDir+"/"+rid+".mp4")
	if err != nil {
		return 0, nil, err
	}
	return fe.Size, rc, nil
}

// DeleteRecording ends a recording if it runs and removes its file.
func (s *Service) DeleteRecording(ctx context.Context, g Guest, rid string) (bool, error) {
	if !recordingID.MatchString(rid) {
		return false, nil
	}
	procs, err := processes(ctx, g)
	if err != nil {
		return false, err
	}
	for i := range procs {
		if recordingIDOf(procs[i]) == rid && running(procs[i]) {
			kill(ctx, g, procs[i].ID)
			waitEnded(ctx, g, procs[i].ID)
		}
	}
	return g.Remove(ctx, RecordingsDir+"/"+rid+".mp4", false)
}

// recordingIDOf is the recording p records, "" if it is none.
func recordingIDOf(p guest.ProcessInfo) string {
	i := slices.IndexFunc(p.Argv, func(a string) bool { return strings.HasPrefix(a, recordingMarker) })
	if i < 0 || i+2 >= len(p.Argv) || !recordingID.MatchString(p.Argv[i+2]) {
		return ""
	}
	return p.Argv[i+2]
}

// recordingOf reads a recording from its process.
func recordingOf(p *guest.ProcessInfo) Recording {
	r := Recording{ID: recordingIDOf(*p), State: "recording", StartedAt: p.StartedAt, EndedAt: p.EndedAt}
	i := slices.IndexFunc(p.Argv, func(a string) bool { return strings.HasPrefix(a, recordingMarker) })
	if i >= 0 && i+6 < len(p.Argv) {
		r.FPS, _ = strconv.Atoi(p.Argv[i+3])
		r.MaxSeconds, _ = strconv.Atoi(p.Argv[i+4])
		b, _ := strconv.ParseInt(p.Argv[i+5], 10, 64)
		r.MaxMiB = int(b >> 20)
	}
	if !running(*p) {
		r.State = "ready"
		// ffmpeg ends 255 when interrupted, having finished the file.
		if c := p.ExitCode; c == nil || *c != 0 && *c != 255 {
			r.State, r.Error = "failed", "ffmpeg ended "+exitText(c)
		}
	}
	return r
}

func recordingNotFound(rid string) error {
	return errdefs.New(errdefs.ErrNotFound, "recording_not_found", "no recording %q in this sandbox", clip(rid, 40))
}
