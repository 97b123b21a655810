// Command pause is the sandbox ("pause") container of the local cluster's
// real node: it holds a pod's namespaces open and exits cleanly on SIGTERM or
// SIGINT. It is built static and packed into an image by hack/images.sh, so
// the node needs no registry.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	<-sig
}
