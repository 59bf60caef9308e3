package xds

import (
	"maps"
	"slices"
	"sort"
	"strings"
	"sync"

	"google.golang.org/protobuf/proto"

	"github.com/causeway-mesh/causeway/pkg/xds/meshv1"
)

// RouteReads lists what the routes of namespace ns, and the consumer routes
// attached to its Services, send traffic to in other namespaces: the
// Services of their valid backends and mirrors (the configuration source
// already checked ReferenceGrants: a reference that no grant permits
// carries an invalid_reason), and the Workloads behind those Services as
// far as services knows them (by "<namespace>/<name>"). The control plane
// lets the namespace's waypoint read exactly these; the waypoint
// subscribes to them (RouteBackends).
func RouteReads(ns string, httpRoutes []*meshv1.HTTPRoute, grpcRoutes []*meshv1.GRPCRoute, services map[string]*meshv1.Service) (serviceNames, workloadUIDs []string) {
	var rules []routeRule
	servedBy := func(r proto.Message) bool {
		return meshv1.ResourceNamespace(r) == ns || slices.Contains(meshv1.ParentNamespaces(r), ns)
	}
	for _, r := range httpRoutes {
		if servedBy(r) {
			for _, rule := range r.GetRules() {
				rules = append(rules, rule)
			}
		}
	}
	for _, r := range grpcRoutes {
		if servedBy(r) {
			for _, rule := range r.GetRules() {
				rules = append(rules, rule)
			}
		}
	}
	svcs := backendServices(rules)
	serviceNames, workloadUIDs = backendReads(ns, svcs, services)
	return serviceNames, workloadUIDs
}

// IngressReads lists what ingress gateway g's routes send traffic to
// outside its namespace: as RouteReads, the Services of their valid
// backends and mirrors and the Workloads behind them, and the Waypoints
// those Services (or, for a Service without one, its endpoints'
// workloads) are bound to, since the gateway tunnels to a bound
// destination through its waypoint. The control plane grants the
// gateway's namespace these; the gateway subscribes to them
// (IngressBackends), and to its own namespace's by name too.
func IngressReads(g *meshv1.IngressGateway, services map[string]*meshv1.Service, workloads map[string]*meshv1.Workload) (serviceNames, workloadUIDs, waypointNames []string) {
	var rules []routeRule
	for _, l := range g.GetListeners() {
		for _, r := range l.GetHttpRoutes() {
			for _, rule := range r.GetRules() {
				rules = append(rules, rule)
			}
		}
		for _, r := range l.GetGrpcRoutes() {
			for _, rule := range r.GetRules() {
				rules = append(rules, rule)
			}
		}
	}
	svcs := backendServices(rules)
	wps := map[string]bool{}
	for name := range svcs {
		s := services[name]
		if ref := s.GetWaypoint(); ref != nil {
			wps[ref.GetNamespace()+"/"+ref.GetName()] = true
			continue
		}
		for _, ep := range s.GetEndpoints() {
			if ref := workloads[ep.GetWorkloadUid()].GetWaypoint(); ref != nil {
				wps[ref.GetNamespace()+"/"+ref.GetName()] = true
			}
		}
	}
	serviceNames, workloadUIDs = backendReads(g.GetNamespace(), svcs, services)
	for name := range wps {
		if ns, _, _ := strings.Cut(name, "/"); ns != g.GetNamespace() {
			waypointNames = append(waypointNames, name)
		}
	}
	sort.Strings(waypointNames)
	return serviceNames, workloadUIDs, waypointNames
}

// backendServices are the Services ("<namespace>/<name>") of the valid
// backends and mirrors of rules.
func backendServices(rules []routeRule) map[string]bool {
	svcs := map[string]bool{}
	add := func(b *meshv1.BackendRef) {
		if b != nil && b.GetInvalidReason() == "" && b.GetNamespace() != "" {
			svcs[b.GetNamespace()+"/"+b.GetName()] = true
		}
	}
	for _, rule := range rules {
		for _, f := range rule.GetFilters() {
			add(f.GetRequestMirror().GetBackend())
		}
		for _, b := range rule.GetBackends() {
			add(b.GetBackend())
			for _, f := range b.GetFilters() {
				add(f.GetRequestMirror().GetBackend())
			}
		}
	}
	return svcs
}

