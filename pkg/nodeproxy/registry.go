// Package nodeproxy is the per-node proxy: it takes captured workload
// connections, decides where they go (docs/design.md §5), carries them over HBONE,
// terminates HBONE for the pods of its node and enforces waypoint-only
// ingress.
package nodeproxy

import (
	"fmt"
	"net/netip"
	"slices"
	"sort"
	"strings"

	"github.com/causeway-mesh/causeway/pkg/trust"
	"github.com/causeway-mesh/causeway/pkg/xds/meshv1"
)

// Registry is an immutable index of the mesh as the control plane last
// described it. A new one is built on every change and swapped in whole.
type Registry struct {
	node       string
	byIP       map[netip.Addr]*meshv1.Workload
	byUID      map[string]*meshv1.Workload
	byVIP      map[netip.Addr]*meshv1.Service
	byHost     map[string]*meshv1.Service
	podHosts   map[string]netip.Addr       // per-pod names of headless services' endpoints
	waypoints  map[string]*meshv1.Waypoint // "<ns>/<name>"
	ingressWPs map[string][]*meshv1.Ref    // workload uid -> waypoints it must be reached through
	services   []*meshv1.Service
	servesFor  map[string][]*meshv1.Service // workload uid -> services it is an endpoint of
}

// NewRegistry indexes the resources for the proxy of node.
func NewRegistry(node string, workloads []*meshv1.Workload, services []*meshv1.Service, waypoints []*meshv1.Waypoint) *Registry {
	r := &Registry{
		node:       node,
		byIP:       map[netip.Addr]*meshv1.Workload{},
		byUID:      map[string]*meshv1.Workload{},
		byVIP:      map[netip.Addr]*meshv1.Service{},
		byHost:     map[string]*meshv1.Service{},
		podHosts:   map[string]netip.Addr{},
		waypoints:  map[string]*meshv1.Waypoint{},
		ingressWPs: map[string][]*meshv1.Ref{},
		services:   services,
		servesFor:  map[string][]*meshv1.Service{},
	}
	for _, w := range workloads {
		r.byUID[w.GetUid()] = w
		for _, a := range w.GetAddresses() {
			if ip, err := netip.ParseAddr(a); err == nil {
				r.byIP[ip.Unmap()] = w
			}
		}
		if w.GetWaypoint() != nil {
			r.addIngress(w.GetUid(), w.GetWaypoint())
		}
	}
	for _, s := range services {
		for _, v := range s.GetVips() {
			if ip, err := netip.ParseAddr(v); err == nil {
				r.byVIP[ip.Unmap()] = s
			}
		}
		if h := s.GetHostname(); h != "" {
			r.byHost[strings.ToLower(h)] = s
		}
		r.byHost[strings.ToLower(s.GetName()+"."+s.GetNamespace())] = s
		r.byHost[strings.ToLower(s.GetName()+"."+s.GetNamespace()+".svc")] = s
		for _, ep := range s.GetEndpoints() {
			if uid := ep.GetWorkloadUid(); uid != "" {
				r.servesFor[uid] = append(r.servesFor[uid], s)
			}
			if h := ep.GetHostname(); h != "" {
				if ip, err := netip.ParseAddr(ep.GetAddress()); err == nil {
					r.podHosts[strings.ToLower(h)] = ip.Unmap()
				}
			}
		}
		// Endpoints of a waypoint-bound service may only be reached through it.
		if s.GetWaypoint() != nil {
			for _, ep := range s.GetEndpoints() {
				r.addIngress(ep.GetWorkloadUid(), s.GetWaypoint())
			}
		}
	}
	for _, wp := range waypoints {
		r.waypoints[wp.GetNamespace()+"/"+wp.GetName()] = wp
	}
	return r
}

func (r *Registry) addIngress(uid string, ref *meshv1.Ref) {
	for _, have := range r.ingressWPs[uid] {
		if have.GetNamespace() == ref.GetNamespace() && have.GetName() == ref.GetName() {
			return
		}
	}
	r.ingressWPs[uid] = append(r.ingressWPs[uid], ref)
}

// Node is the node this registry serves.
func (r *Registry) Node() string { return r.node }

// WorkloadByIP returns the workload that owns ip.
func (r *Registry) WorkloadByIP(ip netip.Addr) (*meshv1.Workload, bool) {
	w, ok := r.byIP[ip.Unmap()]
	return w, ok
}

// LocalWorkload returns the captured (mesh-enrolled) workload of this node
// that owns ip.
func (r *Registry) LocalWorkload(ip netip.Addr) (*meshv1.Workload, bool) {
	w, ok := r.byIP[ip.Unmap()]
	if !ok || w.GetNode() != r.node || !w.GetHbone() {
		return nil, false
	}
	return w, true
}

