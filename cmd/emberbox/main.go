// Command emberbox is the Emberbox server and its administration tool:
// `emberbox serve` runs the API and the sandboxes' VMs, `emberbox keys
// create` makes API keys, `emberbox image build` builds the guest image.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := newRootCommand().ExecuteContext(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "emberbox:", err)
		os.Exit(1)
	}
}
