package computer

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/emberbox/emberbox/internal/errdefs"
	"github.com/emberbox/emberbox/internal/guest"
)

func intp(n int) *int { return &n }

// TestXdotoolArgv: each action becomes one xdotool command with its
// arguments checked, and hostile input is refused before the guest.
func TestXdotoolArgv(t *testing.T) {
	d := &Desktop{Running: true, Width: 1024, Height: 768}
	for _, c := range []struct {
		a    Action
		want string
	}{
		{Action{Action: "move", X: intp(10), Y: intp(20)}, "xdotool mousemove --sync 10 20"},
		{Action{Action: "click"}, "xdotool click 1"},
		{Action{Action: "click", X: intp(1), Y: intp(2), Button: "right"}, "xdotool mousemove --sync 1 2 click 3"},
		{Action{Action: "click", X: intp(1), Y: intp(2), Double: true}, "xdotool mousemove --sync 1 2 click --repeat 2 1"},
		{Action{Action: "mouseDown", Button: "middle"}, "xdotool mousedown 2"},
		{Action{Action: "mouseUp"}, "xdotool mouseup 1"},
		{Action{Action: "drag", From: []int{1, 2}, To: []int{30, 40}}, "xdotool mousemove --sync 1 2 mousedown 1 mousemove --sync 30 40 mouseup 1"},
		{Action{Action: "scroll", DY: 3}, "xdotool click --repeat 3 5"},
		{Action{Action: "scroll", DY: -2, DX: 1, X: intp(5), Y: intp(6)}, "xdotool mousemove --sync 5 6 click --repeat 2 4 click --repeat 1 7"},
		{Action{Action: "type", Text: "hi; rm -rf /", DelayMs: intp(0)}, "xdotool type --delay 0 -- hi; rm -rf /"},
		{Action{Action: "key", Keys: "ctrl+l  Return"}, "xdotool key -- ctrl+l Return"},
		{Action{Action: "focus", WindowID: "2097154"}, "xdotool windowactivate --sync 2097154"},
	} {
		argv, err := xdotoolArgv(c.a, d)
		if err != nil || strings.Join(argv, " ") != c.want {
			t.Errorf("%+v: %q, %v; want %q", c.a, argv, err, c.want)
		}
	}
	for _, a := range []Action{
		{Action: "move", X: intp(1024), Y: intp(0)},
		{Action: "move", X: intp(-1), Y: intp(0)},
		{Action: "move"},
		{Action: "click", X: intp(1)},
		{Action: "click", Button: "fourth"},
		{Action: "drag", From: []int{1}, To: []int{1, 2}},
		{Action: "scroll"},
		{Action: "scroll", DY: MaxScroll + 1},
		{Action: "type"},
		{Action: "type", Text: "a\x00b"},
		{Action: "type", Text: "\xff"},
		{Action: "type", Text: "a", DelayMs: intp(MaxTypeDelay + 1)},
		{Action: "type", Text: strings.Repeat("a", MaxTypeText+1)},
		{Action: "key", Keys: ""},
		{Action: "key", Keys: "ctrl+l;id"},
		{Action: "key", Keys: "--help"},
		{Action: "key", Keys: strings.Repeat("a ", MaxKeys+1)},
		{Action: "focus", WindowID: "0x1"},
		{Action: "teleport"},
	} {
		if _, err := xdotoolArgv(a, d); errdefs.Code(err) != "invalid_request" {
			t.Errorf("%+v: %v, want invalid_request", a, err)
		}
	}
}

// TestActNeedsADesktop: an action without a desktop is a conflict the
// caller can act on.
func TestActNeedsADesktop(t *testing.T) {
	g := newFakeGuest(t)
	_, err := New(nil).Act(context.Background(), "sbx_a", g, Action{Action: "cursor"})
	if errdefs.Code(err) != "desktop_not_running" {
		t.Fatalf("%v", err)
	}
}

