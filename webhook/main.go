// Command runwarden-webhook is runwarden's admission webhook for runner
// pods, and the policy author's tool to evaluate and test its Rego
// policies without a cluster. See docs/webhook.md and docs/policy.md.
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
