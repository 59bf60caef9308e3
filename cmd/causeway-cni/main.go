// Command causeway-cni is Causeway's chained CNI plugin: it runs after the
// plugin that sets up a pod's network, asks the node agent to capture the
// pod (redirection rules in its network namespace, handoff to the node
// proxy), blocks the sandbox until that is done and fails it otherwise,
// then passes the previous result through.
package main

import (
	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/version"

	"github.com/causeway-mesh/causeway/pkg/capture/cni"
)

func main() {
	skel.PluginMainFuncs(skel.CNIFuncs{Add: cni.Add, Del: cni.Del, Check: cni.Check},
		version.All, "causeway-cni: transparent capture for the Causeway mesh")
}
