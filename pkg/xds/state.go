package xds

import (
	"maps"
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
	versions map[string]versionSet // by type URL
	synced   bool
}

// Synced reports whether the state holds every initial subscription's
// first sync: a consumer can act on it as the whole configuration, not a
// part that arrived first.
func (s *State) Synced() bool { return s.synced }

// versionSet is the version of every resource of one type: a base that is
// never modified once made, shared by successive States, and the changes
// since, copied by each update. A State so copies the changes, not the
// type's every version; once they outgrow a sixteenth of the base they are
// merged into a new one.
type versionSet struct {
	base    map[string]string
	changes map[string]versionChange
	n       int // resources held
}

type versionChange struct {
	version string
	removed bool
}

// get returns the version of name, if held.
func (v versionSet) get(name string) (string, bool) {
	if c, ok := v.changes[name]; ok {
		return c.version, !c.removed
	}
	b, ok := v.base[name]
	return b, ok
}

// all returns every held resource's version (a new map).
func (v versionSet) all() map[string]string {
	out := make(map[string]string, v.n)
	for name, ver := range v.base {
		if _, changed := v.changes[name]; !changed {
			out[name] = ver
		}
	}
	for name, c := range v.changes {
		if !c.removed {
			out[name] = c.version
		}
	}
	return out
}

// with returns v with the removals, then the updates, applied.
func (v versionSet) with(updated map[string]string, removed []string) versionSet {
	next := versionSet{base: v.base, changes: make(map[string]versionChange, len(v.changes)+len(updated)+len(removed)), n: v.n}
	maps.Copy(next.changes, v.changes)
	for _, name := range removed {
		if _, held := next.get(name); held {
			next.n--
			next.changes[name] = versionChange{removed: true}
		}
	}
	for name, ver := range updated {
		if _, held := next.get(name); !held {
			next.n++
		}
		next.changes[name] = versionChange{version: ver}
	}
	if len(next.changes) > 16+len(next.base)/16 {
		return versionSet{base: next.all(), n: next.n}
	}
	return next
}

func emptyState() *State {
	return &State{Set: meshv1.NewSet(), versions: map[string]versionSet{}}
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
		for name, v := range s.versions[t].all() {
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
	return s.versions[typeURL].all()
}

// with returns a copy of s in which one type's resources are replaced by
// applying updates and removals; other types are shared. Their versions
// are a versionSet, so only the changed ones are copied.
func (s *State) with(typeURL string, updated map[string]proto.Message, versions map[string]string, removed []string) *State {
	n := *s
	n.versions = maps.Clone(s.versions)
	n.versions[typeURL] = s.versions[typeURL].with(versions, removed)
	n.Patch(typeURL, updated, removed)
	return &n
}
