// Command emberbox is the Emberbox server and its administration tool:
// `emberbox serve` runs the API and the sandboxes' VMs, `emberbox keys
// create` makes API keys, `emberbox image build` builds the guest image.
//
// serve (serve.go) is wiring as data: a table of steps, one per subsystem
// (store, guest image and VM driver, egress, admission, metrics, volumes,
// image catalog, cluster, sandbox manager, builds, background loops,
// uploads, links, API, E2B front and console, cluster routing), each a
// method of server in a serve_*.go file named for its area (cluster.go
// for the cluster's), which builds its subsystem from those before it and
// pushes what takes it down on one cleanup stack. An error part way, or
// the end of serving, runs the stack in reverse: background loops, then
// the manager (its sandboxes keep running), then the store.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := newRootCommand().ExecuteContext(ctx); err != nil {
		var ec *exitCodeError
		if errors.As(err, &ec) {
			stop()
			os.Exit(ec.code) // a sandbox command's own status, passed through
		}
		fmt.Fprintln(os.Stderr, "emberbox:", err)
		os.Exit(1)
	}
}
