// Command hostile is what root in a sandbox can do to the host: it takes
// over the agent's channel and answers the host's calls itself. It is built
// on the host by internal/integration's TestHostileGuest, uploaded into a
// sandbox and run as root.
//
// It finds the agent's virtio-serial port among PID 1's descriptors,
// duplicates it (pidfd_getfd), freezes every thread of PID 1 (ptrace
// PTRACE_SEIZE + PTRACE_INTERRUPT: init ignores SIGSTOP), and breaks the
// host's session by writing bytes no yamux header starts with. The host
// then reconnects, and this program answers its Hello and serves yamux as
// the agent would, with answers a real agent never gives. The test drives
// it through the API: an exec's command names the next attack, and the
// answer is this program's.
package main

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"log"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/yamux"
	"golang.org/x/net/dns/dnsmessage"
	"golang.org/x/sys/unix"

	"github.com/emberbox/emberbox/internal/agentproto"
)

func main() {
	log.SetFlags(log.Lmicroseconds)
	// ptrace ties tracees to the tracing thread: stay on this one.
	runtime.LockOSThread()
	port, err := takeOver()
	if err != nil {
		log.Fatal(err)
	}
	log.Print("took over the agent's port; breaking the host's session")
	h := &hostile{port: port}
	h.breakSession()
	h.run()
}

// takeOver duplicates PID 1's virtio-serial descriptor and freezes PID 1.
func takeOver() (*os.File, error) {
	fds, err := os.ReadDir("/proc/1/fd")
	if err != nil {
		return nil, err
	}
	target := -1
	for _, e := range fds {
		l, err := os.Readlink(filepath.Join("/proc/1/fd", e.Name()))
		if err == nil && strings.HasPrefix(l, "/dev/vport") {
			target, _ = strconv.Atoi(e.Name())
			log.Printf("agent port: fd %d -> %s", target, l)
		}
	}
	if target < 0 {
		return nil, fmt.Errorf("no /dev/vport* among PID 1's descriptors")
	}
	pidfd, err := unix.PidfdOpen(1, 0)
	if err != nil {
		return nil, fmt.Errorf("pidfd_open(1): %w", err)
	}
	fd, err := unix.PidfdGetfd(pidfd, target, 0)
	if err != nil {
		return nil, fmt.Errorf("pidfd_getfd: %w", err)
	}
	if err := freeze(1); err != nil {
		return nil, err
	}
	return os.NewFile(uintptr(fd), "agent-port"), nil
}

// freeze stops every thread of pid under ptrace until this program exits.
func freeze(pid int) error {
	seized := map[int]bool{}
	for round := 0; round < 10; round++ {
		tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
		if err != nil {
			return err
		}
		added := 0
		for _, t := range tasks {
			tid, _ := strconv.Atoi(t.Name())
			if seized[tid] {
				continue
			}
			if err := unix.PtraceSeize(tid); err != nil {
				return fmt.Errorf("PTRACE_SEIZE %d: %w", tid, err)
			}
			if err := unix.PtraceInterrupt(tid); err != nil {
				return fmt.Errorf("PTRACE_INTERRUPT %d: %w", tid, err)
			}
			var ws unix.WaitStatus
			if _, err := unix.Wait4(tid, &ws, unix.WALL, nil); err != nil {
				return fmt.Errorf("waiting for %d to stop: %w", tid, err)
			}
			seized[tid] = true
			added++
		}
		if added == 0 {
			log.Printf("froze %d threads of PID %d", len(seized), pid)
			return nil
		}
	}
	return fmt.Errorf("PID %d keeps starting threads", pid)
}

type hostile struct {
	port  *os.File
	br    *bufio.Reader
	wmu   sync.Mutex // writes to the port
	flap  atomic.Bool
	stats sync.Map // name → *atomic.Int64
}

func (h *hostile) count(name string, n int64) {
	v, _ := h.stats.LoadOrStore(name, new(atomic.Int64))
	v.(*atomic.Int64).Add(n)
}

func (h *hostile) report() string {
	var b strings.Builder
	h.stats.Range(func(k, v any) bool {
		fmt.Fprintf(&b, "%s=%d ", k, v.(*atomic.Int64).Load())
		return true
	})
	return strings.TrimSpace(b.String())
}

