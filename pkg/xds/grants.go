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
