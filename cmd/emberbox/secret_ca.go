package main

import (
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	emberbox "github.com/emberbox/emberbox/sdk/go"
)

// newSecretCACommand is `emberbox secret ca`: the CAs guests trust for
// egress secrets' hosts, and their rotation (admin keys).
func newSecretCACommand(af *apiFlags) *cobra.Command {
	ca := &cobra.Command{
		Use:   "ca",
		Short: "The CAs guests trust for egress secrets' hosts (admin keys): list them, rotate",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := af.client()
			if err != nil {
				return err
			}
			list, err := c.EgressCAs(cmd.Context())
			if err != nil {
				return err
			}
			return af.print(cmd.OutOrStdout(), list, func(w io.Writer) error { return printCAs(w, list) })
		},
	}
	var keep time.Duration
	rotate := &cobra.Command{
		Use:   "rotate [--keep DURATION]",
		Short: "Make a new egress CA; the ones in force stay trusted for --keep (0: retire them now)",
		Long: "Make a new egress CA. Running sandboxes are sent it before the command returns, and\n" +
			"each sandbox's gate signs with it once its guest holds it; a paused sandbox gets it\n" +
			"when it wakes. The CAs in force before stay trusted for --keep (default a day), so a\n" +
			"guest that has not yet learnt the new one keeps working; --keep 0 retires them at\n" +
			"once, for a CA key that may have leaked.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := af.client()
			if err != nil {
				return err
			}
			rot, err := c.RotateEgressCA(cmd.Context(), keep)
			if err != nil {
				return fmt.Errorf("rotating the egress CA: %w", err)
			}
			list := append(rot.Previous, rot.New)
			return af.print(cmd.OutOrStdout(), rot, func(w io.Writer) error { return printCAs(w, list) })
		},
	}
	rotate.Flags().DurationVar(&keep, "keep", 24*time.Hour, "how long the CAs in force now stay trusted (at most 720h)")
	ca.AddCommand(rotate)
	return ca
}

func printCAs(w io.Writer, list []emberbox.EgressCA) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tADDED\tRETIRES\tNEWEST\tGUESTS TRUSTING\tNOT KNOWN")
	for _, ca := range list {
		retires := "-"
		if ca.RetireAt != nil {
			retires = ca.RetireAt.Local().Format(time.DateTime)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%v\t%d\t%d\n", ca.ID[:min(16, len(ca.ID))], ca.AddedAt.Local().Format(time.DateTime), retires,
			ca.Newest, ca.Guests.Trusting, ca.Guests.NotKnown)
	}
	return tw.Flush()
}