func (h *hostile) write(p []byte) {
	h.wmu.Lock()
	defer h.wmu.Unlock()
	_, _ = h.port.Write(p)
}

// breakSession writes bytes that end whatever yamux session the host has
// on the port (no header starts with 0xff; more than a frame's body, in
// case the agent froze between a header and its body), then ends the line
// so the next Ready starts one.
func (h *hostile) breakSession() {
	h.write(append(bytes.Repeat([]byte{0xff}, 512<<10), '\n'))
}

// run answers the host's connections forever.
func (h *hostile) run() {
	h.br = bufio.NewReaderSize(h.port, 64<<10)
	for {
		nonce := h.waitHello()
		h.count("hellos", 1)
		h.write([]byte(agentproto.ReadyPrefix + nonce + " 1\n"))
		if h.flap.Load() {
			// Drop the session right after the handshake.
			h.breakSession()
			continue
		}
		h.serve()
	}
}

// waitHello skips everything up to a Hello line. With no host connected
// the port reads EOF.
func (h *hostile) waitHello() string {
	for {
		line, err := h.br.ReadSlice('\n')
		if err == io.EOF {
			time.Sleep(20 * time.Millisecond)
			continue
		}
		if err != nil && err != bufio.ErrBufferFull {
			log.Fatalf("reading the port: %v", err)
		}
		if n, ok := bytes.CutPrefix(bytes.TrimRight(line, "\r\n"), []byte(agentproto.HelloPrefix)); ok && err == nil {
			return string(n)
		}
	}
}

type nopCloser struct{ io.Writer }

func (nopCloser) Close() error { return nil }

// serve runs one yamux session as the agent would, until it ends.
func (h *hostile) serve() {
	cfg := yamux.DefaultConfig()
	cfg.LogOutput = io.Discard
	cfg.EnableKeepAlive = false
	cfg.StreamOpenTimeout = 0
	cfg.ConnectionWriteTimeout = time.Minute
	cfg.AcceptBacklog = 4096
	w := writerFunc(func(p []byte) (int, error) {
		h.wmu.Lock()
		defer h.wmu.Unlock()
		return h.port.Write(p)
	})
	sess, err := yamux.Server(struct {
		io.Reader
		io.Writer
		io.Closer
	}{h.br, w, nopCloser{}}, cfg)
	if err != nil {
		log.Fatal(err)
	}
	log.Print("serving a host session")
	for {
		st, err := sess.AcceptStream()
		if err != nil {
			log.Printf("session ended: %v", err)
			return
		}
		go h.call(sess, st)
	}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

// call answers one call of the host.
func (h *hostile) call(sess *yamux.Session, st *yamux.Stream) {
	defer st.Close()
	fc := agentproto.NewConn(st)
	var req agentproto.Request
	if err := fc.ReadJSON(&req); err != nil {
		return
	}
	h.count("call."+req.Method, 1)
	switch req.Method {
	case agentproto.MethodInfo:
		_ = fc.WriteJSON(agentproto.Reply{Info: &agentproto.Info{Version: agentproto.Version, KernelRelease: "hostile", CPUs: 1}})
	case agentproto.MethodProcessList:
		// Just under a frame of empty objects: ~1.4 million processes.
		_ = fc.WriteFrame(agentproto.KindJSON, hugeList("processes", agentproto.MaxFrame-64))
	case agentproto.MethodFileList:
		// A frame header that promises more than any frame may hold.
		var hdr [5]byte
		hdr[0] = agentproto.KindJSON
		binary.BigEndian.PutUint32(hdr[1:], 1<<30)
		_, _ = st.Write(hdr[:])
		_, _ = st.Write(bytes.Repeat([]byte{'['}, 64<<10))
	case agentproto.MethodFileStat:
		// Nesting deeper than any decoder should follow.
		_ = fc.WriteFrame(agentproto.KindJSON, append([]byte(`{"entry":`), bytes.Repeat([]byte{'['}, 512<<10)...))
	case agentproto.MethodExec:
		out := h.command(sess, req.Exec)
		zero := 0
		_ = fc.WriteJSON(agentproto.Reply{Exit: &agentproto.ExecResult{ProcessID: "proc_hostile", ExitCode: &zero, Stdout: []byte(out), State: agentproto.StateExited}})
	default:
		_ = fc.WriteJSON(agentproto.Reply{Error: &agentproto.Error{Code: agentproto.CodeUnknownMethod, Message: "hostile: " + req.Method}})
	}
}

func hugeList(key string, size int) []byte {
	b := make([]byte, 0, size)
	b = append(b, `{"`+key+`":[{}`...)
	for len(b) < size-8 {
		b = append(b, `,{}`...)
	}
	return append(b, "]}"...)
}

// command runs the attack an exec names and answers at once.
func (h *hostile) command(sess *yamux.Session, req *agentproto.ExecRequest) string {
	if req == nil {
		return "no request"
	}
	f := strings.Fields(req.Command)
	if len(f) == 0 {
		return "empty"
	}
	n := 0
	if len(f) > 1 {
		n, _ = strconv.Atoi(f[1])
	}
	switch f[0] {
	case "status":
		return h.report()
	case "dnsflood":
		go h.flood(sess, "dns", n, 256, h.dnsStream)
	case "bigdns":
		go h.flood(sess, "bigdns", n, 4, h.bigDNSStream)
	case "halfclosed":
		go h.flood(sess, "halfclosed", n, 512, h.halfClosedStream)
	case "flap":
		h.flap.Store(true)
		go func() {
			time.Sleep(200 * time.Millisecond) // let this answer leave
			h.breakSession()
		}()
	default:
		return "unknown command " + f[0]
	}
	return "started " + f[0]
}

// flood opens n guest streams, conc at a time, each served by one.
func (h *hostile) flood(sess *yamux.Session, name string, n, conc int, one func(*yamux.Stream) error) {
	sem := make(chan struct{}, conc)
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			st, err := sess.OpenStream()
			if err != nil {
				h.count(name+".openfail", 1)
				return
			}
			if err := one(st); err != nil {
				h.count(name+".fail", 1)
			} else {
				h.count(name+".ok", 1)
			}
		}()
	}
	wg.Wait()
	h.count(name+".done", 1)
}

