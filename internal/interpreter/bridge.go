package interpreter

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	_ "embed"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/emberbox/emberbox/internal/errdefs"
	"github.com/emberbox/emberbox/internal/guest"
)

//go:embed bridge.py
var bridgeSource string

// Bounds of what a bridge may send.
const (
	// MaxEventLine bounds one event line from the guest (the bridge keeps
	// its own under 16 MiB); a longer line ends the context.
	MaxEventLine = 16<<20 + 64<<10
	// MaxOutput bounds the output one execution keeps (text and results
	// together); the rest is left out and the execution marked truncated.
	MaxOutput = 32 << 20
	// maxPortLine bounds the bridge's first line on stdout.
	maxPortLine = 4 << 10
)

// Waits of a bridge's start. Under TCG, importing ipykernel alone takes
// many seconds.
var (
	portWait  = 90 * time.Second
	readyWait = 5 * time.Minute
)

// wireEvent is one line from the bridge; which fields count depends on Ev.
type wireEvent struct {
	Ev        string                     `json:"ev"`
	Text      string                     `json:"text"`
	N         int                        `json:"n"`
	Main      bool                       `json:"main"`
	Data      map[string]json.RawMessage `json:"data"`
	Name      string                     `json:"name"`
	Value     string                     `json:"value"`
	Traceback string                     `json:"traceback"`
	Status    string                     `json:"status"`
	Message   string                     `json:"message"`
	ID        int64                      `json:"id"` // the request an event answers
	size      int                        // bytes of the line
}

// bridge is the host's end of one connection to a bridge process.
type bridge struct {
	conn    net.Conn
	events  chan wireEvent // read from the connection, in order
	done    chan struct{}  // closed when the connection has ended
	err     error          // why it ended; read after done
	endedAt time.Time      // when it ended; read after done
	// closing is closed by close, so a reader blocked on events stops.
	closing chan struct{}
	wmu     sync.Mutex
	once    sync.Once
}

// errBridgeGone is the error of a request to a bridge whose connection
// ended.
var errBridgeGone = errors.New("the interpreter's connection has ended")

// errProcessGone: the bridge process is no longer there to connect to
// (the sandbox stopped or restarted, or it was killed).
var errProcessGone = errors.New("the interpreter's process has ended")

// proc is a bridge process in the guest: what it takes to connect to it
// again, and to tell it from another process that got its id after a
// reboot.
type proc struct {
	pid     string
	started time.Time
	port    int
	token   string
}

// bridgeMarker starts bridge.py: what tells a bridge in a process list.
const bridgeMarker = "# Emberbox interpreter bridge"

// isBridge reports whether a guest process runs a bridge (of any
// version of this server).
func isBridge(p guest.ProcessInfo) bool {
	return len(p.Argv) == 4 && p.Argv[0] == "python3" && p.Argv[2] == "-c" && strings.HasPrefix(p.Argv[3], bridgeMarker)
}

// spawnBridge starts a bridge in g with cwd and env and reads where it
// listens. It returns the process and the kernel's working directory.
func spawnBridge(ctx context.Context, g Guest, cwd string, env map[string]string) (proc, string, error) {
	var raw [16]byte
	if _, err := rand.Read(raw[:]); err != nil {
		return proc{}, "", fmt.Errorf("making a bridge token: %w", err)
	}
	token := hex.EncodeToString(raw[:])
	info, err := g.Spawn(ctx, guest.ExecRequest{
		Argv: []string{"python3", "-u", "-c", bridgeSource}, Cwd: cwd, Env: env,
		Stdin: []byte(token + "\n"), Detach: true,
	})
	if err != nil {
		return proc{}, "", fmt.Errorf("starting the interpreter: %w", err)
	}
	p := proc{pid: info.ID, started: info.StartedAt, token: token}
	port, dir, err := readPort(ctx, g, info.ID)
	if err != nil {
		p.kill(ctx, g)
		return proc{}, "", err
	}
	p.port = port
	return p, dir, nil
}

// alive reports whether p is still running in g, and is the process it
// was: a reboot starts process ids again.
func (p proc) alive(ctx context.Context, g Guest) bool {
	info, err := g.Process(ctx, p.pid)
	return err == nil && info.ExitCode == nil && info.EndedAt == nil && info.StartedAt.Equal(p.started) && isBridge(*info)
}

// kill ends p (its kernel notices its parent is gone and exits too).
func (p proc) kill(ctx context.Context, g Guest) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	_, _ = g.Signal(ctx, p.pid, "KILL")
}

// connect opens a connection to p and waits up to wait for its kernel to
// be ready.
func (p proc) connect(ctx context.Context, g Guest, wait time.Duration) (*bridge, error) {
	conn, err := g.DialPort(ctx, p.port)
	if err != nil {
		return nil, fmt.Errorf("connecting to the interpreter: %w", err)
	}
	b := &bridge{conn: conn, events: make(chan wireEvent, 2), done: make(chan struct{}), closing: make(chan struct{})}
	if _, err := conn.Write([]byte(p.token + "\n")); err != nil {
		b.close()
		return nil, fmt.Errorf("connecting to the interpreter: %w", err)
	}
	go b.read()
	ready, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	for {
		ev, err := b.next(ready)
		if err != nil {
			b.close()
			if ctx.Err() == nil && errors.Is(err, context.DeadlineExceeded) {
				return nil, failed("the interpreter's kernel was not ready within %s", wait)
			}
			return nil, err
		}
		switch ev.Ev {
		case "ready":
			return b, nil
		case "fatal":
			b.close()
			return nil, failed("%s", clip(ev.Message, 2048))
		}
	}
}

