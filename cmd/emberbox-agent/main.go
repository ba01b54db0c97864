// Command emberbox-agent is the guest agent: PID 1 inside every sandbox VM.
//
// Started as /init from the initramfs, it loads the virtio modules, mounts the
// root disk and re-executes itself from there; then it sets the system up and
// serves the host over a virtio-serial port until the VM is powered off.
//
// In the initramfs (`guestinit.IsInitramfs`) it calls `SwitchRoot`; else
// `agent.New`, `SetupSystem` (PID 1 only), `FindPort`, `ServePort`. A fatal
// error as PID 1 syncs and powers off. `emberbox-agent layer-exec <user>
// <command> [args…]` runs a program of the computer-use layer instead
// (`agent.LayerExec`); `emberbox-agent mcp-gateway` runs the MCP gateway
// of the config on its standard input (`mcpgateway`).
package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"time"

	"golang.org/x/sys/unix"

	"github.com/emberbox/emberbox/internal/agent"
	"github.com/emberbox/emberbox/internal/guestinit"
	"github.com/emberbox/emberbox/internal/mcpgateway"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "layer-exec" {
		// A program of the computer-use layer (internal/computer).
		err := agent.LayerExec(os.Args[2:])
		fmt.Fprintf(os.Stderr, "emberbox-agent: %v\n", err)
		os.Exit(127)
	}
	if len(os.Args) > 1 && os.Args[1] == "mcp-gateway" {
		// The MCP gateway (internal/mcp starts it, config on stdin).
		if err := runMCPGateway(); err != nil {
			fmt.Fprintf(os.Stderr, "emberbox-agent mcp-gateway: %v\n", err)
			os.Exit(1)
		}
		return
	}
	if guestinit.IsInitramfs() {
		err := guestinit.SwitchRoot(func(format string, args ...any) {
			fmt.Fprintf(os.Stderr, "emberbox-init: "+format+"\n", args...)
		})
		fatal(fmt.Errorf("switching root: %w", err))
	}
	if err := run(context.Background()); err != nil {
		fatal(err)
	}
}

func run(ctx context.Context) error {
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	cfg := agent.Config{Root: "/", User: "user", Logger: log}
	if os.Getpid() == 1 {
		cfg.TrimCachesAfter = agent.DefaultTrimAfter // the guest's own kernel
	}
	a, err := agent.New(cfg)
	if err != nil {
		return err
	}
	if os.Getpid() == 1 {
		if err := a.SetupSystem(); err != nil {
			return err
		}
		if err := a.StartEgressRelay(); err != nil {
			log.Warn("egress relay", "err", err)
		}
	}
	dev, err := agent.FindPort(agent.DefaultPort, 30*time.Second)
	if err != nil {
		return err
	}
	log.Info("emberbox-agent serving", "port", dev)
	return a.ServePort(ctx, dev)
}

// fatal reports err; as PID 1 it powers the VM off rather than letting the
// kernel panic, so the host sees a clean exit and keeps the console log.
func fatal(err error) {
	fmt.Fprintf(os.Stderr, "emberbox-agent: fatal: %v\n", err)
	if os.Getpid() == 1 {
		unix.Sync()
		_ = unix.Reboot(unix.LINUX_REBOOT_CMD_POWER_OFF)
	}
	os.Exit(1)
}

// runMCPGateway serves the MCP gateway of the config on stdin until
// SIGTERM or SIGINT.
func runMCPGateway() error {
	cfg, err := mcpgateway.ReadConfig(os.Stdin)
	if err != nil {
		return err
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	g, err := mcpgateway.New(cfg, mcpgateway.StatusPath, mcpgateway.LogDir, log)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), unix.SIGTERM, unix.SIGINT)
	defer stop()
	return g.Run(ctx)
}
