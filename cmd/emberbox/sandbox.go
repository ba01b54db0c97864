package main

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	emberbox "github.com/emberbox/emberbox/sdk/go"
)

// exitCodeError ends the command with a status and no message: the exit
// status of a command run in a sandbox, passed through.
type exitCodeError struct{ code int }

func (e *exitCodeError) Error() string { return fmt.Sprintf("exit status %d", e.code) }

// newSandboxCommand is `emberbox sandbox`: the API's sandboxes for people.
func newSandboxCommand() *cobra.Command {
	var sf serverFlags
	sb := &cobra.Command{
		Use:     "sandbox",
		Aliases: []string{"sandboxes", "sb"},
		Short:   "List, create, use and end sandboxes on a server",
		Long: "Work with a running server's sandboxes through its API. The server and key\n" +
			"come from --server and --key, else $EMBERBOX_URL and $EMBERBOX_API_KEY\n" +
			"(or $RUNTIME_API_URL and $RUNTIME_API_KEY), else ~/.config/emberbox/config.json\n" +
			"({\"server\": ..., \"key\": ...}), else http://127.0.0.1:8080 and the admin key\n" +
			"in --data-dir.",
	}
	sf.register(sb.PersistentFlags())
	sb.AddCommand(newSandboxListCommand(&sf), newSandboxCreateCommand(&sf), newSandboxExecCommand(&sf),
		newSandboxShellCommand(&sf), newSandboxCopyCommand(&sf), newSandboxEventsCommand(&sf))
	sb.AddCommand(newSandboxCheckpointCommands(&sf)...)
	for _, v := range []struct{ use, short string }{
		{"stop", "Stop sandboxes (their disks are kept until rm)"},
		{"rm", "Delete sandboxes and their disks"},
		{"pause", "Pause sandboxes: memory and disk saved, no CPU or memory held"},
		{"wake", "Wake paused sandboxes"},
	} {
		sb.AddCommand(newSandboxLifecycleCommand(&sf, v.use, v.short))
	}
	return sb
}

func newSandboxListCommand(sf *serverFlags) *cobra.Command {
	var output string
	var all bool
	var labels []string
	cmd := &cobra.Command{
		Use:     "ls",
		Aliases: []string{"list"},
		Short:   "List sandboxes: id, name, state, vcpu, memory, age, lease end",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			lm, err := keyValues("--label", labels)
			if err != nil {
				return err
			}
			c, err := sf.client()
			if err != nil {
				return err
			}
			list, err := c.List(cmd.Context(), emberbox.ListOptions{IncludeStopped: all, Labels: lm})
			if err != nil {
				return err
			}
			switch output {
			case "json":
				return writeJSONTo(cmd.OutOrStdout(), list)
			case "", "table":
				return printSandboxes(cmd.OutOrStdout(), list, time.Now())
			}
			return fmt.Errorf("-o %q: want table or json", output)
		},
	}
	cmd.Flags().StringVarP(&output, "output", "o", "table", "table or json")
	cmd.Flags().BoolVarP(&all, "all", "a", false, "list stopped sandboxes too")
	cmd.Flags().StringArrayVarP(&labels, "label", "l", nil, "only sandboxes with this label, KEY=VALUE (repeatable)")
	return cmd
}

func printSandboxes(w io.Writer, list []emberbox.Sandbox, now time.Time) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tNAME\tSTATE\tVCPU\tMEMORY\tAGE\tLEASE END")
	for _, s := range list {
		name, age, lease := "-", "-", "-"
		if s.Name != nil && *s.Name != "" {
			name = *s.Name
		}
		if s.CreatedAt != nil {
			age = roughDuration(now.Sub(*s.CreatedAt))
		}
		if s.EndsAt != nil {
			if d := s.EndsAt.Sub(now); d > 0 {
				lease = "in " + roughDuration(d)
			} else {
				lease = roughDuration(-d) + " ago"
			}
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d MiB\t%s\t%s\n", s.ID, name, s.State, s.VCPU, s.MemoryMiB, age, lease)
	}
	return tw.Flush()
}

// roughDuration writes d as people read an age: 45s, 12m, 3h, 2d.
func roughDuration(d time.Duration) string {
	switch {
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d.Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%dm", int(d.Minutes()))
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh", int(d.Hours()))
	}
	return fmt.Sprintf("%dd", int(d.Hours()/24))
}