var dnsID atomic.Uint32

func dnsQuery() []byte {
	id := dnsID.Add(1)
	name := dnsmessage.MustNewName(fmt.Sprintf("h%d.example.com.", id))
	b := dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: uint16(id), RecursionDesired: true})
	_ = b.StartQuestions()
	_ = b.Question(dnsmessage.Question{Name: name, Type: dnsmessage.TypeA, Class: dnsmessage.ClassINET})
	q, _ := b.Finish()
	return q
}

// dnsStream asks one DNS question and reads the answer.
func (h *hostile) dnsStream(st *yamux.Stream) error {
	defer st.Close()
	_ = st.SetDeadline(time.Now().Add(20 * time.Second))
	fc := agentproto.NewConn(st)
	if err := fc.WriteJSON(agentproto.Request{Method: agentproto.MethodEgressDNS}); err != nil {
		return err
	}
	if err := fc.WriteFrame(agentproto.KindData, dnsQuery()); err != nil {
		return err
	}
	_, _, err := fc.ReadFrame()
	return err
}

// bigDNSStream sends a DNS frame over the limit.
func (h *hostile) bigDNSStream(st *yamux.Stream) error {
	defer st.Close()
	_ = st.SetDeadline(time.Now().Add(10 * time.Second))
	fc := agentproto.NewConn(st)
	if err := fc.WriteJSON(agentproto.Request{Method: agentproto.MethodEgressDNS}); err != nil {
		return err
	}
	return fc.WriteFrame(agentproto.KindData, make([]byte, 1<<20))
}

// halfClosedStream asks a DNS question, then keeps sending bytes the host
// never asked for and never closes its side: the stream is left for the
// host to time out, full of data.
func (h *hostile) halfClosedStream(st *yamux.Stream) error {
	fc := agentproto.NewConn(st)
	_ = st.SetWriteDeadline(time.Now().Add(3 * time.Second))
	if err := fc.WriteJSON(agentproto.Request{Method: agentproto.MethodEgressDNS}); err != nil {
		return err
	}
	if err := fc.WriteFrame(agentproto.KindData, dnsQuery()); err != nil {
		return err
	}
	junk := make([]byte, 64<<10)
	for sent := 0; sent < 4<<20; sent += len(junk) {
		if _, err := st.Write(junk); err != nil {
			break // the host stopped granting window, or reset the stream
		}
	}
	return nil // never closed
}
