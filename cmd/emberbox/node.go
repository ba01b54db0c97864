package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
)

// newNodeCommand is `emberbox node`: the nodes of a cluster, for an admin
// key (docs/cluster.md).
func newNodeCommand() *cobra.Command {
	var sf serverFlags
	cmd := &cobra.Command{Use: "node", Short: "See and drain the nodes of a cluster (admin key)"}
	sf.register(cmd.PersistentFlags())
	list := &cobra.Command{
		Use: "list", Short: "List the nodes, their state and what they hold", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			body, err := nodeCall(cmd.Context(), sf, http.MethodGet, "/v1/nodes")
			if err != nil {
				return err
			}
			var out struct {
				Data []nodeRow `json:"data"`
			}
			if err := json.Unmarshal(body, &out); err != nil {
				return fmt.Errorf("reading nodes: %w", err)
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "NODE\tSTATE\tADDRESS\tRUNNING\tMEMORY MiB (USED/ALL)\tHEARTBEAT\tSUSPECT SINCE")
			for _, n := range out.Data {
				// Suspect: its heartbeat is stale on the node answering, but
				// it answers probes.
				suspect := "-"
				if n.SuspectSince != nil {
					suspect = *n.SuspectSince
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d/%d\t%s\t%s\n", n.ID, n.State, n.Address, n.Running, n.CommittedMiB, n.MemoryMiB, n.HeartbeatAt, suspect)
			}
			return tw.Flush()
		},
	}
	verb := func(use, short, op string) *cobra.Command {
		return &cobra.Command{
			Use: use + " NODE", Short: short, Args: cobra.ExactArgs(1),
			RunE: func(cmd *cobra.Command, args []string) error {
				body, err := nodeCall(cmd.Context(), sf, http.MethodPost, "/v1/nodes/"+url.PathEscape(args[0])+":"+op)
				if err != nil {
					return err
				}
				var n nodeRow
				if err := json.Unmarshal(body, &n); err != nil {
					return fmt.Errorf("reading node: %w", err)
				}
				fmt.Fprintf(cmd.OutOrStdout(), "node %s is %s\n", n.ID, n.State)
				return nil
			},
		}
	}
	cmd.AddCommand(list,
		verb("drain", "Place no new sandboxes on a node and move its sandboxes, paused and running, to other nodes", "drain"),
		verb("undrain", "End a node's drain", "undrain"))
	return cmd
}

type nodeRow struct {
	ID           string  `json:"id"`
	State        string  `json:"state"`
	Address      string  `json:"address"`
	Running      int     `json:"running"`
	MemoryMiB    int64   `json:"memoryMiB"`
	CommittedMiB int64   `json:"committedMiB"`
	HeartbeatAt  string  `json:"heartbeatAt"`
	SuspectSince *string `json:"suspectSince"`
}

func nodeCall(ctx context.Context, sf serverFlags, method, path string) ([]byte, error) {
	server, key, err := sf.resolve()
	if err != nil {
		return nil, err
	}
	return apiCall(ctx, server, key, method, path)
}

// apiCall makes one API call for a client command and returns the body of
// its 200 answer; an answer in the error shape becomes "code: message".
// A POST sends an empty JSON object.
func apiCall(ctx context.Context, server, key, method, path string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	var body io.Reader
	if method == http.MethodPost {
		body = strings.NewReader("{}")
	}
	req, err := http.NewRequestWithContext(ctx, method, strings.TrimRight(server, "/")+path, body)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+key)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		var e struct {
			Error struct{ Code, Message string } `json:"error"`
		}
		if json.Unmarshal(b, &e) == nil && e.Error.Code != "" {
			return nil, fmt.Errorf("%s: %s", e.Error.Code, e.Error.Message)
		}
		return nil, fmt.Errorf("%s %s: HTTP %d", method, path, resp.StatusCode)
	}
	return b, nil
}
