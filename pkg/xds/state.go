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
	meshv1.Set
	versions map[string]map[string]string // type URL -> name -> version
}

func emptyState() *State {
	s := &State{Set: meshv1.NewSet(), versions: map[string]map[string]string{}}
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
	n.Patch(typeURL, updated, removed)
	return &n
}
