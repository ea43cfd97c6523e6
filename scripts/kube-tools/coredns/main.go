// CoreDNS with only the plugins the test node's Corefile uses (test/support/kube-node-config.ts):
// CoreDNS's own main compiles in every plugin, the cloud DNS providers' SDKs with them, which
// made it one of the longest tool builds for four directives.
package main

import (
	"github.com/coredns/coredns/coremain"
	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/ready"
)

func main() { coremain.Run() }
