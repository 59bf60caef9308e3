package xds

import (
	"sort"

	"google.golang.org/protobuf/proto"

	"github.com/causeway-mesh/causeway/pkg/xds/meshv1"
)

// State is a client's view of the mesh at one moment: every resource it
// holds, by type and name. A State is immutable; the client replaces it as a
// whole on every accepted update, so readers need no lock and must not
// modify what they read.
type State struct {
	Workloads  map[string]*meshv1.Workload // by uid
	Services   map[string]*meshv1.Service  // by "<namespace>/<name>"
	Waypoints  map[string]*meshv1.Waypoint
	HTTPRoutes map[string]*meshv1.HTTPRoute
	GRPCRoutes map[string]*meshv1.GRPCRoute
	// ConnectionPolicies by "<namespace>/<name>".
	ConnectionPolicies map[string]*meshv1.ConnectionPolicy

	versions map[string]map[string]string // type URL -> name -> version
}

func emptyState() *State {
	s := &State{
		Workloads:  map[string]*meshv1.Workload{},
		Services:   map[string]*meshv1.Service{},
		Waypoints:  map[string]*meshv1.Waypoint{},
		HTTPRoutes: map[string]*meshv1.HTTPRoute{},
		GRPCRoutes: map[string]*meshv1.GRPCRoute{},

		ConnectionPolicies: map[string]*meshv1.ConnectionPolicy{},
		versions:           map[string]map[string]string{},
	}
	for _, t := range meshv1.TypeURLs {
		s.versions[t] = map[string]string{}
	}
	return s
}

// ResourceInfo names one resource a client holds.
type ResourceInfo struct {
	TypeURL string
	Name    string
	Version string
}

// List returns every resource held, sorted by type then name (for admin
// dumps and meshctl).
func (s *State) List() []ResourceInfo {
	var out []ResourceInfo
	for _, t := range meshv1.TypeURLs {
		for name, v := range s.versions[t] {
			out = append(out, ResourceInfo{TypeURL: t, Name: name, Version: v})
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].TypeURL != out[j].TypeURL {
			return out[i].TypeURL < out[j].TypeURL
		}
		return out[i].Name < out[j].Name
	})
	return out
}

// Get returns one resource by type URL and name.
func (s *State) Get(typeURL, name string) (proto.Message, bool) {
	var m proto.Message
	var ok bool
	switch typeURL {
	case meshv1.WorkloadTypeURL:
		m, ok = lookup(s.Workloads, name)
	case meshv1.ServiceTypeURL:
		m, ok = lookup(s.Services, name)
	case meshv1.WaypointTypeURL:
		m, ok = lookup(s.Waypoints, name)
	case meshv1.HTTPRouteTypeURL:
		m, ok = lookup(s.HTTPRoutes, name)
	case meshv1.GRPCRouteTypeURL:
		m, ok = lookup(s.GRPCRoutes, name)
	case meshv1.ConnectionPolicyTypeURL:
		m, ok = lookup(s.ConnectionPolicies, name)
	}
	return m, ok
}

func lookup[M proto.Message](m map[string]M, name string) (proto.Message, bool) {
	v, ok := m[name]
	return v, ok
}

// Versions returns the version of every resource of a type (a copy).
func (s *State) Versions(typeURL string) map[string]string {
	out := make(map[string]string, len(s.versions[typeURL]))
	for k, v := range s.versions[typeURL] {
		out[k] = v
	}
	return out
}

// with returns a copy of s in which one type's resources are replaced by
// applying updates and removals; other types are shared.
func (s *State) with(typeURL string, updated map[string]proto.Message, versions map[string]string, removed []string) *State {
	n := *s
	n.versions = make(map[string]map[string]string, len(s.versions))
	for t, v := range s.versions {
		n.versions[t] = v
	}
	vs := make(map[string]string, len(s.versions[typeURL])+len(updated))
	for k, v := range s.versions[typeURL] {
		vs[k] = v
	}
	for _, name := range removed {
		delete(vs, name)
	}
	for name, v := range versions {
		vs[name] = v
	}
	n.versions[typeURL] = vs
	switch typeURL {
	case meshv1.WorkloadTypeURL:
		n.Workloads = patch(s.Workloads, updated, removed)
	case meshv1.ServiceTypeURL:
		n.Services = patch(s.Services, updated, removed)
	case meshv1.WaypointTypeURL:
		n.Waypoints = patch(s.Waypoints, updated, removed)
	case meshv1.HTTPRouteTypeURL:
		n.HTTPRoutes = patch(s.HTTPRoutes, updated, removed)
	case meshv1.GRPCRouteTypeURL:
		n.GRPCRoutes = patch(s.GRPCRoutes, updated, removed)
	case meshv1.ConnectionPolicyTypeURL:
		n.ConnectionPolicies = patch(s.ConnectionPolicies, updated, removed)
	}
	return &n
}

func patch[M proto.Message](old map[string]M, updated map[string]proto.Message, removed []string) map[string]M {
	out := make(map[string]M, len(old)+len(updated))
	for k, v := range old {
		out[k] = v
	}
	for _, name := range removed {
		delete(out, name)
	}
	for name, m := range updated {
		out[name] = m.(M)
	}
	return out
}
