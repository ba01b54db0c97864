package envd_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"slices"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/emberbox/emberbox/internal/envd/proto/process"
	"github.com/emberbox/emberbox/internal/envd/proto/process/processconnect"
)

// events is what a process stream carried, read to its end.
type events struct {
	pid            uint32
	stdout, stderr bytes.Buffer
	pty            bytes.Buffer
	end            *process.ProcessEvent_EndEvent
	keepalives     int
}

func (ev *events) add(t *testing.T, e *process.ProcessEvent) {
	t.Helper()
	switch x := e.GetEvent().(type) {
	case *process.ProcessEvent_Start:
		if ev.pid != 0 {
			t.Fatal("a second start event")
		}
		ev.pid = x.Start.GetPid()
	case *process.ProcessEvent_Data:
		if ev.pid == 0 {
			t.Fatal("data before the start event")
		}
		ev.stdout.Write(x.Data.GetStdout())
		ev.stderr.Write(x.Data.GetStderr())
		ev.pty.Write(x.Data.GetPty())
	case *process.ProcessEvent_End:
		ev.end = x.End
	case *process.ProcessEvent_Keepalive:
		ev.keepalives++
	}
}

// bash runs cmd under bash, not as the login shell E2B's SDK asks for
// (-l): a test host's login profile is its own, and may read stdin or
// hang.
func bash(cmd string) *process.ProcessConfig {
	return &process.ProcessConfig{Cmd: "/bin/bash", Args: []string{"-c", cmd}}
}

// startStream starts a process and returns its stream once the start
// event came.
func startStream(t *testing.T, ctx context.Context, c processconnect.ProcessClient, req *process.StartRequest) (*connect.ServerStreamForClient[process.StartResponse], *events) {
	t.Helper()
	s, err := c.Start(ctx, connect.NewRequest(req))
	if err != nil {
		t.Fatal(err)
	}
	if !s.Receive() {
		t.Fatalf("no start event: %v", s.Err())
	}
	ev := &events{}
	ev.add(t, s.Msg().GetEvent())
	if ev.pid == 0 {
		t.Fatalf("first event %v, want a start with a pid", s.Msg())
	}
	return s, ev
}

func drain(t *testing.T, s interface {
	Receive() bool
	Err() error
}, msg func() *process.ProcessEvent, ev *events) {
	t.Helper()
	for s.Receive() {
		ev.add(t, msg())
	}
	if err := s.Err(); err != nil {
		t.Fatalf("stream: %v (so far %q %q %q)", err, ev.stdout.String(), ev.stderr.String(), ev.pty.String())
	}
	if ev.end == nil {
		t.Fatal("the stream ended without an end event")
	}
}

func TestStartOutputAndEnd(t *testing.T) {
	e := newEnv(t)
	for _, codec := range codecs {
		t.Run(codec.name, func(t *testing.T) {
			ctx := testCtx(t)
			c := e.process(codec.opts...)
			cwd := e.dir
			req := &process.StartRequest{Process: &process.ProcessConfig{
				Cmd: "/bin/bash", Args: []string{"-c", `echo "out $FOO $PWD"; echo err >&2; exit 3`},
				Envs: map[string]string{"FOO": "bar"}, Cwd: &cwd,
			}}
			s, ev := startStream(t, ctx, c, req)
			drain(t, s, func() *process.ProcessEvent { return s.Msg().GetEvent() }, ev)
			if got, want := ev.stdout.String(), "out bar "+e.dir+"\n"; got != want {
				t.Errorf("stdout %q, want %q", got, want)
			}
			if got := ev.stderr.String(); got != "err\n" {
				t.Errorf("stderr %q", got)
			}
			end := ev.end
			if end.GetExitCode() != 3 || !end.GetExited() || end.GetStatus() != "exit status 3" || end.GetError() != "exit status 3" {
				t.Errorf("end %v, want exit code 3", end)
			}

			s, ev = startStream(t, ctx, c, &process.StartRequest{Process: bash("true")})
			drain(t, s, func() *process.ProcessEvent { return s.Msg().GetEvent() }, ev)
			if ev.end.GetExitCode() != 0 || !ev.end.GetExited() || ev.end.Error != nil {
				t.Errorf("end of true: %v", ev.end)
			}
		})
	}
}

