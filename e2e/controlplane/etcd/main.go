// Command etcd is the upstream etcd server, built from the Go module proxy for the loopback
// control plane used by Pagoda's integration tests.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
