// Package pgtest runs a throwaway PostgreSQL server for tests, from the
// binaries of Debian's postgresql package (/usr/lib/postgresql/*/bin).
//
// A Server listens on 127.0.0.1 at a free port and on a unix socket in its own
// temporary directory, trusts every local connection, and runs with fsync off:
// it is fast and loses everything when it stops, as a test wants. postgres
// refuses to run as root, so when the tests run as root the server runs as the
// user "postgres".
//
// `Start(tb)` (stopped by `tb.Cleanup`; skips without the binaries unless `$CI`
// is set), `New` and `Stop` for a `TestMain` (`NewDurable`: fsync on, for
// benchmarks of commits), `Shared`, and `NewDatabase(tb)`,
// the DSN of a fresh database dropped at cleanup. `initdb` runs with
// `--locale=C`; the server is ready when a connection succeeds (polled, with a
// deadline).
package pgtest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// ErrNoBinaries is returned by New when no PostgreSQL server is installed.
var ErrNoBinaries = errors.New("pgtest: no PostgreSQL binaries under /usr/lib/postgresql/*/bin")

// startTimeout bounds initdb plus the server's start; generous, since the
// machine may be small and busy.
const startTimeout = 2 * time.Minute

// Server is a running PostgreSQL server.
type Server struct {
	dir  string // owns the data dir, the socket and the log
	port int
	cmd  *exec.Cmd
	done chan struct{} // closed when the server process has exited
	werr error         // its exit status, set before done closes

	stopOnce sync.Once
	stopErr  error
	dbs      atomic.Int64
}

// Start starts a server for tb, stopped by tb.Cleanup. Without the
// binaries it skips tb, or fails it when $CI is set (CI must run these
// tests).
func Start(tb testing.TB) *Server {
	tb.Helper()
	s, err := New()
	if errors.Is(err, ErrNoBinaries) && os.Getenv("CI") == "" {
		tb.Skip(err)
	}
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if err := s.Stop(); err != nil {
			tb.Error(err)
		}
	})
	return s
}

var (
	sharedOnce sync.Once
	shared     *Server
	sharedErr  error
)

// Shared returns one server for the whole test binary, started by the
// first call. The caller's TestMain stops it with StopShared after m.Run;
// a shared server cannot be stopped by one test's cleanup.
func Shared() (*Server, error) {
	sharedOnce.Do(func() { shared, sharedErr = New() })
	return shared, sharedErr
}

// StopShared stops the server Shared started, if any.
func StopShared() error {
	if shared == nil {
		return nil
	}
	return shared.Stop()
}

// Available reports why no server can be started here (nil if one can).
func Available() error {
	_, err := binDir()
	return err
}

// binDir is the newest installed version's bin directory.
func binDir() (string, error) {
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	var ok []string
	for _, d := range dirs {
		if _, err := os.Stat(filepath.Join(d, "postgres")); err == nil {
			ok = append(ok, d)
		}
	}
	if len(ok) == 0 {
		return "", ErrNoBinaries
	}
	sort.Slice(ok, func(i, j int) bool { return version(ok[i]) > version(ok[j]) })
	return ok[0], nil
}

func version(bin string) int {
	n, _ := strconv.Atoi(filepath.Base(filepath.Dir(bin)))
	return n
}

// New initializes a database cluster in a new temporary directory and
// starts a server on it. The caller stops it with Stop.
func New() (*Server, error) { return newServer(false) }

// NewDurable is New with fsync and synchronous commits on, as a
// production server runs: for benchmarks whose figure depends on what a
// commit costs.
func NewDurable() (*Server, error) { return newServer(true) }

