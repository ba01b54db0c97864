package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	emberbox "github.com/emberbox/emberbox/sdk/go"
)

// Exit statuses for a command that did not exit by itself, as shells and
// timeout(1) report them.
const (
	exitTimedOut = 124
	exitKilled   = 137
)

func newSandboxExecCommand(sf *serverFlags) *cobra.Command {
	var req emberbox.ExecRequest
	var env []string
	cmd := &cobra.Command{
		Use:   "exec ID -- COMMAND [ARG...]",
		Short: "Run a command in a sandbox, streaming its output; exits with its exit status",
		Long: "Run a program with its arguments in a sandbox (no shell: give `sh -c '...'` for\n" +
			"one). Its stdout and stderr stream to ours as they come, and this command exits\n" +
			"with its exit status (124 when it timed out, 137 when a signal ended it).",
		Args: cobra.MinimumNArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			var err error
			if req.Env, err = keyValues("--env", env); err != nil {
				return err
			}
			c, err := sf.client()
			if err != nil {
				return err
			}
			req.Argv = args[1:]
			req.Stdout, req.Stderr = cmd.OutOrStdout(), cmd.ErrOrStderr()
			res, err := c.Exec(cmd.Context(), args[0], req)
			if err != nil {
				return err
			}
			return exitStatus(res.ExitCode, res.TimedOut)
		},
	}
	f := cmd.Flags()
	f.StringVarP(&req.Cwd, "workdir", "w", "", "working directory (default /workspace)")
	f.StringArrayVarP(&env, "env", "e", nil, "an environment variable, KEY=VALUE (repeatable)")
	f.DurationVar(&req.Timeout, "timeout", 0, "kill the command after this long (default: the sandbox's lease)")
	f.StringVarP(&req.User, "user", "u", "", "sandbox (default) or root")
	return cmd
}

// exitStatus turns a command's end into this command's: nil for 0, else
// an exitCodeError.
func exitStatus(code *int, timedOut bool) error {
	switch {
	case timedOut:
		return &exitCodeError{exitTimedOut}
	case code == nil:
		return &exitCodeError{exitKilled}
	case *code != 0:
		return &exitCodeError{*code & 0xff}
	}
	return nil
}

func newSandboxShellCommand(sf *serverFlags) *cobra.Command {
	var o emberbox.TerminalOptions
	cmd := &cobra.Command{
		Use:   "shell ID",
		Short: "Open an interactive terminal in a sandbox; exits with the shell's exit status",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := sf.client()
			if err != nil {
				return err
			}
			return runShell(cmd.Context(), c, args[0], o, os.Stdin, cmd.OutOrStdout())
		},
	}
	f := cmd.Flags()
	f.StringVarP(&o.Command, "command", "c", "", "the program to run (default bash -l)")
	f.StringVarP(&o.Cwd, "workdir", "w", "", "working directory (default /workspace)")
	f.StringVarP(&o.User, "user", "u", "", "sandbox (default) or root")
	return cmd
}

// runShell carries a terminal between the sandbox and this process's
// terminal, which it puts in raw mode (restored on return) and whose
// window size it follows.
func runShell(ctx context.Context, c *emberbox.Client, id string, o emberbox.TerminalOptions, in *os.File, out io.Writer) error {
	fd := int(in.Fd())
	tty := term.IsTerminal(fd)
	if tty {
		if w, h, err := term.GetSize(fd); err == nil {
			o.Cols, o.Rows = w, h
		}
	}
	dialCtx, cancel := context.WithTimeout(ctx, time.Minute)
	t, err := c.Terminal(dialCtx, id, o)
	cancel()
	if err != nil {
		return err
	}
	defer t.Close()
	if tty {
		old, err := term.MakeRaw(fd)
		if err != nil {
			return fmt.Errorf("raw mode: %w", err)
		}
		defer term.Restore(fd, old)
		winch := make(chan os.Signal, 1)
		signal.Notify(winch, syscall.SIGWINCH)
		defer func() { signal.Stop(winch); close(winch) }()
		go func() {
			for range winch {
				if w, h, err := term.GetSize(fd); err == nil {
					rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
					_ = t.Resize(rctx, w, h)
					cancel()
				}
			}
		}()
	}
	// Typing goes on until the terminal ends; a Read blocked on our stdin
	// is left behind when this returns, as the process exits.
	go func() { _, _ = io.Copy(t, in) }()
	done := make(chan error, 1)
	go func() {
		_, err := io.Copy(out, t)
		done <- err
	}()
	select {
	case err = <-done:
	case <-ctx.Done():
		return ctx.Err()
	}
	if err != nil && !errors.Is(err, io.EOF) {
		return err
	}
	code, exited := t.ExitCode()
	if !exited {
		return errors.New("the terminal closed before its process exited")
	}
	return exitStatus(code, false)
}