func writeJSONTo(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// keyValues parses repeated KEY=VALUE flags.
func keyValues(flag string, kvs []string) (map[string]string, error) {
	if len(kvs) == 0 {
		return nil, nil
	}
	m := make(map[string]string, len(kvs))
	for _, kv := range kvs {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("%s %q: want KEY=VALUE", flag, kv)
		}
		m[k] = v
	}
	return m, nil
}

func newSandboxCreateCommand(sf *serverFlags) *cobra.Command {
	var req emberbox.CreateRequest
	var timeout time.Duration
	var labels, env []string
	cmd := &cobra.Command{
		Use:   "create",
		Short: "Create a sandbox, wait until it runs and print its id",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var err error
			if req.Labels, err = keyValues("--label", labels); err != nil {
				return err
			}
			if req.Env, err = keyValues("--env", env); err != nil {
				return err
			}
			if timeout < 0 {
				return fmt.Errorf("--timeout %s: must not be negative", timeout)
			}
			if timeout > 0 {
				secs := max(1, int(timeout.Round(time.Second)/time.Second))
				req.TimeoutSeconds = &secs
			}
			c, err := sf.client()
			if err != nil {
				return err
			}
			s, err := c.Create(cmd.Context(), req)
			if err != nil {
				return err
			}
			fmt.Fprintln(cmd.OutOrStdout(), s.ID)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&req.Name, "name", "", "a unique name")
	f.IntVar(&req.VCPU, "vcpu", 0, "virtual CPUs (default: the server's)")
	f.IntVar(&req.MemoryMiB, "memory-mib", 0, "memory in MiB (default: the server's)")
	f.IntVar(&req.DiskMiB, "disk-mib", 0, "disk in MiB (default: the server's)")
	f.DurationVar(&timeout, "timeout", 0, "the lease, e.g. 30m; then it stops (default: no limit, paused when idle)")
	f.StringArrayVarP(&labels, "label", "l", nil, "a label, KEY=VALUE (repeatable)")
	f.StringArrayVarP(&env, "env", "e", nil, "an environment variable of every command, KEY=VALUE (repeatable)")
	return cmd
}

func newSandboxLifecycleCommand(sf *serverFlags, use, short string) *cobra.Command {
	var noWait bool
	cmd := &cobra.Command{
		Use:   use + " ID...",
		Short: short,
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, ids []string) error {
			c, err := sf.client()
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			for _, id := range ids {
				var s *emberbox.Sandbox
				switch use {
				case "stop":
					s, err = c.Stop(ctx, id, !noWait)
				case "pause":
					s, err = c.Pause(ctx, id, !noWait)
				case "wake":
					s, err = c.Wake(ctx, id, 0, !noWait)
				case "rm":
					err = c.Delete(ctx, id)
				}
				if err != nil {
					return fmt.Errorf("%s %s: %w", use, id, err)
				}
				state := "deleted"
				if s != nil {
					state = s.State
				}
				fmt.Fprintf(cmd.OutOrStdout(), "%s\t%s\n", id, state)
			}
			return nil
		},
	}
	if use != "rm" {
		cmd.Flags().BoolVar(&noWait, "no-wait", false, "answer at once instead of waiting for the new state")
	}
	return cmd
}

func newSandboxEventsCommand(sf *serverFlags) *cobra.Command {
	var output string
	var limit int
	cmd := &cobra.Command{
		Use:     "events ID",
		Aliases: []string{"logs"},
		Short:   "What happened to a sandbox (created, ready, stopped, egress_refused, ...), oldest first",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := sf.client()
			if err != nil {
				return err
			}
			page, err := c.Events(cmd.Context(), args[0], limit, "")
			if err != nil {
				return err
			}
			switch output {
			case "json":
				return writeJSONTo(cmd.OutOrStdout(), page.Events)
			case "", "table":
				tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
				fmt.Fprintln(tw, "AT\tTYPE\tMESSAGE")
				for _, e := range page.Events {
					fmt.Fprintf(tw, "%s\t%s\t%s\n", e.At.UTC().Format(time.RFC3339), e.Type, e.Message)
				}
				return tw.Flush()
			}
			return fmt.Errorf("-o %q: want table or json", output)
		},
	}
	cmd.Flags().StringVarP(&output, "output", "o", "table", "table or json")
	cmd.Flags().IntVarP(&limit, "limit", "n", 100, "the newest N events, 1..1000")
	return cmd
}