func newServer(durable bool) (*Server, error) {
	bin, err := binDir()
	if err != nil {
		return nil, err
	}
	cred, err := credential()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "pgtest-")
	if err != nil {
		return nil, fmt.Errorf("pgtest: %w", err)
	}
	if cred != nil {
		if err := os.Chown(dir, int(cred.Uid), int(cred.Gid)); err != nil {
			os.RemoveAll(dir)
			return nil, fmt.Errorf("pgtest: %w", err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	initdb := exec.CommandContext(ctx, filepath.Join(bin, "initdb"),
		"--pgdata", filepath.Join(dir, "data"), "--username", "postgres", "--auth", "trust",
		"--locale", "C", "--encoding", "UTF8", "--no-sync")
	initdb.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	if out, err := initdb.CombinedOutput(); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("pgtest: initdb: %w\n%s", err, out)
	}
	// The port is free when picked but may be taken before postgres binds
	// it; a start that fails that way is tried again on another.
	for attempt := 0; ; attempt++ {
		s, err := start(ctx, bin, dir, cred, durable)
		if err == nil {
			return s, nil
		}
		if attempt == 2 || ctx.Err() != nil {
			os.RemoveAll(dir)
			return nil, err
		}
	}
}

// credential is the user to run postgres as: "postgres" when we are root,
// else ourselves (nil).
func credential() (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, fmt.Errorf("pgtest: running as root needs the user postgres: %w", err)
	}
	uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
	gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
	if err := errors.Join(err1, err2); err != nil {
		return nil, fmt.Errorf("pgtest: user postgres: %w", err)
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func start(ctx context.Context, bin, dir string, cred *syscall.Credential, durable bool) (*Server, error) {
	port, err := freePort()
	if err != nil {
		return nil, fmt.Errorf("pgtest: picking a port: %w", err)
	}
	logPath := filepath.Join(dir, "postgres.log")
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
	if err != nil {
		return nil, fmt.Errorf("pgtest: %w", err)
	}
	defer logf.Close()
	sync := "off"
	if durable {
		sync = "on"
	}
	cmd := exec.Command(filepath.Join(bin, "postgres"),
		"-D", filepath.Join(dir, "data"),
		"-h", "127.0.0.1", "-p", strconv.Itoa(port), "-k", dir,
		"-c", "fsync="+sync, "-c", "synchronous_commit="+sync, "-c", "full_page_writes="+sync,
		"-c", "max_connections=200", "-c", "shared_buffers=32MB")
	cmd.Stdout, cmd.Stderr = logf, logf
	// Its own process group, so a terminal's ^C reaches the test binary
	// only, which stops the server in order. A test binary that dies
	// (a timeout's panic) takes the server with it where the kernel can
	// (dieWithParent): Linux's parent-death signal fires when the thread
	// that started it ends, so that thread is kept, locked to the
	// goroutine that waits for the server, until the server exits.
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred, Setpgid: true}
	dieWithParent(cmd.SysProcAttr)
	s := &Server{dir: dir, port: port, cmd: cmd, done: make(chan struct{})}
	started := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with the goroutine
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		s.werr = cmd.Wait()
		close(s.done)
	}()
	if err := <-started; err != nil {
		return nil, fmt.Errorf("pgtest: starting postgres: %w", err)
	}
	if err := s.waitReady(ctx); err != nil {
		s.kill()
		log, _ := os.ReadFile(logPath)
		return nil, fmt.Errorf("pgtest: postgres did not start: %w\n%s", err, tail(log, 4096))
	}
	return s, nil
}

// waitReady connects until the server answers, it exits, or ctx ends.
func (s *Server) waitReady(ctx context.Context) error {
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		c, err := pgconn.Connect(cctx, s.DSN("postgres"))
		cancel()
		if err == nil {
			return c.Close(ctx)
		}
		select {
		case <-s.done:
			return fmt.Errorf("postgres exited: %v (last connect: %w)", s.werr, err)
		case <-ctx.Done():
			return fmt.Errorf("%w (last connect: %w)", ctx.Err(), err)
		case <-tick.C:
		}
	}
}

func tail(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}

// DSN is the URL of database db on the server, over TCP, as the superuser.
func (s *Server) DSN(db string) string {
	u := url.URL{
		Scheme:   "postgres",
		User:     url.User("postgres"),
		Host:     net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port)),
		Path:     "/" + db,
		RawQuery: "sslmode=disable",
	}
	return u.String()
}

// SocketDir is the directory of the server's unix socket.
func (s *Server) SocketDir() string { return s.dir }

// NewDatabase creates an empty database and returns its DSN. It is dropped
// by tb.Cleanup (after the cleanups tb registers later, such as closing a
// store on it).
func (s *Server) NewDatabase(tb testing.TB) string {
	tb.Helper()
	name := fmt.Sprintf("t%d_%d", os.Getpid(), s.dbs.Add(1))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := s.exec(ctx, "CREATE DATABASE "+name); err != nil {
		tb.Fatalf("pgtest: creating database: %v", err)
	}
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		// FORCE ends connections a test left open; a server already
		// stopped took the database with it.
		if err := s.exec(ctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)"); err != nil && !s.stopped() {
			tb.Errorf("pgtest: dropping database: %v", err)
		}
	})
	return s.DSN(name)
}

func (s *Server) exec(ctx context.Context, sql string) error {
	c, err := pgconn.Connect(ctx, s.DSN("postgres"))
	if err != nil {
		return err
	}
	defer c.Close(context.Background())
	_, err = c.Exec(ctx, sql).ReadAll()
	return err
}

func (s *Server) stopped() bool {
	select {
	case <-s.done:
		return true
	default:
		return false
	}
}

// Stop shuts the server down (fast: open sessions are ended) and removes
// its directory. It is safe to call more than once.
func (s *Server) Stop() error {
	s.stopOnce.Do(func() {
		if !s.stopped() {
			_ = s.cmd.Process.Signal(syscall.SIGINT)
			select {
			case <-s.done:
			case <-time.After(time.Minute):
				s.kill()
				s.stopErr = errors.New("pgtest: postgres did not stop within a minute; killed")
			}
		}
		if err := os.RemoveAll(s.dir); err != nil && s.stopErr == nil {
			s.stopErr = fmt.Errorf("pgtest: %w", err)
		}
	})
	return s.stopErr
}

// kill ends the server's whole process group and waits for it.
func (s *Server) kill() {
	_ = syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
	<-s.done
}

// String names the server for logs.
func (s *Server) String() string {
	return strings.TrimSuffix(s.DSN(""), "/")
}
