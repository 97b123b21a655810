// Command runwarden-dispatcher runs deployment tasks as Kubernetes Jobs,
// from RunnerTask objects or a remote orchestrator. See docs/dispatcher.md.
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
	// A long-running agent that waits on the API server more than it
	// computes: collecting twice as often keeps its memory at 1,000 tasks in
	// flight about a sixth lower for no measurable cost in throughput
	// (docs/benchmarks.md). GOGC set in the environment wins.
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(50)
	}
	// The container's memory limit, known to the collector (see
	// internal/memlimit); GOMEMLIMIT set in the environment wins.
	memlimit.FromContainer()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	go func() {
		<-ctx.Done()
		stop() // a second signal ends the process at once
	}()
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
