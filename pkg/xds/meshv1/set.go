package meshv1

import (
	"maps"

	"google.golang.org/protobuf/proto"
)

// Set holds mesh resources, one map a type, by resource name: the control
// plane's translation (config.Snapshot) and what an xDS client holds
// (xds.State) are made of it.
type Set struct {
	Workloads          map[string]*Workload // by uid
	Services           map[string]*Service  // by "<namespace>/<name>"
	Waypoints          map[string]*Waypoint
	HTTPRoutes         map[string]*HTTPRoute
	GRPCRoutes         map[string]*GRPCRoute
	ConnectionPolicies map[string]*ConnectionPolicy // by "<namespace>/<name>"
	IngressGateways    map[string]*IngressGateway   // by "<namespace>/<name>"
}

// NewSet returns a Set with every map made and empty.
func NewSet() Set {
	var r Set
	for _, t := range TypeURLs {
		m, set := r.typed(t)
		set(m.patched(nil, nil))
	}
	return r
}

// Get returns one resource by type URL and name.
func (r *Set) Get(typeURL, name string) (proto.Message, bool) {
	m, _ := r.typed(typeURL)
	if m == nil {
		return nil, false
	}
	return m.get(name)
}

// Messages returns one type's resources as messages: a new map, sharing
// the messages.
func (r *Set) Messages(typeURL string) map[string]proto.Message {
	m, _ := r.typed(typeURL)
	if m == nil {
		return nil
	}
	return m.messages()
}

// Patch replaces one type's map by a copy with updated set and removed
// deleted; the other types' maps, and the old map, are left as they were
// (readers may share them).
func (r *Set) Patch(typeURL string, updated map[string]proto.Message, removed []string) {
	if m, set := r.typed(typeURL); m != nil {
		set(m.patched(updated, removed))
	}
}

// typed returns the map of typeURL and a function that replaces it, or
// nil for a type URL that is not a mesh resource's.
func (r *Set) typed(typeURL string) (typedMap, func(typedMap)) {
	switch typeURL {
	case WorkloadTypeURL:
		return byName[*Workload](r.Workloads), func(m typedMap) { r.Workloads = m.(byName[*Workload]) }
	case ServiceTypeURL:
		return byName[*Service](r.Services), func(m typedMap) { r.Services = m.(byName[*Service]) }
	case WaypointTypeURL:
		return byName[*Waypoint](r.Waypoints), func(m typedMap) { r.Waypoints = m.(byName[*Waypoint]) }
	case HTTPRouteTypeURL:
		return byName[*HTTPRoute](r.HTTPRoutes), func(m typedMap) { r.HTTPRoutes = m.(byName[*HTTPRoute]) }
	case GRPCRouteTypeURL:
		return byName[*GRPCRoute](r.GRPCRoutes), func(m typedMap) { r.GRPCRoutes = m.(byName[*GRPCRoute]) }
	case ConnectionPolicyTypeURL:
		return byName[*ConnectionPolicy](r.ConnectionPolicies), func(m typedMap) { r.ConnectionPolicies = m.(byName[*ConnectionPolicy]) }
	case IngressGatewayTypeURL:
		return byName[*IngressGateway](r.IngressGateways), func(m typedMap) { r.IngressGateways = m.(byName[*IngressGateway]) }
	}
	return nil, nil
}

// typedMap is one type's map of a Set, whatever the type.
type typedMap interface {
	get(name string) (proto.Message, bool)
	messages() map[string]proto.Message
	patched(updated map[string]proto.Message, removed []string) typedMap
}

type byName[M proto.Message] map[string]M

func (m byName[M]) get(name string) (proto.Message, bool) {
	v, ok := m[name]
	return v, ok
}

func (m byName[M]) messages() map[string]proto.Message {
	out := make(map[string]proto.Message, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

func (m byName[M]) patched(updated map[string]proto.Message, removed []string) typedMap {
	out := maps.Clone(m) // about twice as fast as inserting each entry again
	if out == nil {
		out = byName[M]{}
	}
	for _, name := range removed {
		delete(out, name)
	}
	for name, v := range updated {
		out[name] = v.(M)
	}
	return out
}
