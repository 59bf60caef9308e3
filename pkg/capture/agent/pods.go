package agent

import (
	"context"
	"fmt"
)

// Labels the agent reads (docs/design.md §6).
const (
	LabelDataplaneMode = "causeway.dev/dataplane-mode"
	ModeMesh           = "mesh"
	ModeNone           = "none"
	// LabelGatewayName is carried by waypoint pods, which are never captured.
	LabelGatewayName = "gateway.networking.k8s.io/gateway-name"
)

// Pod is what the agent knows of a pod.
type Pod struct {
	UID, Name, Namespace, ServiceAccount string
	Labels                               map[string]string
	// NamespaceLabels are the labels of the pod's namespace.
	NamespaceLabels map[string]string
}

// Pods looks pods up by name. In a cluster it is backed by the Kubernetes
// API (a node-local informer); tests use a fixed list.
type Pods interface {
	Pod(ctx context.Context, namespace, name string) (Pod, error)
}

// Enrolled says whether the pod belongs in the mesh, and why not when it
// does not: the pod's own label wins (mesh or none), then its namespace's;
// waypoints never are (they speak HBONE themselves).
func Enrolled(p Pod) (bool, string) {
	if _, ok := p.Labels[LabelGatewayName]; ok {
		return false, "waypoint pods are not captured"
	}
	switch p.Labels[LabelDataplaneMode] {
	case ModeMesh:
		return true, ""
	case ModeNone:
		return false, fmt.Sprintf("pod label %s=%s opts it out", LabelDataplaneMode, ModeNone)
	}
	if p.NamespaceLabels[LabelDataplaneMode] == ModeMesh {
		return true, ""
	}
	return false, fmt.Sprintf("neither the pod nor namespace %s has %s=%s", p.Namespace, LabelDataplaneMode, ModeMesh)
}
