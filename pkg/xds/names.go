// Package xds consumes the mesh model (pkg/xds/meshv1) over delta ADS: the
// Client of node proxies and waypoints, and the names both ends agree on.
// The control plane's server is package xdsserver.
package xds

import "github.com/causeway-mesh/causeway/pkg/xds/meshv1"

// NamespaceWildcardSuffix marks a subscription to every resource of one
// namespace: "<namespace>/*" (a waypoint subscribes to its namespace's
// services and routes this way). Workloads match by their namespace field,
// since their resource name is a uid; routes also match the namespaces of
// their parent Services (consumer routes, GEP-1294).
const NamespaceWildcardSuffix = "/*"

// Wildcard subscribes to every resource of a type.
const Wildcard = "*"

// TypeName shortens a type URL for logs and metric labels.
func TypeName(typeURL string) string {
	switch typeURL {
	case meshv1.WorkloadTypeURL:
		return "workload"
	case meshv1.ServiceTypeURL:
		return "service"
	case meshv1.WaypointTypeURL:
		return "waypoint"
	case meshv1.HTTPRouteTypeURL:
		return "httproute"
	case meshv1.GRPCRouteTypeURL:
		return "grpcroute"
	case meshv1.ConnectionPolicyTypeURL:
		return "connectionpolicy"
	case meshv1.IngressGatewayTypeURL:
		return "ingressgateway"
	}
	return "unknown"
}
