// Command runwarden-postrender is a Helm post-renderer: Helm's rendered
// manifests on standard input, the same manifests after a Kustomize overlay
// on standard output. See docs/postrender.md.
package main

import (
	"context"
	"os"
	"os/signal"
	"runtime/debug"
	"syscall"
)

func main() {
	// A post-renderer lives for one stream and allocates much of it:
	// collecting less often saves a third of the time for a little memory.
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(400)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	go func() {
		<-ctx.Done()
		stop() // a second signal ends the process at once
	}()
	stderr := os.Stderr
	restore := dedupStderr()
	code := run(ctx, os.Args[1:], os.Getenv, os.Stdin, os.Stdout, stderr)
	restore()
	stop()
	os.Exit(code)
}