// backendReads are the Services of svcs outside namespace ns and the
// Workloads behind them, sorted.
func backendReads(ns string, svcs map[string]bool, services map[string]*meshv1.Service) (serviceNames, workloadUIDs []string) {
	wls := map[string]bool{}
	for name := range svcs {
		if svcNS, _, _ := strings.Cut(name, "/"); svcNS == ns {
			continue
		}
		serviceNames = append(serviceNames, name)
		for _, ep := range services[name].GetEndpoints() {
			if uid := ep.GetWorkloadUid(); uid != "" {
				wls[uid] = true
			}
		}
	}
	for uid := range wls {
		workloadUIDs = append(workloadUIDs, uid)
	}
	sort.Strings(serviceNames)
	sort.Strings(workloadUIDs)
	return serviceNames, workloadUIDs
}

// routeRule is what HTTPRouteRule and GRPCRouteRule share: where they
// send traffic.
type routeRule interface {
	GetFilters() []*meshv1.HTTPRouteFilter
	GetBackends() []*meshv1.HTTPBackendRef
}

// RouteBackends keeps a waypoint's or an ingress gateway's client
// subscribed to what its routes send traffic to in other namespaces
// (RouteReads, IngressReads): call Update with every new state. A
// Service's workloads and waypoint follow once the Service itself has
// arrived.
type RouteBackends struct {
	client *Client
	reads  func(*State) map[string][]string // type URL -> names

	mu   sync.Mutex
	have map[string]map[string]bool // type URL -> names subscribed
}

// NewRouteBackends follows the routes of namespace (a waypoint's) for client.
func NewRouteBackends(client *Client, namespace string) *RouteBackends {
	return &RouteBackends{client: client, have: map[string]map[string]bool{}, reads: func(s *State) map[string][]string {
		svcs, wls := RouteReads(namespace, slices.Collect(maps.Values(s.HTTPRoutes)), slices.Collect(maps.Values(s.GRPCRoutes)), s.Services)
		return map[string][]string{meshv1.ServiceTypeURL: svcs, meshv1.WorkloadTypeURL: wls}
	}}
}

// NewIngressBackends follows the routes of ingress gateway
// "<namespace>/<name>" for client.
func NewIngressBackends(client *Client, namespace, name string) *RouteBackends {
	return &RouteBackends{client: client, have: map[string]map[string]bool{}, reads: func(s *State) map[string][]string {
		svcs, wls, wps := IngressReads(s.IngressGateways[namespace+"/"+name], s.Services, s.Workloads)
		return map[string][]string{meshv1.ServiceTypeURL: svcs, meshv1.WorkloadTypeURL: wls, meshv1.WaypointTypeURL: wps}
	}}
}

// Update subscribes to newly referenced names and drops the rest.
func (f *RouteBackends) Update(s *State) error {
	reads := f.reads(s)
	f.mu.Lock()
	defer f.mu.Unlock()
	for typeURL, want := range reads {
		have := f.have[typeURL]
		wanted := map[string]bool{}
		var add, drop []string
		for _, n := range want {
			wanted[n] = true
			if !have[n] {
				add = append(add, n)
			}
		}
		for n := range have {
			if !wanted[n] {
				drop = append(drop, n)
			}
		}
		if len(add) > 0 {
			if err := f.client.Subscribe(typeURL, add...); err != nil {
				return err
			}
		}
		if len(drop) > 0 {
			if err := f.client.Unsubscribe(typeURL, drop...); err != nil {
				return err
			}
		}
		f.have[typeURL] = wanted
	}
	return nil
}
