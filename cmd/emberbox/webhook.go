package main

import (
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	emberbox "github.com/emberbox/emberbox/sdk/go"
)

// newWebhookCommand is `emberbox webhook`: the key's webhooks, which are
// sent its events as signed POSTs, and their deliveries.
func newWebhookCommand() *cobra.Command {
	var af apiFlags
	wh := &cobra.Command{
		Use:     "webhook",
		Aliases: []string{"webhooks"},
		Short:   "Send this key's events to a URL as signed POSTs, and see how they went",
		Long: "Webhooks receive the key's events (sandbox.*, snapshot.*, image.*, egress.refused)\n" +
			"as POSTs signed with Runtime-Signature, at least once and in order per resource.\n" +
			serverHelp,
	}
	af.register(wh.PersistentFlags())
	wh.AddCommand(newWebhookCreateCommand(&af), newWebhookListCommand(&af), newWebhookGetCommand(&af),
		newWebhookUpdateCommand(&af), newWebhookRotateCommand(&af), newWebhookRmCommand(&af),
		newWebhookTestCommand(&af), newWebhookDeliveriesCommand(&af), newWebhookRetryCommand(&af))
	return wh
}

func newWebhookCreateCommand(af *apiFlags) *cobra.Command {
	var spec emberbox.WebhookSpec
	cmd := &cobra.Command{
		Use:   "create URL",
		Short: "Create a webhook and print its id and secret (shown this once)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := af.client()
			if err != nil {
				return err
			}
			spec.URL = args[0]
			wh, err := c.CreateWebhook(cmd.Context(), spec)
			if err != nil {
				return err
			}
			return printWebhookSecret(cmd, af, wh)
		},
	}
	f := cmd.Flags()
	f.StringArrayVar(&spec.Events, "event", nil, "an event type or family such as sandbox.* to send (repeatable; default every type)")
	f.StringVar(&spec.Description, "description", "", "what the webhook is for")
	return cmd
}

// printWebhookSecret prints a webhook's id and secret, the one time the
// server shows the secret, and says so on stderr.
func printWebhookSecret(cmd *cobra.Command, af *apiFlags, wh *emberbox.Webhook) error {
	err := af.print(cmd.OutOrStdout(), wh, func(w io.Writer) error {
		_, err := fmt.Fprintf(w, "id\t%s\nsecret\t%s\n", wh.ID, wh.Secret)
		return err
	})
	if err != nil {
		return err
	}
	note := "The secret is shown this once: keep it, it verifies each delivery's Runtime-Signature."
	if t := wh.PreviousSecretExpiresAt; t != nil {
		note += " The previous secret also signs until " + t.UTC().Format(time.RFC3339) + "."
	}
	fmt.Fprintln(cmd.ErrOrStderr(), note)
	return nil
}

func newWebhookListCommand(af *apiFlags) *cobra.Command {
	return &cobra.Command{
		Use:     "list",
		Aliases: []string{"ls"},
		Short:   "List the key's webhooks, oldest first: id, URL, events, enabled, description",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := af.client()
			if err != nil {
				return err
			}
			list, err := c.ListWebhooks(cmd.Context())
			if err != nil {
				return err
			}
			if list == nil {
				list = []emberbox.Webhook{}
			}
			return af.print(cmd.OutOrStdout(), list, func(w io.Writer) error { return printWebhooks(w, list) })
		},
	}
}

func newWebhookGetCommand(af *apiFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "get ID",
		Short: "Show a webhook (its secret is never shown again)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := af.client()
			if err != nil {
				return err
			}
			wh, err := c.GetWebhook(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			return af.print(cmd.OutOrStdout(), wh, func(w io.Writer) error { return printWebhooks(w, []emberbox.Webhook{*wh}) })
		},
	}
}

func printWebhooks(w io.Writer, list []emberbox.Webhook) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tURL\tEVENTS\tENABLED\tDESCRIPTION\tCREATED")
	for _, wh := range list {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%t\t%s\t%s\n", wh.ID, wh.URL, strings.Join(wh.Events, ","), wh.Enabled,
			orDash(wh.Description), wh.CreatedAt.UTC().Format(time.RFC3339))
	}
	return tw.Flush()
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func newWebhookUpdateCommand(af *apiFlags) *cobra.Command {
	var newURL, description string
	var events []string
	var enable, disable bool
	cmd := &cobra.Command{
		Use:   "update ID",
		Short: "Change a webhook's URL, events, description, or whether it is enabled",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			f := cmd.Flags()
			var u emberbox.WebhookUpdate
			if f.Changed("url") {
				u.URL = &newURL
			}
			if f.Changed("description") {
				u.Description = &description
			}
			if f.Changed("event") {
				u.Events = events
			}
			if enable || disable {
				u.Enabled = &enable
			}
			if u.URL == nil && u.Events == nil && u.Description == nil && u.Enabled == nil {
				return errors.New("nothing to change: give --url, --event, --description, --enable or --disable")
			}
			return updateWebhook(cmd, af, args[0], u)
		},
	}
	f := cmd.Flags()
	f.StringVar(&newURL, "url", "", "send to this URL instead")
	f.StringArrayVar(&events, "event", nil, "the event types or families to send, replacing the present ones (repeatable; * for every type)")
	f.StringVar(&description, "description", "", "what the webhook is for")
	f.BoolVar(&enable, "enable", false, "send deliveries again")
	f.BoolVar(&disable, "disable", false, "stop sending deliveries (events still go to the feed)")
	cmd.MarkFlagsMutuallyExclusive("enable", "disable")
	return cmd
}

