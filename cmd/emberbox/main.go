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
