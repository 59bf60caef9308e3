// Package cni is the chained CNI plugin's side of capture (cmd/causeway-cni):
// for each pod sandbox it asks the node agent, over a unix socket on the
// node, to capture the pod, and fails the sandbox when capture fails, so a
// mesh pod never starts unprotected. It also defines what the plugin and
// the agent say to each other.
package cni

import "net/netip"

// Paths on the agent's socket (HTTP over a unix socket).
const (
	PathAdd   = "/v1/cni/add"
	PathDel   = "/v1/cni/del"
	PathCheck = "/v1/cni/check"
)

// DefaultAgentSocket is where the node agent listens (docs/design.md §10).
const DefaultAgentSocket = "/etc/cni/net.d/causeway/cni.sock"

// DefaultExcludeNamespaces are never captured: kube-system, and
// causeway-system, where the agent itself runs (its own sandbox must not
// wait for it).
var DefaultExcludeNamespaces = []string{"kube-system", "causeway-system"}

// MaxBody bounds an event or a reply on the wire.
const MaxBody = 64 << 10

// Event is one CNI call for a pod sandbox.
type Event struct {
	ContainerID string `json:"container_id"`
	// Netns is the sandbox's network namespace path (CNI_NETNS).
	Netns     string `json:"netns"`
	PodName   string `json:"pod_name"`
	Namespace string `json:"namespace"`
	// IPs are the pod's addresses from the previous plugin's result.
	IPs []netip.Addr `json:"ips,omitempty"`
	// Gateways are the node's addresses on the pod's network (the
	// previous result's gateways), where kubelet's probes come from.
	Gateways []netip.Addr `json:"gateways,omitempty"`
}

// Reply is the agent's answer.
type Reply struct {
	// Captured: the pod's rules are in place and the node proxy serves it.
	Captured bool `json:"captured"`
	// Reason says why a pod was not captured, or what failed.
	Reason string `json:"reason,omitempty"`
	// Retryable: a failure that may pass on a later attempt (the node
	// proxy was not connected), as opposed to one that will not.
	Retryable bool `json:"retryable,omitempty"`
}
