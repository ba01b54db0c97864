package agent

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/emberbox/emberbox/internal/agentproto"
)

// FuzzAgentHandshake feeds the agent's handshake what a host (or the stale
// bytes of an earlier one) may send before a valid Hello, and checks that it
// answers exactly one Ready, for the first Hello line with a nonce of 1 to
// 64 bytes, and reads nothing past that line.
func FuzzAgentHandshake(f *testing.F) {
	f.Add([]byte(""))
	f.Add([]byte("EMBERBOX-HELLO 0123456789abcdef01234567\n"))
	f.Add([]byte("garbage\x00\xff\nEMBERBOX-HELLO \nEMBERBOX-HELLO x\r\n"))
	f.Add([]byte("EMBERBOX-HELLO " + strings.Repeat("n", 65) + "\n"))
	f.Add([]byte("  EMBERBOX-HELLO abc\nEMBERBOX-HELLOabc\n"))
	f.Add([]byte("J\x00\x00\x00\x02{}"))
	f.Fuzz(func(t *testing.T, stale []byte) {
		const last = "EMBERBOX-HELLO final-nonce\n"
		in := append(bytes.Clone(stale), "\n"+last+"after"...)
		br := bufio.NewReader(bytes.NewReader(in))
		var out bytes.Buffer
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := handshake(ctx, br, &out); err != nil {
			t.Fatalf("handshake: %v", err)
		}
		// The reference: the first line that is a Hello with a good nonce.
		want := "final-nonce"
		consumed := 0
		for _, line := range strings.SplitAfter(string(in), "\n") {
			consumed += len(line)
			n, ok := strings.CutPrefix(strings.TrimRight(line, "\r\n"), agentproto.HelloPrefix)
			if ok && len(n) > 0 && len(n) <= 64 {
				want = n
				break
			}
		}
		if got := out.String(); got != agentproto.ReadyPrefix+want+" 1\n" {
			t.Fatalf("answered %q, want the nonce %q", got, want)
		}
		if rest, _ := io.ReadAll(br); !bytes.Equal(rest, in[consumed:]) {
			t.Fatalf("left %q unread, want %q", rest, in[consumed:])
		}
	})
}

// fuzzAgent is an agent whose accounts and files live under a temporary
// root: fuzzed file paths are re-rooted there, and, when the tests run as
// root, file operations run as an unprivileged uid as well, so a fuzzed
// request can change nothing outside the sandbox's home.
type fuzzAgent struct {
	*Agent
	sys        *fakeSystem // renew changes nothing of the host's
	root, home string
	uid, gid   int
	passwd     []byte
}

func newFuzzAgent(f *testing.F) *fuzzAgent {
	dir := f.TempDir()
	root := filepath.Join(dir, "root")
	home := filepath.Join(root, "home", "user")
	uid, gid := os.Geteuid(), os.Getegid()
	if uid == 0 {
		uid, gid = 65534, 65534
	}
	for _, d := range []string{filepath.Dir(dir), dir} {
		// The unprivileged uid must reach the home.
		if err := os.Chmod(d, 0o755); err != nil {
			f.Fatal(err)
		}
	}
	if err := os.MkdirAll(filepath.Join(root, "etc"), 0o755); err != nil {
		f.Fatal(err)
	}
	passwd := fmt.Sprintf("root:x:0:0:root:/root:/bin/bash\nuser:x:%d:%d::%s:/bin/bash\n", uid, gid, home)
	group := fmt.Sprintf("root:x:0:\nuser:x:%d:\n", gid)
	if err := os.WriteFile(filepath.Join(root, "etc/passwd"), []byte(passwd), 0o644); err != nil {
		f.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "etc/group"), []byte(group), 0o644); err != nil {
		f.Fatal(err)
	}
	a, err := New(Config{Root: root, User: "user"})
	if err != nil {
		f.Fatal(err)
	}
	sys := newFakeSystem()
	a.sys = sys
	bootID := filepath.Join(root, bootIDPath)
	if err := os.MkdirAll(filepath.Dir(bootID), 0o755); err != nil {
		f.Fatal(err)
	}
	if err := os.WriteFile(bootID, []byte(kernelBootID), 0o444); err != nil {
		f.Fatal(err)
	}
	fa := &fuzzAgent{Agent: a, sys: sys, root: root, home: home, uid: uid, gid: gid, passwd: []byte(passwd)}
	fa.reset(f)
	fa.addProcesses(f)
	return fa
}

