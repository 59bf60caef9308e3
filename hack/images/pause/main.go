// Command pause is the test cluster's pod sandbox process (containerd's
// sandbox_image): it holds the pod's namespaces open, reaps the zombies a
// shared process namespace hands it, and exits on SIGINT or SIGTERM.
// It is a build tool, not part of Causeway.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for s := range sigs {
		if s != syscall.SIGCHLD {
			os.Exit(0)
		}
		for {
			var ws syscall.WaitStatus
			if pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil); pid <= 0 || err != nil {
				break
			}
		}
	}
}
