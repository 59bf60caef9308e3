package xdsserver

import (
	"google.golang.org/protobuf/proto"

	"github.com/causeway-mesh/causeway/pkg/xds"
	"github.com/causeway-mesh/causeway/pkg/xds/meshv1"
)

// grants maps a namespace to the names outside it that its callers may
// read: type URL -> name -> true (xds.RouteReads of the namespace's
// routes, xds.IngressReads of its ingress Gateways).
type grants map[string]map[string]map[string]bool

func (g grants) allows(ns, typeURL, name string) bool { return g[ns][typeURL][name] }

// computeGrants derives the grants of every namespace that has routes or
// ingress Gateways.
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
		svcs, wls := xds.RouteReads(ns, http, grpc, services)
		g.add(ns, meshv1.ServiceTypeURL, svcs)
		g.add(ns, meshv1.WorkloadTypeURL, wls)
	}
	workloads := map[string]*meshv1.Workload{}
	for uid, m := range res[meshv1.WorkloadTypeURL] {
		if w, ok := m.(*meshv1.Workload); ok {
			workloads[uid] = w
		}
	}
	for _, m := range res[meshv1.IngressGatewayTypeURL] {
		if gw, ok := m.(*meshv1.IngressGateway); ok {
			svcs, wls, wps := xds.IngressReads(gw, services, workloads)
			g.add(gw.GetNamespace(), meshv1.ServiceTypeURL, svcs)
			g.add(gw.GetNamespace(), meshv1.WorkloadTypeURL, wls)
			g.add(gw.GetNamespace(), meshv1.WaypointTypeURL, wps)
		}
	}
	return g
}

// add grants namespace ns the names of typeURL.
func (g grants) add(ns, typeURL string, names []string) {
	if len(names) == 0 {
		return
	}
	if g[ns] == nil {
		g[ns] = map[string]map[string]bool{}
	}
	if g[ns][typeURL] == nil {
		g[ns][typeURL] = map[string]bool{}
	}
	for _, n := range names {
		g[ns][typeURL][n] = true
	}
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