// addProcesses gives the process table an ended process whose output left
// the ring and, to signal, one running harmless fixed command.
func (fa *fuzzAgent) addProcesses(f *testing.F) {
	p := &process{command: "generated", cwd: fa.home, state: agentproto.StateRunning, changed: make(chan struct{}), started: time.Now()}
	fa.procs.add(p) // proc_1
	for i := range 3 {
		p.emit([]string{agentproto.Stdout, agentproto.Stderr}[i%2], bytes.Repeat([]byte{'a' + byte(i)}, 600<<10))
	}
	now, code := time.Now(), 0
	p.mu.Lock()
	p.ended, p.exitCode, p.state = &now, &code, agentproto.StateExited
	p.mu.Unlock()
	sleep, err := fa.start(&agentproto.ExecRequest{Argv: []string{"sleep", "600"}, TimeoutMs: 600_000}, nil, nil) // proc_2
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { _ = sleep.signal(9) })
	// proc_3 takes input it never reads: writes fill its bounded buffer.
	reader, err := fa.start(&agentproto.ExecRequest{Argv: []string{"sleep", "600"}, TimeoutMs: 600_000, StdinPipe: true}, nil, nil)
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { _ = reader.signal(9) })
}

func ptrTo[T any](v T) *T { return &v }

