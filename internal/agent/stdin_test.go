package agent

import (
	"bytes"
	"context"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/emberbox/emberbox/internal/agentproto"
)

func spawnReq(req agentproto.ExecRequest) agentproto.Request {
	req.Detach = true
	return agentproto.Request{Method: agentproto.MethodSpawn, Exec: &req}
}

func writeReq(id string, data string, offset *int64, eof bool) agentproto.Request {
	return agentproto.Request{Method: agentproto.MethodProcessWrite,
		Process: &agentproto.ProcessRequest{ID: id, Input: []byte(data), InputOffset: offset, EOF: eof}}
}

func at(n int64) *int64 { return &n }

// spawnOK spawns req and returns the process's info.
func spawnOK(t *testing.T, a *Agent, req agentproto.ExecRequest) *agentproto.ProcessInfo {
	t.Helper()
	rep := call(t, a, spawnReq(req))
	if rep.Error != nil || rep.Process == nil {
		t.Fatalf("spawn: %+v", rep.Error)
	}
	return rep.Process
}

// written sends a write and returns the offset answered, failing on an error.
func written(t *testing.T, a *Agent, id, data string, offset *int64, eof bool) int64 {
	t.Helper()
	rep := call(t, a, writeReq(id, data, offset, eof))
	if rep.Error != nil || rep.Process == nil {
		t.Fatalf("write %q at %v: %+v", data, offset, rep.Error)
	}
	return rep.Process.StdinOffset
}

// outputUntil reads id's output until it matches re or the process ended,
// and returns all of it.
func outputUntil(t *testing.T, a *Agent, id string, re *regexp.Regexp) string {
	t.Helper()
	p, err := a.procs.get(id)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var out bytes.Buffer
	matched := errorString("matched")
	err = p.output(ctx, 0, true, 0, func(ev agentproto.Event) error {
		out.Write(ev.Data)
		if re != nil && re.Match(out.Bytes()) {
			return matched
		}
		return nil
	})
	if err != nil && err != matched {
		t.Fatalf("output of %s: %v; so far %q", id, err, out.String())
	}
	return out.String()
}

type errorString string

func (e errorString) Error() string { return string(e) }

func waitEnded(t *testing.T, a *Agent, id string) agentproto.ProcessInfo {
	t.Helper()
	p, err := a.procs.get(id)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := p.wait(ctx); err != nil {
		t.Fatalf("%s did not end: %v", id, err)
	}
	return p.info()
}

func TestStdinPipeOffsets(t *testing.T) {
	a := newTestAgent(t, os.Geteuid(), os.Getegid(), t.TempDir())
	info := spawnOK(t, a, agentproto.ExecRequest{Argv: []string{"cat"}, StdinPipe: true})
	if !info.StdinOpen || info.StdinOffset != 0 || info.User != "user" {
		t.Fatalf("spawned: %+v", info)
	}
	id := info.ID
	if got := written(t, a, id, "hello ", at(0), false); got != 6 {
		t.Fatalf("offset after hello: %d", got)
	}
	// A retry of the same write is not typed twice.
	if got := written(t, a, id, "hello ", at(0), false); got != 6 {
		t.Fatalf("offset after the retry: %d", got)
	}
	// A write that overlaps what was accepted adds only the rest.
	if got := written(t, a, id, "hello wor", at(0), false); got != 9 {
		t.Fatalf("offset after the overlap: %d", got)
	}
	// A gap is refused.
	if rep := call(t, a, writeReq(id, "x", at(20), false)); rep.Error == nil || rep.Error.Code != agentproto.CodeStdinGap {
		t.Fatalf("gap: %+v", rep.Error)
	}
	if got := written(t, a, id, "ld\n", at(9), true); got != 12 {
		t.Fatalf("offset after eof: %d", got)
	}
	// Retried after the end of input: answered, nothing typed.
	if got := written(t, a, id, "ld\n", at(9), true); got != 12 {
		t.Fatalf("offset of the retried eof: %d", got)
	}
	if rep := call(t, a, writeReq(id, "more", at(12), false)); rep.Error == nil || rep.Error.Code != agentproto.CodeStdinClosed {
		t.Fatalf("write after eof: %+v", rep.Error)
	}
	end := waitEnded(t, a, id)
	if end.ExitCode == nil || *end.ExitCode != 0 || end.StdinOpen || end.StdinOffset != 12 {
		t.Fatalf("ended: %+v", end)
	}
	if out := outputUntil(t, a, id, nil); out != "hello world\n" {
		t.Fatalf("cat printed %q", out)
	}
}