func updateWebhook(cmd *cobra.Command, af *apiFlags, id string, u emberbox.WebhookUpdate) error {
	c, err := af.client()
	if err != nil {
		return err
	}
	wh, err := c.UpdateWebhook(cmd.Context(), id, u)
	if err != nil {
		return err
	}
	return af.print(cmd.OutOrStdout(), wh, func(w io.Writer) error { return printWebhooks(w, []emberbox.Webhook{*wh}) })
}

func newWebhookRotateCommand(af *apiFlags) *cobra.Command {
	var keep time.Duration
	cmd := &cobra.Command{
		Use:   "rotate ID",
		Short: "Give a webhook a new secret and print it (shown this once); the old one signs beside it for --keep",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var keepPrevious *time.Duration
			if cmd.Flags().Changed("keep") {
				if keep < 0 {
					return fmt.Errorf("--keep %s: must not be negative", keep)
				}
				keepPrevious = &keep
			}
			c, err := af.client()
			if err != nil {
				return err
			}
			wh, err := c.RotateWebhookSecret(cmd.Context(), args[0], keepPrevious)
			if err != nil {
				return err
			}
			return printWebhookSecret(cmd, af, wh)
		},
	}
	cmd.Flags().DurationVar(&keep, "keep", 0, "how long the old secret still signs, at most 168h; 0 ends it now (default: the server's, a day)")
	return cmd
}

func newWebhookRmCommand(af *apiFlags) *cobra.Command {
	return &cobra.Command{
		Use:     "rm ID",
		Aliases: []string{"delete"},
		Short:   "Delete a webhook and its deliveries",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := af.client()
			if err != nil {
				return err
			}
			if err := c.DeleteWebhook(cmd.Context(), args[0]); err != nil {
				return err
			}
			return af.print(cmd.OutOrStdout(), deletedJSON{ID: args[0], Deleted: true}, func(w io.Writer) error {
				_, err := fmt.Fprintf(w, "%s\tdeleted\n", args[0])
				return err
			})
		},
	}
}

// deletedJSON is what rm prints with --json.
type deletedJSON struct {
	ID      string `json:"id,omitempty"`
	Name    string `json:"name,omitempty"`
	Deleted bool   `json:"deleted"`
}

func newWebhookTestCommand(af *apiFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "test ID",
		Short: "Send a signed webhook.test now and print how the receiver answered; fails when it did not take it",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := af.client()
			if err != nil {
				return err
			}
			d, err := c.TestWebhook(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if err := printDelivery(cmd, af, d); err != nil {
				return err
			}
			if d.State != "delivered" {
				return fmt.Errorf("webhook %s: the receiver did not take the test: %s", args[0], lastAttempt(d))
			}
			return nil
		},
	}
}

func newWebhookDeliveriesCommand(af *apiFlags) *cobra.Command {
	var o emberbox.DeliveriesOptions
	cmd := &cobra.Command{
		Use:   "deliveries ID",
		Short: "List a webhook's deliveries, newest first: event, state, attempts, last answer",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := af.client()
			if err != nil {
				return err
			}
			page, err := c.ListWebhookDeliveries(cmd.Context(), args[0], o)
			if err != nil {
				return err
			}
			if page.Deliveries == nil {
				page.Deliveries = []emberbox.WebhookDelivery{}
			}
			err = af.print(cmd.OutOrStdout(), page.Deliveries, func(w io.Writer) error { return printDeliveries(w, page.Deliveries) })
			moreNote(cmd, page.NextCursor)
			return err
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.State, "state", "", "only deliveries in this state: pending, delivered or failed")
	f.IntVarP(&o.Limit, "limit", "n", 50, "at most this many, 1..100")
	f.StringVar(&o.Cursor, "cursor", "", "the page before this cursor (as the last page printed)")
	return cmd
}

// moreNote tells on stderr how to read the page after this one, if any.
func moreNote(cmd *cobra.Command, next string) {
	if next != "" {
		fmt.Fprintf(cmd.ErrOrStderr(), "more: --cursor %s\n", next)
	}
}

func newWebhookRetryCommand(af *apiFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "retry DELIVERY_ID",
		Short: "Send a delivery again, once, now, and print how it went",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := af.client()
			if err != nil {
				return err
			}
			d, err := c.RetryWebhookDelivery(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			return printDelivery(cmd, af, d)
		},
	}
}

func printDelivery(cmd *cobra.Command, af *apiFlags, d *emberbox.WebhookDelivery) error {
	return af.print(cmd.OutOrStdout(), d, func(w io.Writer) error { return printDeliveries(w, []emberbox.WebhookDelivery{*d}) })
}

func printDeliveries(w io.Writer, list []emberbox.WebhookDelivery) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tEVENT\tTYPE\tRESOURCE\tSTATE\tATTEMPTS\tLAST\tCREATED")
	for _, d := range list {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\n", d.ID, orDash(d.EventID), d.EventType, orDash(d.ResourceID),
			d.State, d.Attempts, lastAttempt(&d), d.CreatedAt.UTC().Format(time.RFC3339))
	}
	return tw.Flush()
}

// lastAttempt says how a delivery's last attempt went: the receiver's
// status, its error, how long it took.
func lastAttempt(d *emberbox.WebhookDelivery) string {
	if d.Attempts == 0 || d.LastStatus == nil {
		return "-"
	}
	var parts []string
	if *d.LastStatus != 0 {
		parts = append(parts, "HTTP "+strconv.Itoa(*d.LastStatus))
	}
	if d.LastError != nil && *d.LastError != "" {
		parts = append(parts, *d.LastError)
	}
	if d.LastDurationMs != nil {
		parts = append(parts, strconv.FormatInt(*d.LastDurationMs, 10)+" ms")
	}
	return strings.Join(parts, ", ")
}