// reset gives each input the same home: a file, a hidden file and a
// directory with a file.
func (fa *fuzzAgent) reset(t testing.TB) {
	// A chmod may have closed directories to their owner.
	_ = filepath.WalkDir(fa.home, func(p string, d os.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			_ = os.Chmod(p, 0o700)
		}
		return nil
	})
	if err := os.RemoveAll(fa.home); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{fa.home, filepath.Join(fa.home, "d")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for name, data := range map[string]string{"f.txt": "hello\n", ".hidden": "x", "d/x": "xx"} {
		if err := os.WriteFile(filepath.Join(fa.home, name), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range []string{fa.home, filepath.Join(fa.home, "d"), filepath.Join(fa.home, "f.txt"), filepath.Join(fa.home, ".hidden"), filepath.Join(fa.home, "d/x")} {
		if err := os.Chown(p, fa.uid, fa.gid); err != nil {
			t.Fatal(err)
		}
	}
}

// within reports whether p is dir or below it.
func within(dir, p string) bool {
	return p == dir || strings.HasPrefix(p, dir+"/")
}

func requestFrame(req agentproto.Request, data string) []byte {
	b, _ := json.Marshal(req)
	out := append([]byte{agentproto.KindJSON}, binary.BigEndian.AppendUint32(nil, uint32(len(b)))...)
	out = append(out, b...)
	if data != "" {
		out = append(out, agentproto.KindData)
		out = binary.BigEndian.AppendUint32(out, uint32(len(data)))
		out = append(out, data...)
	}
	return out
}

// FuzzAgentRequest decodes a fuzzed call the way the agent's stream handler
// does and dispatches it. Calls that would start a process (exec, spawn) are
// only checked for their refusal of a missing body, configure never touches
// the machine's CA bundle or hostname, renew changes a fake system and
// files under the temporary root (and succeeds only when it applied every
// field it was given), and file paths are re-rooted under a
// temporary root (see fuzzAgent). It checks that path resolution gives a
// clean absolute path that a relative path without ".." keeps under the
// home; that every failure is a coded error and every success is one frame
// of the shape the method promises (file bytes in data frames, processes'
// output as events); that listings respect their depth and limit; and that
// nothing outside the home changes and the home is never removed.
func FuzzAgentRequest(f *testing.F) {
	file := func(method string, fr agentproto.FileRequest) agentproto.Request {
		return agentproto.Request{Method: method, File: &fr}
	}
	proc := func(method string, pr agentproto.ProcessRequest) agentproto.Request {
		return agentproto.Request{Method: method, Process: &pr}
	}
	for _, tc := range []struct {
		req  agentproto.Request
		data string
	}{
		{agentproto.Request{Method: agentproto.MethodInfo}, ""},
		{agentproto.Request{Method: agentproto.MethodConfigure, Configure: &agentproto.ConfigureRequest{Env: map[string]string{"A": "b"}}}, ""},
		{agentproto.Request{Method: agentproto.MethodConfigure}, ""},
		{agentproto.Request{Method: agentproto.MethodSecretEnv, SecretEnv: &agentproto.SecretEnvRequest{Env: map[string]string{"API_TOKEN": "emberbox-secret-00"}}}, ""},
		{agentproto.Request{Method: agentproto.MethodSecretEnv, SecretEnv: &agentproto.SecretEnvRequest{Env: map[string]string{"A=B": "x", "": "\x00"}}}, ""},
		{agentproto.Request{Method: agentproto.MethodSecretEnv}, ""},
		{agentproto.Request{Method: agentproto.MethodExec}, ""},
		{agentproto.Request{Method: agentproto.MethodSpawn}, ""},
		{agentproto.Request{Method: agentproto.MethodProcessList}, ""},
		{proc(agentproto.MethodProcessGet, agentproto.ProcessRequest{ID: "proc_1"}), ""},
		{proc(agentproto.MethodProcessOutput, agentproto.ProcessRequest{ID: "proc_1", Cursor: 100}), ""},
		{proc(agentproto.MethodProcessOutput, agentproto.ProcessRequest{ID: "proc_1", Cursor: 1 << 20, Follow: true}), ""},
		{proc(agentproto.MethodProcessOutput, agentproto.ProcessRequest{ID: "proc_2", WaitMs: 100}), ""},
		{proc(agentproto.MethodProcessSignal, agentproto.ProcessRequest{ID: "proc_2", Signal: "CONT"}), ""},
		{proc(agentproto.MethodProcessSignal, agentproto.ProcessRequest{ID: "proc_1", Signal: "SIGBOGUS"}), ""},
		{proc(agentproto.MethodProcessWrite, agentproto.ProcessRequest{ID: "proc_2", Input: []byte("x")}), ""},
		{proc(agentproto.MethodProcessWrite, agentproto.ProcessRequest{ID: "proc_3", Input: []byte("hi\n"), InputOffset: new(int64)}), ""},
		{proc(agentproto.MethodProcessWrite, agentproto.ProcessRequest{ID: "proc_3", Input: []byte("x"), InputOffset: ptrTo(int64(1 << 40)), EOF: true}), ""},
		{proc(agentproto.MethodProcessResize, agentproto.ProcessRequest{ID: "proc_3", Size: &agentproto.PtySize{Cols: 80, Rows: 24}}), ""},
		{proc(agentproto.MethodProcessResize, agentproto.ProcessRequest{ID: "proc_2"}), ""},
		{proc("process.other", agentproto.ProcessRequest{ID: "proc_1"}), ""},
		{file(agentproto.MethodFileStat, agentproto.FileRequest{Path: "f.txt"}), ""},
		{file(agentproto.MethodFileStat, agentproto.FileRequest{Path: "/home/user/../../etc/passwd"}), ""},
		{file(agentproto.MethodFileList, agentproto.FileRequest{Path: "", Depth: 3, Hidden: true, Limit: 2}), ""},
		{file(agentproto.MethodFileList, agentproto.FileRequest{Path: "d", Depth: -1, Limit: -1}), ""},
		{file(agentproto.MethodFileMkdir, agentproto.FileRequest{Path: "a/b/c", Parents: true, Mode: 0o700}), ""},
		{file(agentproto.MethodFileChmod, agentproto.FileRequest{Path: "f.txt", Mode: 0o4755}), ""},
		{file(agentproto.MethodFileChmod, agentproto.FileRequest{Path: "", Mode: 0o755}), ""},
		{file(agentproto.MethodFileRemove, agentproto.FileRequest{Path: "d", Recursive: true}), ""},
		{file(agentproto.MethodFileRemove, agentproto.FileRequest{Path: ".", Recursive: true}), ""},
		{file(agentproto.MethodFileRemove, agentproto.FileRequest{Path: "/", Recursive: true}), ""},
		{file(agentproto.MethodFileWrite, agentproto.FileRequest{Path: "new/file", Size: 5, Mode: 0o600}), "hello"},
		{file(agentproto.MethodFileWrite, agentproto.FileRequest{Path: "short", Size: 9}), "abc"},
		{file(agentproto.MethodFileWrite, agentproto.FileRequest{Path: "d", Size: 1}), "x"},
		{file(agentproto.MethodFileWrite, agentproto.FileRequest{Path: "f.txt", Size: -1}), ""},
		{file(agentproto.MethodFileRead, agentproto.FileRequest{Path: "f.txt"}), ""},
		{file(agentproto.MethodFileRead, agentproto.FileRequest{Path: "d"}), ""},
		{file(agentproto.MethodFileStat, agentproto.FileRequest{Path: "a\x00b"}), ""},
		{file(agentproto.MethodFileStat, agentproto.FileRequest{Path: "f.txt", User: "nobody-here"}), ""},
		{agentproto.Request{Method: agentproto.MethodRenew, Renew: &agentproto.RenewRequest{Seed: []byte("seed"), UnixNano: 1_800_000_000_000_000_000}}, ""},
		{agentproto.Request{Method: agentproto.MethodRenew, Renew: &fullRenew}, ""},
		{agentproto.Request{Method: agentproto.MethodRenew, Renew: &agentproto.RenewRequest{Hostname: "a-.b", MachineID: "0123", BootID: "x", UnixNano: -1}}, ""},
		{agentproto.Request{Method: agentproto.MethodRenew}, ""},
		{agentproto.Request{Method: "bogus"}, ""},
	} {
		f.Add(requestFrame(tc.req, tc.data))
	}
	f.Add([]byte("J\x00\x00\x00\x04null"))
	f.Add([]byte("D\x00\x00\x00\x02{}"))
	fa := newFuzzAgent(f)
	f.Fuzz(func(t *testing.T, data []byte) {
		fa.checkRequest(t, data)
	})
}

func (fa *fuzzAgent) checkRequest(t *testing.T, data []byte) {
	var out bytes.Buffer
	c := agentproto.NewConn(struct {
		io.Reader
		io.Writer
	}{bytes.NewReader(data), &out})
	var req agentproto.Request
	if err := c.ReadJSON(&req); err != nil {
		return // handle ends the stream without an answer
	}
	switch req.Method {
	case agentproto.MethodExec, agentproto.MethodSpawn:
		if req.Exec != nil {
			return // would start a process
		}
	case agentproto.MethodConfigure:
		if req.Configure != nil {
			req.Configure.CACerts, req.Configure.Hostname = "", ""
		}
	case agentproto.MethodProcessOutput:
		if req.Process != nil {
			req.Process.Follow, req.Process.WaitMs = false, 0
		}
	}
	if fr := req.File; fr != nil {
		if fr.User == "root" {
			fr.User = ""
		}
		if path.IsAbs(fr.Path) {
			fr.Path = fa.root + fr.Path
		}
		if checkPath(fr.Path) == nil && !fa.checkResolve(t, fr.Path) {
			return // a ".." leads out of what the test may change
		}
	}
	fa.reset(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if req.Method == agentproto.MethodRenew && req.Renew != nil {
		defer fa.checkRenew(t, req.Renew, &out)
	}
	if err := fa.dispatch(ctx, c, &req); err != nil {
		var pe *agentproto.Error
		if !errors.As(err, &pe) {
			t.Fatalf("%s: error without a code: %v", req.Method, err)
		}
		if pe.Code == "" {
			t.Fatalf("%s: error with an empty code: %+v", req.Method, pe)
		}
		if out.Len() != 0 && req.Method != agentproto.MethodFileRead {
			t.Fatalf("%s: failed after answering %q", req.Method, out.Bytes())
		}
	} else {
		fa.checkAnswer(t, &req, out.Bytes())
	}
	if ctx.Err() != nil {
		t.Fatalf("%s: took more than 10 s", req.Method)
	}
	if _, err := os.Stat(fa.home); err != nil {
		t.Fatalf("%s %+v: home gone: %v", req.Method, req.File, err)
	}
	if os.Geteuid() == 0 {
		if b, err := os.ReadFile(filepath.Join(fa.root, "etc/passwd")); err != nil || !bytes.Equal(b, fa.passwd) {
			t.Fatalf("%s %+v: a file outside the home changed: %q %v", req.Method, req.File, b, err)
		}
	}
}

// checkRenew checks that a renew that answered OK applied each field it
// was given, that one that did not changed nothing but the entropy pool,
// and that the boot id is never bound more than once.
func (fa *fuzzAgent) checkRenew(t *testing.T, req *agentproto.RenewRequest, out *bytes.Buffer) {
	var rep agentproto.Reply
	ok := agentproto.NewConn(struct {
		io.Reader
		io.Writer
	}{bytes.NewReader(out.Bytes()), io.Discard}).ReadJSON(&rep) == nil && rep.OK
	fa.sys.mu.Lock()
	calls, hostname, clock := fa.sys.calls, fa.sys.hostname, fa.sys.clock
	binds := len(fa.sys.binds[filepath.Join(fa.root, bootIDPath)])
	fa.sys.calls, fa.sys.hostname, fa.sys.clock = nil, "", time.Time{}
	fa.sys.mu.Unlock()
	if binds > 1 {
		t.Fatalf("renew %+v: boot id bound %d times", req, binds)
	}
	if !ok {
		if len(calls) > 1 || len(calls) == 1 && calls[0] != "reseed" {
			t.Fatalf("renew %+v failed after changing the system: %v", req, calls)
		}
		return
	}
	if len(req.Seed) > 0 && (len(calls) == 0 || calls[0] != "reseed") {
		t.Fatalf("renew %+v: the seed did not go first: %v", req, calls)
	}
	if req.UnixNano != 0 && !clock.IsZero() && clock.UnixNano() != req.UnixNano {
		t.Fatalf("renew %+v: clock set to %v", req, clock)
	}
	if req.Hostname != "" {
		b, _ := os.ReadFile(filepath.Join(fa.root, hostnamePath))
		if hostname != req.Hostname || string(b) != req.Hostname+"\n" {
			t.Fatalf("renew %+v: hostname %q, /etc/hostname %q", req, hostname, b)
		}
	}
	if req.MachineID != "" {
		if b, _ := os.ReadFile(filepath.Join(fa.root, machineIDPath)); string(b) != req.MachineID+"\n" {
			t.Fatalf("renew %+v: /etc/machine-id %q", req, b)
		}
	}
	if req.BootID != "" {
		if b, _ := os.ReadFile(filepath.Join(fa.root, bootIDPath)); !strings.EqualFold(string(b), req.BootID+"\n") {
			t.Fatalf("renew %+v: boot_id reads %q", req, b)
		}
	}
}

// checkResolve checks resolvePath for p and reports whether the path it
// gives is one the test lets the agent act on: under the temporary root
// when file operations run as an unprivileged uid, else under the home.
func (fa *fuzzAgent) checkResolve(t *testing.T, p string) bool {
	r := resolvePath(fa.home, p)
	if !path.IsAbs(r) || path.Clean(r) != r {
		t.Fatalf("%q resolved to %q: not clean and absolute", p, r)
	}
	if resolvePath(fa.home, r) != r {
		t.Fatalf("%q resolved to %q, which resolves to %q", p, r, resolvePath(fa.home, r))
	}
	if !path.IsAbs(p) && !strings.Contains(p, "..") && !within(fa.home, r) {
		t.Fatalf("relative %q resolved to %q, outside the home %q", p, r, fa.home)
	}
	if os.Geteuid() == 0 {
		return within(fa.root, r)
	}
	return within(fa.home, r)
}

// checkAnswer checks what a successful call wrote.
func (fa *fuzzAgent) checkAnswer(t *testing.T, req *agentproto.Request, b []byte) {
	c := agentproto.NewConn(struct {
		io.Reader
		io.Writer
	}{bytes.NewReader(b), io.Discard})
	if req.Method == agentproto.MethodProcessOutput {
		var last agentproto.Event
		for {
			var ev agentproto.Event
			if err := c.ReadJSON(&ev); err != nil {
				if err != io.EOF {
					t.Fatalf("output: bad event stream %q: %v", b, err)
				}
				break
			}
			if last.Type == "exit" || last.Type == "error" {
				t.Fatalf("output: %+v after the end", ev)
			}
			switch ev.Type {
			case agentproto.Stdout, agentproto.Stderr, "truncated", "exit", "error":
			default:
				t.Fatalf("output: event type %q", ev.Type)
			}
			if ev.Offset < 0 || ev.Dropped < 0 {
				t.Fatalf("output: negative offset in %+v", ev)
			}
			last = ev
		}
		return
	}
	var rep agentproto.Reply
	if err := c.ReadJSON(&rep); err != nil {
		t.Fatalf("%s: answer %q: %v", req.Method, b, err)
	}
	if rep.Error != nil {
		if rep.Error.Code == "" {
			t.Fatalf("%s: error without a code", req.Method)
		}
		return
	}
	var ok bool
	switch req.Method {
	case agentproto.MethodInfo:
		ok = rep.Info != nil && rep.Info.Version == agentproto.Version
	case agentproto.MethodConfigure, agentproto.MethodRenew, agentproto.MethodSecretEnv:
		ok = rep.OK
	case agentproto.MethodProcessList:
		ok = rep.Processes != nil
	case agentproto.MethodProcessGet, agentproto.MethodProcessSignal, agentproto.MethodProcessResize:
		ok = rep.Process != nil && rep.Process.ID == req.Process.ID
	case agentproto.MethodProcessWrite:
		ok = rep.Process != nil && rep.Process.ID == req.Process.ID
		// A write at an offset is refused (a gap) or reaches it.
		if at := req.Process.InputOffset; ok && at != nil && rep.Process.StdinOffset < *at {
			t.Fatalf("write at %d answered offset %d", *at, rep.Process.StdinOffset)
		}
	case agentproto.MethodFileList:
		ok = true // an empty listing carries no entries
		if limit := agentproto.ListLimit(req.File.Limit); len(rep.Entries) > limit {
			t.Fatalf("list: %d entries, limit %d", len(rep.Entries), req.File.Limit)
		}
		dir := resolvePath(fa.home, req.File.Path)
		depth := min(max(req.File.Depth, 1), maxListDepth)
		for _, e := range rep.Entries {
			rel := strings.TrimPrefix(e.Path, dir+"/")
			if !within(dir, e.Path) || e.Path == dir || strings.Count(rel, "/") >= depth {
				t.Fatalf("list %q depth %d: entry %q", dir, depth, e.Path)
			}
			if !req.File.Hidden && strings.HasPrefix(e.Name, ".") {
				t.Fatalf("list: hidden entry %q", e.Path)
			}
			checkEntry(t, fa.root, &e)
		}
	case agentproto.MethodFileRemove:
		ok = rep.Removed != nil
	case agentproto.MethodFileRead:
		ok = rep.Entry != nil
		if ok {
			checkEntry(t, fa.root, rep.Entry)
			var n int64
			for {
				kind, p, err := c.ReadFrame()
				if err != nil {
					t.Fatalf("read: stream ends without a reply: %v", err)
				}
				if kind == agentproto.KindData {
					if len(p) > agentproto.DataChunk {
						t.Fatalf("read: data frame of %d bytes", len(p))
					}
					n += int64(len(p))
					continue
				}
				var end agentproto.Reply
				if err := json.Unmarshal(p, &end); err != nil || (!end.OK && end.Error == nil) {
					t.Fatalf("read: ended with %q", p)
				}
				break
			}
			if n != rep.Entry.Size {
				t.Fatalf("read: %d bytes of a file of %d", n, rep.Entry.Size)
			}
		}
	default: // stat, mkdir, chmod, write
		ok = rep.Entry != nil
		if ok {
			checkEntry(t, fa.root, rep.Entry)
			if want := resolvePath(fa.home, req.File.Path); rep.Entry.Path != want {
				t.Fatalf("%s %q: entry of %q, want %q", req.Method, req.File.Path, rep.Entry.Path, want)
			}
			if req.Method == agentproto.MethodFileWrite && rep.Entry.Size != req.File.Size {
				t.Fatalf("write: %d bytes asked, file has %d", req.File.Size, rep.Entry.Size)
			}
		}
	}
	if !ok {
		t.Fatalf("%s: answer %q lacks its result", req.Method, b)
	}
	if req.Method != agentproto.MethodFileRead {
		if _, _, err := c.ReadFrame(); err != io.EOF {
			t.Fatalf("%s: more than one frame in %q", req.Method, b)
		}
	}
}

// checkEntry checks an entry is under root and its mode is permission bits.
func checkEntry(t *testing.T, root string, e *agentproto.FileEntry) {
	if !within(root, e.Path) {
		t.Fatalf("entry %q outside %q", e.Path, root)
	}
	if m, err := strconv.ParseUint(e.Mode, 8, 32); err != nil || m > 0o7777 {
		t.Fatalf("entry %q: mode %q", e.Path, e.Mode)
	}
}
