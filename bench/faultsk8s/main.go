// Command faultsk8s is the fault run of bench/faults on the test cluster
// (make cluster): it installs the mesh and the sample shop, runs a
// fixed-rate load from an enrolled client pod through the shop's waypoint
// to its reviews backends, and injects one fault per row while the load
// runs: pods deleted, rollouts, configuration edited. For each row it
// prints requests sent, failed (by cause) and the longest gap between
// successful answers, on new connections (one per request) and existing
// ones (keep-alive), and whether the row met its expectation; it exits 1
// when any row did not. It removes what it installed.
//
// One static binary plays both parts: on the host
//
//	faultsk8s run -kubeconfig FILE -kubectl PATH -ctr-address SOCK [-row 24s] [-rate 25] [-only REGEXP]
//
// and, in the client pod (its image pushed by bench/images-k8s.sh faultsk8s),
//
//	faultsk8s idle                       the pod's process
//	faultsk8s load [-url U] [-rate N]    the load, through kubectl exec -i: results on stdout until stdin ends
//
// bench/faults-k8s.sh builds and pushes the images and runs it.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: faultsk8s run|load|idle [flags]")
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "run":
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		err = runMain(ctx, os.Args[2:])
		stop()
	case "load":
		err = loadMain(os.Args[2:])
	case "idle":
		idleMain()
	default:
		err = fmt.Errorf("unknown mode %q: want run, load or idle", os.Args[1])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "faultsk8s:", err)
		os.Exit(1)
	}
}

func flagSet(name string) *flag.FlagSet {
	return flag.NewFlagSet("faultsk8s "+name, flag.ContinueOnError)
}
