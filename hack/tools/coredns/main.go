// Command coredns is CoreDNS with only the plugins the real node's Corefile
// (hack/node.sh) uses, the way CoreDNS builds a server with a chosen set of
// plugins: its coremain with those plugins imported, in the execution order
// of CoreDNS's own directive list. The full build's other plugins (the cloud
// DNS providers among them) are nearly half of what it compiles.
package main

import (
	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/log"

	"github.com/coredns/coredns/coremain"
)

func main() {
	coremain.Run()
}