// TestRecordingsFromProcessesAndFiles: a recording is its process while it
// records and its file after; options come back from the command line.
func TestRecordingsFromProcessesAndFiles(t *testing.T) {
	g := newFakeGuest(t)
	ctx := context.Background()
	s := New(nil)
	desk, _ := g.Spawn(ctx, guest.ExecRequest{Argv: layerArgv("/bin/sh", "-c", desktopScript, "emberbox-desktop", "800x600")})
	if d := desktopOf(desk); d.Width != 800 || d.Height != 600 {
		t.Fatalf("desktop %+v", d)
	}
	if _, err := (RecordingOptions{FPS: MaxFPS + 1}).Check(); errdefs.Code(err) != "invalid_request" {
		t.Fatalf("fps over the most: %v", err)
	}
	rec, err := s.StartRecording(ctx, "sbx_a", g, RecordingOptions{FPS: 5, MaxMiB: 8})
	if err != nil {
		t.Fatal(err)
	}
	if rec.State != "recording" || rec.FPS != 5 || rec.MaxMiB != 8 || rec.MaxSeconds != DefaultMaxSeconds || !recordingID.MatchString(rec.ID) {
		t.Fatalf("started %+v", rec)
	}
	if _, err := s.StartRecording(ctx, "sbx_a", g, RecordingOptions{}); errdefs.Code(err) != "recording_running" {
		t.Fatalf("a second recording: %v", err)
	}
	if _, _, err := s.OpenRecording(ctx, g, rec.ID); errdefs.Code(err) != "recording_not_ready" {
		t.Fatalf("download while it records: %v", err)
	}
	// ffmpeg ends 255 on SIGINT, the file complete.
	g.files[RecordingsDir+"/"+rec.ID+".mp4"] = "mp4 bytes"
	pid := g.procs[len(g.procs)-1].ID
	g.end(pid, 255, time.Now())
	got, err := s.Recording(ctx, g, rec.ID)
	if err != nil || got.State != "ready" || got.SizeBytes != 9 {
		t.Fatalf("after it ended: %+v, %v", got, err)
	}
	if _, err := s.Recording(ctx, g, "rec_../../etc"); errdefs.Code(err) != "recording_not_found" {
		t.Fatalf("a hostile id: %v", err)
	}
	// A file whose process the guest no longer lists is still a recording.
	g.files[RecordingsDir+"/rec_00000000000000aa.mp4"] = "x"
	g.files[RecordingsDir+"/notes.txt"] = "not one"
	list, err := s.Recordings(ctx, g)
	if err != nil || len(list) != 2 {
		t.Fatalf("list: %+v, %v", list, err)
	}
	if ok, err := s.DeleteRecording(ctx, g, rec.ID); err != nil || !ok {
		t.Fatalf("delete: %v, %v", ok, err)
	}
	if _, ok := g.files[RecordingsDir+"/"+rec.ID+".mp4"]; ok {
		t.Fatal("a deleted recording's file is there")
	}
	if list, _ := s.Recordings(ctx, g); len(list) != 1 || list[0].ID == rec.ID {
		t.Fatalf("after the delete, the list is %+v", list)
	}
}

// TestViewConn: the live view's VNC server starts on the first view, of a
// running desktop only, and once.
func TestViewConn(t *testing.T) {
	g := newFakeGuest(t)
	s := New(nil)
	ctx := context.Background()
	if _, err := s.ViewConn(ctx, "sbx_a", g); errdefs.Code(err) != "desktop_not_running" {
		t.Fatalf("a view without a desktop: %v", err)
	}
	if _, err := g.Spawn(ctx, guest.ExecRequest{Argv: layerArgv("/bin/sh", "-c", desktopScript, "emberbox-desktop", "800x600")}); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		c, err := s.ViewConn(ctx, "sbx_a", g)
		if err != nil {
			t.Fatal(err)
		}
		c.Close()
	}
	var vnc []guest.ExecRequest
	for _, r := range g.spawned {
		if strings.Contains(strings.Join(r.Argv, " "), "x11vnc -display :1 -rfbport 5900 -localhost") {
			vnc = append(vnc, r)
		}
	}
	if len(vnc) != 1 || vnc[0].User != "root" || vnc[0].Argv[1] != "layer-exec" || vnc[0].Env["DISPLAY"] != Display {
		t.Fatalf("VNC servers spawned: %+v", vnc)
	}
}
