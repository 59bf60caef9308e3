// Package localmesh runs a whole mesh on one machine without root or
// Kubernetes (DESIGN §6 local mode): the control plane, a node proxy per
// node, a waypoint per waypoint pod and the sample application pods, each as
// its own process on its loopback addresses. meshctl up, meshctl demo and the
// end-to-end tests share it.
package localmesh

import (
	"fmt"
	"net"
	"net/netip"
	"sort"
	"strconv"

	"github.com/causeway-mesh/causeway/pkg/config"
	"github.com/causeway-mesh/causeway/pkg/xds/meshv1"
)

// Plan says which processes make up the mesh and where each listens.
type Plan struct {
	ControlPlane ControlPlanePlan
	Nodes        []NodePlan
	Waypoints    []WaypointPlan
	Apps         []AppPlan
	Pods         []PodPlan
}

// PodPlan says where a pod's traffic comes from: its IP, and for mesh pods
// the SOCKS5 address of its node proxy.
type PodPlan struct {
	Namespace, Name string
	IP              string
	Node            string
	SOCKS5          string // empty for pods outside the mesh
	Ports           []uint32
}

// ControlPlanePlan is where the control plane listens.
type ControlPlanePlan struct {
	GRPC   string // xDS and CA
	Status string // readiness and metrics
}

// NodePlan is one node proxy.
type NodePlan struct {
	Node   string
	Admin  string
	Status string
	SOCKS5 string
	Token  string
}

// WaypointPlan is one waypoint pod.
type WaypointPlan struct {
	Namespace, Name string // the Gateway
	Pod             string
	HBONE           string // pod IP:15008
	Admin, Status   string
	Token           string
	Node            string
	ServiceAccount  string
}

// AppPlan is one sample application pod served by the echo backend.
type AppPlan struct {
	Namespace, Name string
	Listen          []string
}

// Ports: base+0 xDS, base+1 control plane status; nodes from base+10 in
// steps of 10 (admin, status, SOCKS5); waypoints from base+500 (admin, status).
const (
	nodePortsStart     = 10
	waypointPortsStart = 500
	portsPerProcess    = 10
)

// NewPlan lays out the processes for a translated configuration.
func NewPlan(s *config.Snapshot, basePort int) (*Plan, error) {
	if basePort <= 0 || basePort+waypointPortsStart+portsPerProcess*64 > 65535 {
		return nil, fmt.Errorf("base port %d out of range", basePort)
	}
	port := func(off int) string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(basePort+off)) }
	p := &Plan{ControlPlane: ControlPlanePlan{GRPC: port(0), Status: port(1)}}

	workloads := sortedWorkloads(s)
	nodes := map[string]bool{}
	for _, w := range workloads {
		if w.GetHbone() && w.GetNode() != "" {
			nodes[w.GetNode()] = true
		}
	}
	for i, n := range sortedKeys(nodes) {
		off := nodePortsStart + i*portsPerProcess
		p.Nodes = append(p.Nodes, NodePlan{Node: n, Admin: port(off), Status: port(off + 1), SOCKS5: port(off + 2),
			Token: fmt.Sprintf("node-%s-token", n)})
	}
	for _, w := range workloads {
		if len(w.GetAddresses()) == 0 {
			continue
		}
		pod := PodPlan{Namespace: w.GetNamespace(), Name: w.GetName(), IP: w.GetAddresses()[0], Node: w.GetNode(), Ports: w.GetServingPorts()}
		if n, ok := p.Node(w.GetNode()); ok && w.GetHbone() {
			pod.SOCKS5 = n.SOCKS5
		}
		p.Pods = append(p.Pods, pod)
	}
	for _, w := range workloads {
		gw := w.GetWaypointForGateway()
		if gw == nil {
			continue
		}
		if len(w.GetAddresses()) == 0 {
			return nil, fmt.Errorf("waypoint pod %s/%s has no pod IP", w.GetNamespace(), w.GetName())
		}
		off := waypointPortsStart + len(p.Waypoints)*portsPerProcess
		p.Waypoints = append(p.Waypoints, WaypointPlan{
			Namespace: gw.GetNamespace(), Name: gw.GetName(), Pod: w.GetName(),
			HBONE: net.JoinHostPort(w.GetAddresses()[0], "15008"), Admin: port(off), Status: port(off + 1),
			Token: fmt.Sprintf("waypoint-%s-%s-token", w.GetNamespace(), w.GetName()), Node: w.GetNode(),
			ServiceAccount: w.GetServiceAccount(),
		})
	}
	for _, w := range workloads {
		if w.GetWaypointForGateway() != nil || len(w.GetServingPorts()) == 0 || len(w.GetAddresses()) == 0 {
			continue
		}
		// Mesh pods' apps listen on their app address (the node proxy owns
		// the pod IP); pods outside the mesh keep their pod IP.
		host := w.GetAddresses()[0]
		if w.GetHbone() {
			if w.GetAppAddress() == "" {
				return nil, fmt.Errorf("mesh pod %s/%s serves ports but has no causeway.dev/app-address annotation", w.GetNamespace(), w.GetName())
			}
			host = w.GetAppAddress()
		}
		if _, err := netip.ParseAddr(host); err != nil {
			return nil, fmt.Errorf("pod %s/%s address %q: %w", w.GetNamespace(), w.GetName(), host, err)
		}
		app := AppPlan{Namespace: w.GetNamespace(), Name: w.GetName()}
		for _, sp := range w.GetServingPorts() {
			app.Listen = append(app.Listen, net.JoinHostPort(host, strconv.Itoa(int(sp))))
		}
		p.Apps = append(p.Apps, app)
	}
	return p, nil
}

// Pod finds a pod by "namespace/name", or by name when that is unique.
func (p *Plan) Pod(ref string) (PodPlan, error) {
	var found []PodPlan
	for _, pod := range p.Pods {
		if pod.Namespace+"/"+pod.Name == ref {
			return pod, nil
		}
		if pod.Name == ref {
			found = append(found, pod)
		}
	}
	switch len(found) {
	case 1:
		return found[0], nil
	case 0:
		return PodPlan{}, fmt.Errorf("no pod %q in the mesh", ref)
	default:
		return PodPlan{}, fmt.Errorf("pod name %q is ambiguous; use namespace/name", ref)
	}
}

// Node returns the plan of the named node.
func (p *Plan) Node(name string) (NodePlan, bool) {
	for _, n := range p.Nodes {
		if n.Node == name {
			return n, true
		}
	}
	return NodePlan{}, false
}

func sortedWorkloads(s *config.Snapshot) []*meshv1.Workload {
	out := make([]*meshv1.Workload, 0, len(s.Workloads))
	for _, w := range s.Workloads {
		out = append(out, w)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].GetUid() < out[j].GetUid() })
	return out
}

func sortedKeys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
