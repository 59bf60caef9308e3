package xdsserver

import (
	"google.golang.org/protobuf/proto"

	"github.com/causeway-mesh/causeway/pkg/xds"
	"github.com/causeway-mesh/causeway/pkg/xds/meshv1"
)

// grants maps a namespace to the names outside it that its callers may
// read: type URL -> name -> true (xds.RouteReads of the namespace's routes).
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
		svcs, wls := xds.RouteReads(ns, http, grpc, services)
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
