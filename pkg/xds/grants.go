package xds

import (
	"maps"
	"slices"
	"sort"
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
	svcs := map[string]bool{}
	add := func(b *meshv1.BackendRef) {
		if b != nil && b.GetInvalidReason() == "" && b.GetNamespace() != "" && b.GetNamespace() != ns {
			svcs[b.GetNamespace()+"/"+b.GetName()] = true
		}
	}
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
	wls := map[string]bool{}
	for name := range svcs {
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

// grants maps a namespace to the names outside it that its callers may
// read: type URL -> name -> true (RouteReads of the namespace's routes).
type grants map[string]map[string]map[string]bool

func (g grants) allows(ns, typeURL, name string) bool { return g[ns][typeURL][name] }

// computeGrants derives the grants of every namespace that has routes.
func computeGrants(res map[string]map[string]proto.Message) grants {
	services := map[string]*meshv1.Service{}
	for name, m := range res[meshv1.ServiceTypeURL] {
		if s, ok := m.(*meshv1.Service); ok {
			services[name] = s
		}
	}
	namespaces := map[string]bool{} // that serve a route
	http := servedRoutes[*meshv1.HTTPRoute](res[meshv1.HTTPRouteTypeURL], namespaces)
	grpc := servedRoutes[*meshv1.GRPCRoute](res[meshv1.GRPCRouteTypeURL], namespaces)
	g := grants{}
	for ns := range namespaces {
		svcs, wls := RouteReads(ns, http, grpc, services)
		if len(svcs) == 0 {
			continue
		}
		g[ns] = map[string]map[string]bool{meshv1.ServiceTypeURL: {}, meshv1.WorkloadTypeURL: {}}
		for _, n := range svcs {
			g[ns][meshv1.ServiceTypeURL][n] = true
		}
		for _, n := range wls {
			g[ns][meshv1.WorkloadTypeURL][n] = true
		}
	}
	return g
}

// servedRoutes returns the routes of type R in ms and marks in namespaces
// those that serve them: each route's own and its parents'.
func servedRoutes[R interface {
	proto.Message
	GetNamespace() string
}](ms map[string]proto.Message, namespaces map[string]bool) []R {
	var out []R
	for _, m := range ms {
		if r, ok := m.(R); ok {
			out = append(out, r)
			namespaces[r.GetNamespace()] = true
			for _, ns := range meshv1.ParentNamespaces(r) {
				namespaces[ns] = true
			}
		}
	}
	return out
}

// RouteBackends keeps a waypoint's client subscribed to what its
// namespace's routes, and the consumer routes attached to its Services,
// send traffic to in other namespaces (RouteReads):
// call Update with every new state. A Service's workloads follow once the
// Service itself has arrived.
type RouteBackends struct {
	client    *Client
	namespace string

	mu   sync.Mutex
	have map[string]map[string]bool // type URL -> names subscribed
}

// NewRouteBackends follows the routes of namespace for client.
func NewRouteBackends(client *Client, namespace string) *RouteBackends {
	return &RouteBackends{client: client, namespace: namespace, have: map[string]map[string]bool{
		meshv1.ServiceTypeURL: {}, meshv1.WorkloadTypeURL: {},
	}}
}

// Update subscribes to newly referenced names and drops the rest.
func (f *RouteBackends) Update(s *State) error {
	svcs, wls := RouteReads(f.namespace, slices.Collect(maps.Values(s.HTTPRoutes)), slices.Collect(maps.Values(s.GRPCRoutes)), s.Services)
	f.mu.Lock()
	defer f.mu.Unlock()
	for typeURL, want := range map[string][]string{meshv1.ServiceTypeURL: svcs, meshv1.WorkloadTypeURL: wls} {
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
