package mcpgateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"
)

// Gateway runs the servers of one Config and serves them over HTTP.
type Gateway struct {
	cfg     Config
	log     *slog.Logger
	servers map[string]*server
	order   []*server
	status  string // where the status goes
	// restartBase is the first pause before a server that ended is
	// started again (server.run).
	restartBase time.Duration

	wmu sync.Mutex // one status write at a time
}

// New returns the gateway of cfg, which writes its status to statusPath
// and each server's log to logDir/<id>.log.
func New(cfg Config, statusPath, logDir string, log *slog.Logger) (*Gateway, error) {
	if err := cfg.Check(); err != nil {
		return nil, err
	}
	g := &Gateway{cfg: cfg, log: log, servers: map[string]*server{}, status: statusPath, restartBase: time.Second}
	for _, spec := range cfg.Servers {
		s := &server{spec: spec, log: log, changed: g.writeStatus, state: StateStarting,
			logPath: filepath.Join(logDir, spec.ID+".log")}
		if len(spec.Install) > 0 {
			if _, err := os.Stat(spec.Installed); err != nil {
				s.state = StateInstalling
			}
		}
		g.servers[spec.ID] = s
		g.order = append(g.order, s)
	}
	return g, nil
}

// Run starts every server and serves until ctx ends.
func (g *Gateway) Run(ctx context.Context) error {
	ln, err := net.Listen("tcp4", "127.0.0.1:"+strconv.Itoa(g.cfg.Port))
	if err != nil {
		return fmt.Errorf("listening on port %d: %w", g.cfg.Port, err)
	}
	srv := &http.Server{Handler: g, ReadHeaderTimeout: 30 * time.Second}
	wg := g.start(ctx)
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	g.log.Info("mcp gateway serving", "port", g.cfg.Port, "servers", len(g.order))
	err = srv.Serve(ln)
	wg.Wait()
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

// start runs every server until ctx ends.
func (g *Gateway) start(ctx context.Context) *sync.WaitGroup {
	g.writeStatus()
	var wg sync.WaitGroup
	for _, s := range g.order {
		s.restartBase = g.restartBase
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.run(ctx)
		}()
	}
	return &wg
}

// writeStatus replaces the status file with the gateway's state.
func (g *Gateway) writeStatus() {
	g.wmu.Lock()
	defer g.wmu.Unlock()
	st := Status{PID: os.Getpid(), Config: g.cfg, UpdatedAt: time.Now().UTC()}
	for _, s := range g.order {
		st.Servers = append(st.Servers, s.status())
	}
	data, err := json.Marshal(st)
	if err != nil {
		return
	}
	if err := writeFileAtomic(g.status, data); err != nil {
		g.log.Warn("writing the mcp gateway's status", "err", err)
	}
}

func writeFileAtomic(path string, data []byte) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// ReadConfig reads a gateway's config from r (its standard input).
func ReadConfig(r io.Reader) (Config, error) {
	var cfg Config
	data, err := io.ReadAll(io.LimitReader(r, maxConfig+1))
	if err != nil {
		return cfg, err
	}
	if len(data) > maxConfig {
		return cfg, errors.New("the config is over 1 MiB")
	}
	if err := json.Unmarshal(data, &cfg); err != nil {
		return cfg, fmt.Errorf("the config: %w", err)
	}
	return cfg, cfg.Check()
}
