// Command runwarden-webhook is runwarden's admission webhook for runner
// pods, and the policy author's tool to evaluate and test its Rego
// policies without a cluster. See docs/webhook.md and docs/policy.md.
package main

import (
	"context"
	"os"
	"os/signal"
	"runtime/debug"
	"syscall"

	"github.com/runwarden/runwarden/internal/memlimit"
)

func main() {
	// Admission traffic allocates much and lives short: collecting less
	// often cuts tail latency for a little memory (measured in
	// docs/benchmarks.md).
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(400)
	}
	// The container's memory limit, known to the collector (see
	// internal/memlimit); GOMEMLIMIT set in the environment wins.
	memlimit.FromContainer()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	go func() {
		<-ctx.Done()
		stop() // a second signal ends the process at once, without the shutdown delay
	}()
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
