package main

import (
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/spf13/cobra"

	emberbox "github.com/emberbox/emberbox/sdk/go"
)

// newEventsCommand is `emberbox events`: the key's event feed, what its
// webhooks are sent, for people who would rather look.
func newEventsCommand() *cobra.Command {
	var af apiFlags
	var o emberbox.AccountEventsOptions
	cmd := &cobra.Command{
		Use:   "events",
		Short: "The key's events (sandboxes, snapshots, images), newest first: time, type, resource, data",
		Long: "Print the key's event feed (GET /v1/events), newest first; the server keeps 14\n" +
			"days of it. These are the events its webhooks are sent (see `emberbox webhook`);\n" +
			"`emberbox sandbox events ID` is one sandbox's own log.\n" + serverHelp,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := af.client()
			if err != nil {
				return err
			}
			page, err := c.ListAccountEvents(cmd.Context(), o)
			if err != nil {
				return err
			}
			if page.Events == nil {
				page.Events = []emberbox.AccountEvent{}
			}
			err = af.print(cmd.OutOrStdout(), page.Events, func(w io.Writer) error { return printAccountEvents(w, page.Events) })
			moreNote(cmd, page.NextCursor)
			return err
		},
	}
	f := cmd.Flags()
	af.register(f)
	f.StringVar(&o.ResourceID, "resource", "", "only the events of this sandbox, snapshot or image")
	f.StringVar(&o.Type, "type", "", "only this type, or a family such as sandbox.*")
	f.IntVarP(&o.Limit, "limit", "n", 50, "at most this many, 1..100")
	f.StringVar(&o.Cursor, "cursor", "", "the page before this cursor (as the last page printed)")
	return cmd
}

func printAccountEvents(w io.Writer, list []emberbox.AccountEvent) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "TIME\tTYPE\tRESOURCE\tDATA")
	for _, e := range list {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", e.CreatedAt.UTC().Format(time.RFC3339), e.Type, orDash(e.ResourceID),
			dataSummary(e.Data, maxDataSummary))
	}
	return tw.Flush()
}

// maxDataSummary is how many characters of an event's data a table shows:
// the whole of it is in --json.
const maxDataSummary = 60

// dataSummary writes an event's data on one line as key=value pairs by
// key, strings as they are and other values as JSON, cut at limit characters.
func dataSummary(data map[string]any, limit int) string {
	if len(data) == 0 {
		return "-"
	}
	keys := make([]string, 0, len(data))
	for k := range data {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		v, ok := data[k].(string)
		if !ok {
			b, err := json.Marshal(data[k])
			if err != nil {
				b = []byte("?")
			}
			v = string(b)
		}
		parts = append(parts, k+"="+v)
	}
	s := strings.Join(strings.Fields(strings.Join(parts, " ")), " ") // one line, even if a value had several
	if utf8.RuneCountInString(s) > limit {
		s = string([]rune(s)[:limit-1]) + "…"
	}
	return s
}