func TestStdinRefused(t *testing.T) {
	a := newTestAgent(t, os.Geteuid(), os.Getegid(), t.TempDir())
	info := spawnOK(t, a, agentproto.ExecRequest{Argv: []string{"true"}})
	if info.StdinOpen {
		t.Fatalf("a process without stdinPipe reports open input: %+v", info)
	}
	if rep := call(t, a, writeReq(info.ID, "x", nil, false)); rep.Error == nil || rep.Error.Code != agentproto.CodeStdinClosed {
		t.Fatalf("write to a process without input: %+v", rep.Error)
	}
	rep := call(t, a, agentproto.Request{Method: agentproto.MethodProcessResize,
		Process: &agentproto.ProcessRequest{ID: info.ID, Size: &agentproto.PtySize{Cols: 80, Rows: 24}}})
	if rep.Error == nil || rep.Error.Code != agentproto.CodeNotATerminal {
		t.Fatalf("resize of a process without a terminal: %+v", rep.Error)
	}
	for _, bad := range []agentproto.ExecRequest{
		{Argv: []string{"cat"}, Pty: &agentproto.PtySize{Cols: 0, Rows: 24}},
		{Argv: []string{"cat"}, Pty: &agentproto.PtySize{Cols: 80, Rows: agentproto.MaxPtySide + 1}},
		{Argv: []string{"cat"}, StdinPipe: true, Stdin: []byte("x")},
	} {
		if rep := call(t, a, spawnReq(bad)); rep.Error == nil || rep.Error.Code != agentproto.CodeInvalid {
			t.Errorf("spawn %+v: %+v, want invalid_request", bad, rep.Error)
		}
	}
	// Exec has no later writes to take input from.
	rep = call(t, a, agentproto.Request{Method: agentproto.MethodExec, Exec: &agentproto.ExecRequest{Argv: []string{"cat"}, StdinPipe: true}})
	if rep.Error == nil || rep.Error.Code != agentproto.CodeInvalid {
		t.Fatalf("exec with stdinPipe: %+v", rep.Error)
	}
}

// A process that does not read its input holds at most MaxStdinBuffer of it.
func TestStdinBounded(t *testing.T) {
	a := newTestAgent(t, os.Geteuid(), os.Getegid(), t.TempDir())
	info := spawnOK(t, a, agentproto.ExecRequest{Argv: []string{"sleep", "60"}, StdinPipe: true})
	big := strings.Repeat("x", 2*agentproto.MaxStdinBuffer)
	if got := written(t, a, info.ID, big, at(0), false); got != agentproto.MaxStdinBuffer {
		t.Fatalf("accepted %d of %d bytes, want the buffer's %d", got, len(big), agentproto.MaxStdinBuffer)
	}
	if got := written(t, a, info.ID, big[agentproto.MaxStdinBuffer:], at(agentproto.MaxStdinBuffer), false); got != agentproto.MaxStdinBuffer {
		t.Fatalf("a full buffer accepted more: offset %d", got)
	}
	p, _ := a.procs.get(info.ID)
	if err := p.signal(9); err != nil {
		t.Fatal(err)
	}
	end := waitEnded(t, a, info.ID)
	if end.StdinOpen {
		t.Fatalf("input open after the end: %+v", end)
	}
	if rep := call(t, a, writeReq(info.ID, "x", nil, false)); rep.Error == nil || rep.Error.Code != agentproto.CodeStdinClosed {
		t.Fatalf("write after the end: %+v", rep.Error)
	}
}

func TestPtyEchoResizeEOF(t *testing.T) {
	a := newTestAgent(t, os.Geteuid(), os.Getegid(), t.TempDir())
	info := spawnOK(t, a, agentproto.ExecRequest{
		Command: `tty; stty size; read line; echo "got:$line"; stty size; exec cat`,
		Pty:     &agentproto.PtySize{Cols: 80, Rows: 24}})
	if info.Pty == nil || info.Pty.Cols != 80 || !info.StdinOpen {
		t.Fatalf("spawned: %+v", info)
	}
	id := info.ID
	outputUntil(t, a, id, regexp.MustCompile(`/dev/pts/\d+\r\n24 80\r\n`))
	rep := call(t, a, agentproto.Request{Method: agentproto.MethodProcessResize,
		Process: &agentproto.ProcessRequest{ID: id, Size: &agentproto.PtySize{Cols: 100, Rows: 30}}})
	if rep.Error != nil || rep.Process == nil || rep.Process.Pty == nil || *rep.Process.Pty != (agentproto.PtySize{Cols: 100, Rows: 30}) {
		t.Fatalf("resize: %+v %+v", rep.Process, rep.Error)
	}
	written(t, a, id, "hi there\n", nil, false)
	// The terminal echoes the input, then the shell answers on it.
	outputUntil(t, a, id, regexp.MustCompile(`hi there\r\ngot:hi there\r\n30 100\r\n`))
	// cat echoes a line; EOF at the start of the next line ends it.
	off := written(t, a, id, "abc\n", nil, true)
	if off != int64(len("hi there\nabc\n")) {
		t.Fatalf("offset %d", off)
	}
	end := waitEnded(t, a, id)
	if end.ExitCode == nil || *end.ExitCode != 0 || end.StdinOpen {
		t.Fatalf("ended: %+v", end)
	}
	if out := outputUntil(t, a, id, nil); !strings.HasSuffix(out, "abc\r\nabc\r\n") {
		t.Fatalf("output ends %q", out[max(0, len(out)-40):])
	}
}

// An append (no offset) is taken whole or not at all.
func TestStdinAppendAtomic(t *testing.T) {
	a := newTestAgent(t, os.Geteuid(), os.Getegid(), t.TempDir())
	info := spawnOK(t, a, agentproto.ExecRequest{Argv: []string{"sleep", "60"}, StdinPipe: true})
	defer func() { p, _ := a.procs.get(info.ID); _ = p.signal(9) }()
	if got := written(t, a, info.ID, strings.Repeat("x", agentproto.MaxStdinBuffer-10), nil, false); got != agentproto.MaxStdinBuffer-10 {
		t.Fatalf("offset %d", got)
	}
	rep := call(t, a, writeReq(info.ID, strings.Repeat("y", 20), nil, false))
	if rep.Error == nil || rep.Error.Code != agentproto.CodeStdinFull {
		t.Fatalf("append past the buffer: %+v", rep.Error)
	}
	if got := written(t, a, info.ID, "0123456789", nil, false); got != agentproto.MaxStdinBuffer {
		t.Fatalf("an append that fits: offset %d", got)
	}
}