// failed is the error of an interpreter that cannot run in the sandbox as
// it is (an image without ipykernel, a kernel that dies at its start): a
// conflict with the sandbox's state whose message the caller sees, not a
// server fault hidden behind "internal error".
func failed(format string, args ...any) error {
	return errdefs.New(errdefs.ErrConflict, "interpreter_failed", format, args...).
		WithHint("the sandbox's image needs python3 with ipykernel and jupyter_client (Emberbox's default image has them)")
}

// readPort reads the bridge's first stdout line, {"port": N, "cwd": dir}.
func readPort(ctx context.Context, g Guest, pid string) (int, string, error) {
	ctx, cancel := context.WithTimeout(ctx, portWait)
	defer cancel()
	var out, errOut bytes.Buffer
	var cursor int64
	exited := false
	for !exited {
		if i := bytes.IndexByte(out.Bytes(), '\n'); i >= 0 {
			var first struct {
				Port int    `json:"port"`
				Cwd  string `json:"cwd"`
			}
			if err := json.Unmarshal(out.Bytes()[:i], &first); err != nil || first.Port < 1 || first.Port > 65535 {
				return 0, "", failed("the interpreter started wrongly: %q", clip(out.String()[:i], 256))
			}
			return first.Port, clip(first.Cwd, maxCwd), nil
		}
		if out.Len() > maxPortLine {
			return 0, "", failed("the interpreter started wrongly: %q", clip(out.String(), 256))
		}
		err := g.ProcessOutput(ctx, guest.ProcessRequest{ID: pid, Cursor: cursor, WaitMs: 1000}, func(ev guest.Event) error {
			switch ev.Type {
			case guest.EventStdout:
				out.Write(ev.Data)
			case guest.EventStderr:
				if errOut.Len() < maxPortLine {
					errOut.Write(ev.Data)
				}
			case "exit":
				exited = true
			}
			if end := ev.Offset + int64(len(ev.Data)); end > cursor {
				cursor = end
			}
			return nil
		})
		if err != nil {
			if ctx.Err() != nil && errors.Is(err, context.DeadlineExceeded) {
				return 0, "", failed("the interpreter did not start within %s", portWait)
			}
			return 0, "", fmt.Errorf("reading the interpreter's start: %w", err)
		}
	}
	return 0, "", failed("the interpreter exited at its start: %s", clip(strings.TrimSpace(errOut.String()), 2048))
}

// read turns lines from the connection into events until it ends.
func (b *bridge) read() {
	defer close(b.done)
	defer close(b.events)
	defer func() { b.endedAt = time.Now() }()
	r := bufio.NewReaderSize(b.conn, 64<<10)
	for {
		line, err := readLine(r, MaxEventLine)
		if err != nil {
			if errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) {
				err = errBridgeGone
			}
			b.err = err
			b.conn.Close()
			return
		}
		var ev wireEvent
		if json.Unmarshal(line, &ev) != nil || ev.Ev == "" {
			continue // not ours to understand; the bridge never sends it
		}
		ev.size = len(line)
		select {
		case b.events <- ev:
		case <-b.closing:
			b.err = errBridgeGone
			return
		}
	}
}

// readLine reads one line of at most max bytes, without its newline.
func readLine(r *bufio.Reader, max int) ([]byte, error) {
	var line []byte
	for {
		chunk, err := r.ReadSlice('\n')
		if len(line)+len(chunk) > max {
			return nil, fmt.Errorf("the interpreter sent a line over %d bytes", max)
		}
		line = append(line, chunk...)
		switch {
		case err == nil:
			return line[:len(line)-1], nil
		case errors.Is(err, bufio.ErrBufferFull):
			continue
		default:
			return nil, err
		}
	}
}

// next returns the next event, or why there is none.
func (b *bridge) next(ctx context.Context) (wireEvent, error) {
	select {
	case ev, ok := <-b.events:
		if !ok {
			return wireEvent{}, b.gone()
		}
		return ev, nil
	case <-ctx.Done():
		return wireEvent{}, ctx.Err()
	}
}

// gone is why the bridge ended, once done is closed.
func (b *bridge) gone() error {
	<-b.done
	if b.err == nil || errors.Is(b.err, errBridgeGone) {
		return errBridgeGone
	}
	return fmt.Errorf("%w: %v", errBridgeGone, b.err)
}

// send writes one request line.
func (b *bridge) send(req any) error {
	line, err := json.Marshal(req)
	if err != nil {
		return err
	}
	b.wmu.Lock()
	defer b.wmu.Unlock()
	_ = b.conn.SetWriteDeadline(time.Now().Add(30 * time.Second))
	if _, err := b.conn.Write(append(line, '\n')); err != nil {
		return fmt.Errorf("%w: %v", errBridgeGone, err)
	}
	return nil
}

// alive reports whether the connection is still up.
func (b *bridge) alive() bool {
	select {
	case <-b.done:
		return false
	default:
		return true
	}
}

// close ends the connection, which makes the bridge shut its kernel down
// and exit.
func (b *bridge) close() {
	b.once.Do(func() {
		close(b.closing)
		b.conn.Close()
	})
}

// clip cuts s to at most n bytes.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
