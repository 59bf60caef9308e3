// Package localmesh runs a whole mesh on one machine without root or
// Kubernetes (docs/design.md §6 local mode): the control plane, a node proxy per
// node, a waypoint per waypoint pod and the sample application pods, each as
// its own process on its loopback addresses. meshctl up, meshctl demo and the
// end-to-end tests share it.
package localmesh

import (
	"fmt"
	"maps"
	"net"
	"net/netip"
	"slices"
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
	// Example is a request to try by hand, nil when the configuration has
	// no HTTP service with a mesh pod to call it from.
	Example *ExampleRequest `json:",omitempty"`
}

// ExampleRequest is a request one pod of the mesh can make: Client
// ("namespace/name") GETs URL.
type ExampleRequest struct {
	Client, URL string
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

// Env is the environment of a command acting as the pod (meshctl exec,
// local apps): CAUSEWAY_POD ("namespace/name"), CAUSEWAY_POD_IP, and for mesh
// pods CAUSEWAY_SOCKS5 and ALL_PROXY (socks5h://, so the mesh resolves names).
func (p PodPlan) Env() []string {
	env := []string{"CAUSEWAY_POD=" + p.Namespace + "/" + p.Name, "CAUSEWAY_POD_IP=" + p.IP}
	if p.SOCKS5 != "" {
		env = append(env, "CAUSEWAY_SOCKS5="+p.SOCKS5, "ALL_PROXY=socks5h://"+p.SOCKS5)
	}
	return env
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

// WaypointPlan is one waypoint pod, or one ingress Gateway's pod
// (Ingress: the waypoint binary's ingress role, opening the Gateway's
// listener ports on IP).
type WaypointPlan struct {
	Namespace, Name string // the Gateway
	Pod             string
	Ingress         bool
	IP              string // the pod IP
	HBONE           string // pod IP:15008 (waypoints only)
	Admin, Status   string
	Token           string
	Node            string
	ServiceAccount  string
}

// AppPlan is the application local mode runs for a pod whose
// causeway.dev/local-app annotation asks for one.
type AppPlan struct {
	Namespace, Name string
	// Listen are the addresses the app serves: its app address (mesh pods)
	// or pod IP with each serving port.
	Listen []string
	// Command is the annotation: EchoApp, or a command line run by /bin/sh.
	Command string
}

// EchoApp, as causeway.dev/local-app, runs Causeway's echo backend on
// every serving port of the pod.
const EchoApp = "echo"

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
	for i, n := range slices.Sorted(maps.Keys(nodes)) {
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
		gw, ingress := w.GetWaypointForGateway(), false
		if gw == nil {
			name := w.GetLabels()[config.LabelGatewayName]
			if s.IngressGateways[w.GetNamespace()+"/"+name] == nil {
				continue
			}
			gw, ingress = &meshv1.Ref{Namespace: w.GetNamespace(), Name: name}, true
		}
		if len(w.GetAddresses()) == 0 {
			return nil, fmt.Errorf("gateway pod %s/%s has no pod IP", w.GetNamespace(), w.GetName())
		}
		off := waypointPortsStart + len(p.Waypoints)*portsPerProcess
		wp := WaypointPlan{
			Namespace: gw.GetNamespace(), Name: gw.GetName(), Pod: w.GetName(), Ingress: ingress, IP: w.GetAddresses()[0],
			Admin: port(off), Status: port(off + 1),
			Token: fmt.Sprintf("waypoint-%s-%s-token", w.GetNamespace(), w.GetName()), Node: w.GetNode(),
			ServiceAccount: w.GetServiceAccount(),
		}
		if !ingress {
			wp.HBONE = net.JoinHostPort(wp.IP, "15008")
		}
		p.Waypoints = append(p.Waypoints, wp)
	}
	for _, w := range workloads {
		if w.GetWaypointForGateway() != nil || len(w.GetServingPorts()) == 0 || len(w.GetAddresses()) == 0 {
			continue
		}
		// Mesh pods' apps listen on their app address (the node proxy owns
		// the pod IP and delivers there), whoever runs them.
		if w.GetHbone() && w.GetAppAddress() == "" {
			return nil, fmt.Errorf("mesh pod %s/%s serves ports but has no %s annotation", w.GetNamespace(), w.GetName(), config.AnnotationAppAddress)
		}
	}
	for _, w := range workloads {
		command, ok := s.LocalApps[w.GetUid()]
		if !ok || len(w.GetAddresses()) == 0 {
			continue
		}
		app := AppPlan{Namespace: w.GetNamespace(), Name: w.GetName(), Command: command}
		if command == EchoApp && len(w.GetServingPorts()) == 0 {
			return nil, fmt.Errorf("pod %s/%s: %s %s needs container ports to serve", w.GetNamespace(), w.GetName(), config.AnnotationLocalApp, EchoApp)
		}
		host := w.GetAddresses()[0]
		if w.GetHbone() && w.GetAppAddress() != "" {
			host = w.GetAppAddress()
		}
		if _, err := netip.ParseAddr(host); err != nil {
			return nil, fmt.Errorf("pod %s/%s address %q: %w", w.GetNamespace(), w.GetName(), host, err)
		}
		for _, sp := range w.GetServingPorts() {
			app.Listen = append(app.Listen, net.JoinHostPort(host, strconv.Itoa(int(sp))))
		}
		p.Apps = append(p.Apps, app)
	}
	p.Example = exampleRequest(s, p)
	return p, nil
}

// exampleRequest picks a request to suggest: a GET of the first HTTP
// service (by namespace and name) that has an endpoint running a local app,
// else of the first HTTP service with endpoints, from the first mesh pod
// that serves nothing (a client), else from any other mesh pod.
func exampleRequest(s *config.Snapshot, p *Plan) *ExampleRequest {
	type target struct {
		svc  *meshv1.Service
		port uint32
		apps bool // an endpoint runs a local app
	}
	var best *target
	for _, key := range slices.Sorted(maps.Keys(s.Services)) {
		svc := s.Services[key]
		port, ok := httpPort(svc)
		if !ok || len(svc.GetEndpoints()) == 0 {
			continue
		}
		t := &target{svc: svc, port: port}
		for _, ep := range svc.GetEndpoints() {
			if _, ok := s.LocalApps[ep.GetWorkloadUid()]; ok {
				t.apps = true
			}
		}
		if best == nil || t.apps && !best.apps {
			best = t
		}
		if best.apps {
			break
		}
	}
	if best == nil {
		return nil
	}
	endpoint := map[string]bool{}
	for _, ep := range best.svc.GetEndpoints() {
		endpoint[ep.GetWorkloadUid()] = true
	}
	var client, server string // first mesh pod serving nothing, first other one
	for _, w := range sortedWorkloads(s) {
		if _, onNode := p.Node(w.GetNode()); !onNode || !w.GetHbone() || endpoint[w.GetUid()] || len(w.GetAddresses()) == 0 {
			continue
		}
		ref := w.GetNamespace() + "/" + w.GetName()
		switch {
		case len(w.GetServingPorts()) == 0 && client == "":
			client = ref
		case server == "":
			server = ref
		}
	}
	if client == "" {
		client = server
	}
	if client == "" {
		return nil
	}
	url := "http://" + best.svc.GetName() + "." + best.svc.GetNamespace()
	if best.port != 80 {
		url += ":" + strconv.Itoa(int(best.port))
	}
	return &ExampleRequest{Client: client, URL: url + "/"}
}

// httpPort is the service's first port speaking HTTP/1.1 (what curl sends).
func httpPort(svc *meshv1.Service) (uint32, bool) {
	for _, sp := range svc.GetPorts() {
		if sp.GetAppProtocol() == "http" {
			return sp.GetPort(), true
		}
	}
	return 0, false
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
