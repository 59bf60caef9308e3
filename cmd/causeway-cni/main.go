// Command causeway-cni is Causeway's chained CNI plugin: it runs after the
// plugin that sets up a pod's network, asks the node agent to capture the
// pod (redirection rules in its network namespace, handoff to the node
// proxy), blocks the sandbox until that is done and fails it otherwise,
// then passes the previous result through.
//
// `causeway-cni install --bin-dir DIR` copies the binary itself into the
// node's CNI binary directory (the node proxy DaemonSet's init container;
// the agent writes the chained configuration and removes both on
// uninstall).
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/containernetworking/cni/pkg/skel"
	cniversion "github.com/containernetworking/cni/pkg/version"

	"github.com/causeway-mesh/causeway/pkg/capture/cni"
	"github.com/causeway-mesh/causeway/pkg/capture/cniinstall"
	"github.com/causeway-mesh/causeway/pkg/version"
)

func main() {
	// Container runtimes run plugins with no arguments (CNI_COMMAND says
	// what to do), so an argument is an operator's command.
	if len(os.Args) > 1 {
		os.Exit(command(os.Args[1:]))
	}
	skel.PluginMainFuncs(skel.CNIFuncs{Add: cni.Add, Del: cni.Del, Check: cni.Check},
		cniversion.All, "causeway-cni: transparent capture for the Causeway mesh")
}

func command(args []string) int {
	if args[0] == "--version" || args[0] == "-version" {
		version.Print(os.Stdout, "causeway-cni")
		return 0
	}
	if args[0] != "install" {
		fmt.Fprintf(os.Stderr, "causeway-cni: unknown command %q (install or --version; a runtime passes none)\n", args[0])
		return 2
	}
	fs := flag.NewFlagSet("causeway-cni install", flag.ContinueOnError)
	dir := fs.String("bin-dir", "/host/opt/cni/bin", "the node's CNI binary directory, as mounted")
	if err := fs.Parse(args[1:]); err != nil {
		return 2
	}
	self, err := os.Executable()
	if err == nil {
		err = cniinstall.CopyBinary(self, *dir)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "causeway-cni install: %v\n", err)
		return 1
	}
	fmt.Printf("causeway-cni: installed in %s\n", *dir)
	return 0
}
