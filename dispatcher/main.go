// Command runwarden-dispatcher runs deployment tasks as Kubernetes Jobs.
// This version serves the `kube` task source: RunnerTask objects. See
// docs/dispatcher.md.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