// The process runs as the user E2B's SDKs name in Basic auth; a user the
// guest has no account for is refused.
func TestStartUser(t *testing.T) {
	e := newEnv(t)
	ctx := testCtx(t)
	c := e.process(connect.WithProtoJSON())
	req := connect.NewRequest(&process.StartRequest{Process: bash("id -un")})
	req.Header().Set("Authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte("root:")))
	s, err := c.Start(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	ev := &events{}
	drain(t, s, func() *process.ProcessEvent { return s.Msg().GetEvent() }, ev)
	if got := strings.TrimSpace(ev.stdout.String()); got != "root" {
		t.Errorf("ran as %q, want root", got)
	}

	req = connect.NewRequest(&process.StartRequest{Process: bash("true")})
	req.Header().Set("Authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte("no-such-user:")))
	s, err = c.Start(ctx, req)
	if err == nil {
		for s.Receive() {
		}
		err = s.Err()
	}
	wantCode(t, err, connect.CodeInvalidArgument)
}

// A command with stdin reads what SendInput and StreamInput send until
// CloseStdin; it is listed while it runs.
func TestStdin(t *testing.T) {
	e := newEnv(t)
	for _, codec := range codecs {
		t.Run(codec.name, func(t *testing.T) {
			ctx := testCtx(t)
			c := e.process(codec.opts...)
			stdin := true
			s, ev := startStream(t, ctx, c, &process.StartRequest{Process: bash("cat"), Stdin: &stdin})

			list, err := c.List(ctx, connect.NewRequest(&process.ListRequest{}))
			if err != nil {
				t.Fatal(err)
			}
			i := slices.IndexFunc(list.Msg.GetProcesses(), func(p *process.ProcessInfo) bool { return p.GetPid() == ev.pid })
			if i < 0 {
				t.Fatalf("pid %d not listed in %v", ev.pid, list.Msg)
			}
			if cfg := list.Msg.GetProcesses()[i].GetConfig(); cfg.GetCmd() != "/bin/bash" || !slices.Equal(cfg.GetArgs(), []string{"-c", "cat"}) {
				t.Errorf("listed as %v", cfg)
			}

			sel := &process.ProcessSelector{Selector: &process.ProcessSelector_Pid{Pid: ev.pid}}
			if _, err := c.SendInput(ctx, connect.NewRequest(&process.SendInputRequest{
				Process: sel, Input: &process.ProcessInput{Input: &process.ProcessInput_Stdin{Stdin: []byte("one\n")}},
			})); err != nil {
				t.Fatal(err)
			}
			// A client stream, over HTTP/1.1 as E2B's SDK sends it to a
			// plain-HTTP server.
			in := c.StreamInput(ctx)
			if err := in.Send(&process.StreamInputRequest{Event: &process.StreamInputRequest_Start{Start: &process.StreamInputRequest_StartEvent{Process: sel}}}); err != nil {
				t.Fatal(err)
			}
			for _, piece := range []string{"two ", "three\n"} {
				data := &process.StreamInputRequest_DataEvent{Input: &process.ProcessInput{Input: &process.ProcessInput_Stdin{Stdin: []byte(piece)}}}
				if err := in.Send(&process.StreamInputRequest{Event: &process.StreamInputRequest_Data{Data: data}}); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := in.CloseAndReceive(); err != nil {
				t.Fatal(err)
			}
			if _, err := c.CloseStdin(ctx, connect.NewRequest(&process.CloseStdinRequest{Process: sel})); err != nil {
				t.Fatal(err)
			}
			drain(t, s, func() *process.ProcessEvent { return s.Msg().GetEvent() }, ev)
			if got := ev.stdout.String(); got != "one\ntwo three\n" {
				t.Errorf("cat echoed %q", got)
			}
			if ev.end.GetExitCode() != 0 {
				t.Errorf("end %v", ev.end)
			}
		})
	}
}

// SIGKILL ends a process as envd reports a killed one; a pid that runs
// nothing is NotFound (the SDK's kill answers false).
func TestSignal(t *testing.T) {
	e := newEnv(t)
	ctx := testCtx(t)
	c := e.process(connect.WithProtoJSON())
	s, ev := startStream(t, ctx, c, &process.StartRequest{Process: bash("sleep 100")})
	sel := &process.ProcessSelector{Selector: &process.ProcessSelector_Pid{Pid: ev.pid}}
	if _, err := c.SendSignal(ctx, connect.NewRequest(&process.SendSignalRequest{Process: sel, Signal: process.Signal_SIGNAL_SIGKILL})); err != nil {
		t.Fatal(err)
	}
	drain(t, s, func() *process.ProcessEvent { return s.Msg().GetEvent() }, ev)
	if end := ev.end; end.GetExited() || end.GetExitCode() != -1 || end.GetStatus() != "signal: killed" || end.GetError() != "signal: killed" {
		t.Errorf("end of a killed process: %v", end)
	}
	_, err := c.SendSignal(ctx, connect.NewRequest(&process.SendSignalRequest{Process: sel, Signal: process.Signal_SIGNAL_SIGKILL}))
	wantCode(t, err, connect.CodeNotFound)
	_, err = c.SendSignal(ctx, connect.NewRequest(&process.SendSignalRequest{Process: sel}))
	wantCode(t, err, connect.CodeInvalidArgument)
}

// The request's deadline (Connect-Timeout-Ms) bounds the process, not just
// the stream, as with envd; a client leaving the stream early does not.
func TestDeadlineEndsProcess(t *testing.T) {
	e := newEnv(t)
	c := e.process(connect.WithProtoJSON())
	ctx := testCtx(t)

	short, cancel := context.WithTimeout(ctx, 1500*time.Millisecond)
	defer cancel()
	s, ev := startStream(t, short, c, &process.StartRequest{Process: bash("sleep 100")})
	for s.Receive() {
	}
	wantCode(t, s.Err(), connect.CodeDeadlineExceeded)
	waitUntil(t, "the process to be ended", func() bool { return !listed(t, ctx, c, ev.pid) })

	left, leave := context.WithCancel(ctx)
	s, ev = startStream(t, left, c, &process.StartRequest{Process: bash("sleep 100")})
	leave()
	for s.Receive() {
	}
	time.Sleep(200 * time.Millisecond) // the server sees the client go
	if !listed(t, ctx, c, ev.pid) {
		t.Fatal("a background process ended with its stream")
	}
	sel := &process.ProcessSelector{Selector: &process.ProcessSelector_Pid{Pid: ev.pid}}
	if _, err := c.SendSignal(ctx, connect.NewRequest(&process.SendSignalRequest{Process: sel, Signal: process.Signal_SIGNAL_SIGTERM})); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "SIGTERM to end the process", func() bool { return !listed(t, ctx, c, ev.pid) })
}

func listed(t *testing.T, ctx context.Context, c processconnect.ProcessClient, pid uint32) bool {
	t.Helper()
	list, err := c.List(ctx, connect.NewRequest(&process.ListRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	return slices.ContainsFunc(list.Msg.GetProcesses(), func(p *process.ProcessInfo) bool { return p.GetPid() == pid })
}

// Connect, by tag, streams a running process's output from then on, with
// keep-alives as often as asked.
func TestConnectByTag(t *testing.T) {
	e := newEnv(t)
	for _, codec := range codecs {
		t.Run(codec.name, func(t *testing.T) {
			ctx := testCtx(t)
			c := e.process(codec.opts...)
			tag, stdin := "job-"+codec.name, true
			s, _ := startStream(t, ctx, c, &process.StartRequest{Process: bash(`read x; echo "got $x"`), Tag: &tag, Stdin: &stdin})
			defer s.Close()

			sel := &process.ProcessSelector{Selector: &process.ProcessSelector_Tag{Tag: tag}}
			req := connect.NewRequest(&process.ConnectRequest{Process: sel})
			req.Header().Set("Keepalive-Ping-Interval", "1")
			cs, err := c.Connect(ctx, req)
			if err != nil {
				t.Fatal(err)
			}
			if !cs.Receive() {
				t.Fatalf("no start event: %v", cs.Err())
			}
			ev := &events{}
			ev.add(t, cs.Msg().GetEvent())
			// A keep-alive comes while the process is quiet.
			for ev.keepalives == 0 && cs.Receive() {
				ev.add(t, cs.Msg().GetEvent())
			}
			list, err := c.List(ctx, connect.NewRequest(&process.ListRequest{}))
			if err != nil {
				t.Fatal(err)
			}
			if !slices.ContainsFunc(list.Msg.GetProcesses(), func(p *process.ProcessInfo) bool { return p.GetTag() == tag && p.GetPid() == ev.pid }) {
				t.Errorf("tag %q not listed with pid %d: %v", tag, ev.pid, list.Msg)
			}
			if _, err := c.SendInput(ctx, connect.NewRequest(&process.SendInputRequest{
				Process: sel, Input: &process.ProcessInput{Input: &process.ProcessInput_Stdin{Stdin: []byte("it\n")}},
			})); err != nil {
				t.Fatal(err)
			}
			drain(t, cs, func() *process.ProcessEvent { return cs.Msg().GetEvent() }, ev)
			if got := ev.stdout.String(); got != "got it\n" {
				t.Errorf("connected stream saw %q", got)
			}
			_, err = c.Connect(ctx, connect.NewRequest(&process.ConnectRequest{Process: sel}))
			if err == nil {
				// A server stream's error may come with its first read.
				cs, _ := c.Connect(ctx, connect.NewRequest(&process.ConnectRequest{Process: sel}))
				for cs.Receive() {
				}
				err = cs.Err()
			}
			wantCode(t, err, connect.CodeNotFound)
		})
	}
}

// A process on a terminal has its output as pty data, takes pty input
// and can be resized.
func TestPty(t *testing.T) {
	e := newEnv(t)
	ctx := testCtx(t)
	c := e.process(connect.WithProtoJSON())
	pty := &process.PTY{Size: &process.PTY_Size{Cols: 80, Rows: 24}}
	s, ev := startStream(t, ctx, c, &process.StartRequest{Process: bash(`read x; stty size; echo "typed $x"`), Pty: pty})
	sel := &process.ProcessSelector{Selector: &process.ProcessSelector_Pid{Pid: ev.pid}}
	if _, err := c.Update(ctx, connect.NewRequest(&process.UpdateRequest{Process: sel, Pty: &process.PTY{Size: &process.PTY_Size{Cols: 100, Rows: 30}}})); err != nil {
		t.Fatal(err)
	}
	if _, err := c.SendInput(ctx, connect.NewRequest(&process.SendInputRequest{
		Process: sel, Input: &process.ProcessInput{Input: &process.ProcessInput_Pty{Pty: []byte("abc\n")}},
	})); err != nil {
		t.Fatal(err)
	}
	drain(t, s, func() *process.ProcessEvent { return s.Msg().GetEvent() }, ev)
	out := ev.pty.String()
	if !strings.Contains(out, "30 100") || !strings.Contains(out, "typed abc") || ev.stdout.Len() != 0 {
		t.Errorf("pty output %q, stdout %q", out, ev.stdout.String())
	}
	_, err := c.Update(ctx, connect.NewRequest(&process.UpdateRequest{Process: sel, Pty: &process.PTY{Size: &process.PTY_Size{}}}))
	if err == nil {
		t.Error("a zero pty size was accepted")
	}
}

// Output comes whole however fast the process writes it, past the
// guest's kept MiB, as with envd.
func TestStartOutputWhole(t *testing.T) {
	e := newEnv(t)
	ctx := testCtx(t)
	c := e.process(connect.WithProtoJSON())
	tag := "big"
	s, ev := startStream(t, ctx, c, &process.StartRequest{Process: bash("head -c 5000000 /dev/zero | tr '\\0' a; echo done >&2; sleep 1"), Tag: &tag})
	if !listed(t, ctx, c, ev.pid) {
		t.Error("a running streamed process is not listed")
	}
	drain(t, s, func() *process.ProcessEvent { return s.Msg().GetEvent() }, ev)
	if n := ev.stdout.Len(); n != 5000000 || bytes.Count(ev.stdout.Bytes(), []byte("a")) != n {
		t.Errorf("got %d bytes of 5000000", n)
	}
	if ev.stderr.String() != "done\n" || ev.end.GetExitCode() != 0 {
		t.Errorf("stderr %q, end %v", ev.stderr.String(), ev.end)
	}
}