// LocalWorkloads lists the captured workloads of this node, sorted by uid.
func (r *Registry) LocalWorkloads() []*meshv1.Workload {
	var out []*meshv1.Workload
	for _, w := range r.byUID {
		if w.GetNode() == r.node && w.GetHbone() {
			out = append(out, w)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].GetUid() < out[j].GetUid() })
	return out
}

// ServiceByVIP returns the service with virtual IP ip.
func (r *Registry) ServiceByVIP(ip netip.Addr) (*meshv1.Service, bool) {
	s, ok := r.byVIP[ip.Unmap()]
	return s, ok
}

// ResolvePodHost maps the per-pod name of a headless service's endpoint
// (a StatefulSet pod's <hostname>.<service>.<ns>.svc.<domain>) to its address.
func (r *Registry) ResolvePodHost(host string) (netip.Addr, bool) {
	ip, ok := r.podHosts[strings.ToLower(strings.TrimSuffix(host, "."))]
	return ip, ok
}

// ResolveHost maps name.ns, name.ns.svc or the full hostname to a service.
func (r *Registry) ResolveHost(host string) (*meshv1.Service, bool) {
	s, ok := r.byHost[strings.ToLower(strings.TrimSuffix(host, "."))]
	return s, ok
}

// Waypoint resolves a waypoint reference. A reference to a waypoint the
// registry does not know is an error: traffic bound to it must fail closed.
func (r *Registry) Waypoint(ref *meshv1.Ref) (*meshv1.Waypoint, error) {
	wp, ok := r.waypoints[ref.GetNamespace()+"/"+ref.GetName()]
	if !ok {
		return nil, fmt.Errorf("waypoint %s/%s is not known", ref.GetNamespace(), ref.GetName())
	}
	if len(wp.GetAddresses()) == 0 {
		return nil, fmt.Errorf("waypoint %s/%s has no ready pod (no address)", ref.GetNamespace(), ref.GetName())
	}
	return wp, nil
}

// IngressWaypoints are the waypoints through which a workload is reached:
// its own binding and those of every service it is an endpoint of. Tunnels
// from them are known to come from a waypoint; a workload with a binding of
// its own accepts no others (admitInbound).
func (r *Registry) IngressWaypoints(uid string) []*meshv1.Ref { return r.ingressWPs[uid] }

// ServiceHostnames lists the hostnames of the services whose port maps to
// port on the workload uid (servicesServing), sorted.
func (r *Registry) ServiceHostnames(uid string, port uint16) []string {
	var out []string
	for _, s := range r.servicesServing(uid, port) {
		if !slices.Contains(out, s.GetHostname()) {
			out = append(out, s.GetHostname())
		}
	}
	sort.Strings(out)
	return out
}

// InboundService is the service a connection to port on the workload uid
// was for, as far as the port tells: the one service whose port maps
// there, nil when none or several do.
func (r *Registry) InboundService(uid string, port uint16) *meshv1.Service {
	if ss := r.servicesServing(uid, port); len(ss) == 1 {
		return ss[0]
	}
	return nil
}

// servicesServing lists the services whose port maps to port on the
// workload uid (an endpoint's own mapping, else the target port, else the
// port itself).
func (r *Registry) servicesServing(uid string, port uint16) []*meshv1.Service {
	var out []*meshv1.Service
	for _, s := range r.servesFor[uid] {
		if servesPort(s, uid, port) && !slices.Contains(out, s) { // a dual-stack pod is two endpoints
			out = append(out, s)
		}
	}
	return out
}

func servesPort(s *meshv1.Service, uid string, port uint16) bool {
	for _, ep := range s.GetEndpoints() {
		if ep.GetWorkloadUid() != uid {
			continue
		}
		for _, sp := range s.GetPorts() {
			target := ep.GetPorts()[sp.GetPort()]
			if target == 0 {
				target = sp.GetTargetPort()
			}
			if target == 0 {
				target = sp.GetPort()
			}
			if target == uint32(port) {
				return true
			}
		}
	}
	return false
}

// Services lists every service.
func (r *Registry) Services() []*meshv1.Service { return r.services }

// AllWorkloads lists every workload.
func (r *Registry) AllWorkloads() map[string]*meshv1.Workload { return r.byUID }

// refusedWorkload is errRefused with the control plane's reason when it
// refused w's configuration: its traffic is refused both ways.
func refusedWorkload(w *meshv1.Workload) error {
	if why := w.GetInvalidReason(); why != "" {
		return fmt.Errorf("%w: the control plane refused workload %s/%s: %s", errRefused, w.GetNamespace(), w.GetName(), why)
	}
	return nil
}

// WaypointIdentity parses a waypoint's identity.
func WaypointIdentity(wp *meshv1.Waypoint) (trust.Identity, error) {
	id, err := trust.ParseIdentity(wp.GetIdentity())
	if err != nil {
		return trust.Identity{}, fmt.Errorf("waypoint %s/%s: %w", wp.GetNamespace(), wp.GetName(), err)
	}
	return id, nil
}
