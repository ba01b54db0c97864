package main

import (
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	emberbox "github.com/emberbox/emberbox/sdk/go"
)

// newSandboxCheckpointCommands are `emberbox sandbox checkpoint`,
// `checkpoints`, `rollback`, `branch` and `checkpoint-rm`: a sandbox's
// checkpoints (its memory, processes and disk at a moment), to roll it back
// to or to start new sandboxes from.
func newSandboxCheckpointCommands(sf *serverFlags) []*cobra.Command {
	return []*cobra.Command{newSandboxCheckpointCommand(sf), newSandboxCheckpointsCommand(sf),
		newSandboxRollbackCommand(sf), newSandboxBranchCommand(sf), newSandboxCheckpointRmCommand(sf)}
}

func newSandboxCheckpointCommand(sf *serverFlags) *cobra.Command {
	var label string
	cmd := &cobra.Command{
		Use:   "checkpoint ID",
		Short: "Checkpoint a sandbox (memory, processes and disk), wait for it and print its id",
		Long: "Take a checkpoint of a sandbox: its memory, processes and disk as they are now.\n" +
			"A paused sandbox is woken for it and paused again. The server keeps a number of\n" +
			"checkpoints per sandbox (20 by default) and deletes the oldest beyond it.",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := sf.client()
			if err != nil {
				return err
			}
			ck, err := c.Checkpoint(cmd.Context(), args[0], label)
			if err != nil {
				return err
			}
			fmt.Fprintln(cmd.OutOrStdout(), ck.ID)
			return nil
		},
	}
	cmd.Flags().StringVar(&label, "label", "", "a label: at most 63 bytes of UTF-8, no control characters")
	return cmd
}

func newSandboxCheckpointsCommand(sf *serverFlags) *cobra.Command {
	var output string
	cmd := &cobra.Command{
		Use:   "checkpoints ID",
		Short: "List a sandbox's checkpoints, oldest first: id, label, state, size, created",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if output != "" && output != "table" && output != "json" {
				return fmt.Errorf("-o %q: want table or json", output)
			}
			c, err := sf.client()
			if err != nil {
				return err
			}
			list, err := c.Checkpoints(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if output == "json" {
				if list == nil {
					list = []emberbox.Checkpoint{}
				}
				return writeJSONTo(cmd.OutOrStdout(), list)
			}
			return printCheckpoints(cmd.OutOrStdout(), list, time.Now())
		},
	}
	cmd.Flags().StringVarP(&output, "output", "o", "table", "table or json")
	return cmd
}

func printCheckpoints(w io.Writer, list []emberbox.Checkpoint, now time.Time) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tLABEL\tSTATE\tSIZE\tCREATED\tAGE")
	for _, ck := range list {
		label, state := "-", ck.State
		if ck.Label != nil && *ck.Label != "" {
			label = *ck.Label
		}
		if ck.Error != nil && *ck.Error != "" {
			state += ": " + *ck.Error
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", ck.ID, label, state, bytesText(ck.SizeBytes),
			ck.CreatedAt.UTC().Format(time.RFC3339), roughDuration(now.Sub(ck.CreatedAt)))
	}
	return tw.Flush()
}

func newSandboxRollbackCommand(sf *serverFlags) *cobra.Command {
	var keep bool
	cmd := &cobra.Command{
		Use:     "rollback ID CHECKPOINT_ID",
		Aliases: []string{"restore"},
		Short:   "Roll a sandbox back to a checkpoint and wait until it runs again",
		Long: "Roll a sandbox back to one of its checkpoints: it keeps its id and runs again with\n" +
			"the memory, processes and disk of that moment. What it did since is lost, unless\n" +
			"--keep first checkpoints the present state (labelled before-restore).",
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := sf.client()
			if err != nil {
				return err
			}
			s, err := c.RestoreCheckpoint(cmd.Context(), args[0], args[1], keep)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s\t%s\n", s.ID, s.State)
			return nil
		},
	}
	cmd.Flags().BoolVar(&keep, "keep", false, "checkpoint the present state first (label before-restore)")
	return cmd
}

func newSandboxBranchCommand(sf *serverFlags) *cobra.Command {
	var o emberbox.BranchOptions
	var labels []string
	cmd := &cobra.Command{
		Use:   "branch ID CHECKPOINT_ID",
		Short: "Start new sandboxes from a sandbox's checkpoint, wait until they run and print their ids",
		Long: "Start new sandboxes from one of a sandbox's checkpoints, as fork does from its\n" +
			"present state; the sandbox itself is left as it is. Prints one id a line.",
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			if o.Count < 1 || o.Count > 10 {
				return fmt.Errorf("--count %d: want 1..10", o.Count)
			}
			var err error
			if o.Labels, err = keyValues("--label", labels); err != nil {
				return err
			}
			c, err := sf.client()
			if err != nil {
				return err
			}
			list, err := c.BranchCheckpoint(cmd.Context(), args[0], args[1], o)
			if err != nil {
				return err
			}
			for _, s := range list {
				fmt.Fprintln(cmd.OutOrStdout(), s.ID)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.IntVarP(&o.Count, "count", "n", 1, "how many sandboxes, 1..10")
	f.StringVar(&o.Name, "name", "", "a name for the new sandboxes")
	f.StringArrayVarP(&labels, "label", "l", nil, "a label of the new sandboxes, KEY=VALUE (repeatable)")
	return cmd
}

func newSandboxCheckpointRmCommand(sf *serverFlags) *cobra.Command {
	return &cobra.Command{
		Use:     "checkpoint-rm ID CHECKPOINT_ID...",
		Aliases: []string{"checkpoint-delete"},
		Short:   "Delete checkpoints of a sandbox",
		Args:    cobra.MinimumNArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := sf.client()
			if err != nil {
				return err
			}
			for _, cid := range args[1:] {
				if err := c.DeleteCheckpoint(cmd.Context(), args[0], cid); err != nil {
					return fmt.Errorf("checkpoint-rm %s: %w", cid, err)
				}
				fmt.Fprintf(cmd.OutOrStdout(), "%s\tdeleted\n", cid)
			}
			return nil
		},
	}
}
