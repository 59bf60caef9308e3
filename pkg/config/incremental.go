package config

import (
	"sort"
	"sync"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/causeway-mesh/causeway/pkg/xds/meshv1"
)

// Incremental translates as Translate does, but translates again only the
// namespaces whose objects changed since its last call and reuses the
// rest: the same messages (which the xDS cache then need not marshal
// again) and the same refusals. A source whose objects keep their identity
// while they do not change (an informer cache replaces an object on
// update) calls it on every burst of changes; a pod's change then costs its
// namespace's translation, not the cluster's.
//
// A namespace is translated with every Namespace, Node (its pods'
// locality) and Gateway (labels, waypoints of other namespaces, admission)
// and its own Pods, Services,
// EndpointSlices and ConnectionPolicies; routes are translated apart, with
// every Service, ReferenceGrant and Secret (ingress Gateways are made
// there). A changed Namespace, Node or Gateway
// translates every namespace again (the Kubernetes source passes a Node
// anew only when its topology labels change). What only the whole set can decide (an address or uid claimed in
// two namespaces, an EndpointSlice naming a pod of another namespace, a set
// that is not a configuration) sends the call to Translate, so the result
// is always Translate's.
type Incremental struct {
	mu     sync.Mutex
	opts   Options
	global []Object // Namespaces, Gateways and GatewayClasses of the last call
	shards map[string]*shard
	routes *shard
	// claims: address or uid -> the namespace whose shard claims it; kept
	// across calls and changed only for the shards translated again.
	claims map[string]string
}

// shard is one namespace's objects (or the routes') and their translation.
type shard struct {
	objs []Object
	snap *Snapshot
}

// NewIncremental returns a translator with nothing cached.
func NewIncremental(opts Options) *Incremental {
	return &Incremental{opts: opts, shards: map[string]*shard{}}
}

// Translate returns what Translate(objs, opts) returns, with Rejected
// sorted by object.
func (in *Incremental) Translate(objs []Object) (*Snapshot, error) {
	in.mu.Lock()
	defer in.mu.Unlock()
	s, err := in.translate(objs)
	if err == nil {
		sort.SliceStable(s.Rejected, func(i, j int) bool { return s.Rejected[i].Object < s.Rejected[j].Object })
	}
	return s, err
}

func (in *Incremental) translate(objs []Object) (*Snapshot, error) {
	var global, routeObjs []Object
	byNS := map[string][]Object{}
	for _, o := range objs {
		switch v := o.Obj.(type) {
		case *corev1.Namespace:
			global = append(global, o)
			if _, ok := byNS[v.Name]; !ok {
				byNS[v.Name] = nil // its label's refusal is its shard's
			}
		case *gwv1.Gateway:
			global = append(global, o)
			if _, ok := byNS[defaultNS(&v.Namespace)]; !ok {
				byNS[v.Namespace] = nil
			}
		case *gwv1.GatewayClass, *corev1.Node:
			global = append(global, o)
		case *corev1.Service:
			byNS[defaultNS(&v.Namespace)] = append(byNS[v.Namespace], o)
			routeObjs = append(routeObjs, o)
		case *corev1.Pod, *discoveryv1.EndpointSlice, *corev1.ServiceAccount, *corev1.ConfigMap,
			*gwv1.BackendTLSPolicy, *ConnectionPolicy: // what they name is in their own namespace
			m := v.(metav1.Object)
			ns := m.GetNamespace()
			m.SetNamespace(defaultNS(&ns))
			byNS[ns] = append(byNS[ns], o)
		case *gwv1.HTTPRoute, *gwv1.GRPCRoute, *gwv1.ReferenceGrant, *corev1.Secret, *networkingv1.Ingress, *networkingv1.IngressClass:
			routeObjs = append(routeObjs, o) // Secrets: ingress Gateways' certificates; Ingresses are their routes
		default:
			return in.whole(objs) // Translate says what is wrong with it
		}
	}
	if !sameObjects(global, in.global) || in.claims == nil {
		in.shards, in.routes, in.claims = map[string]*shard{}, nil, map[string]string{}
	}
	in.global = global
	names := make([]string, 0, len(byNS))
	for ns := range byNS {
		names = append(names, ns)
	}
	sort.Strings(names)

	shards := make(map[string]*shard, len(names))
	var workloads, services int
	for _, ns := range names {
		old := in.shards[ns]
		sh, err := in.translated(old, byNS[ns])
		if err != nil || sh.snap.crossNamespace {
			return in.whole(objs)
		}
		if sh != old {
			in.release(old, ns)
			if !in.claim(sh, ns) {
				return in.whole(objs)
			}
		}
		shards[ns] = sh
		workloads += len(sh.snap.Workloads)
		services += len(sh.snap.Services)
	}
	for ns, old := range in.shards {
		if shards[ns] == nil {
			in.release(old, ns)
		}
	}
	out := newSnapshot()
	out.Workloads = make(map[string]*meshv1.Workload, workloads)
	out.Services = make(map[string]*meshv1.Service, services)
	for _, ns := range names {
		mergeNamespace(out, shards[ns].snap, ns)
	}
	routes, err := in.translated(in.routes, routeObjs)
	if err != nil {
		return in.whole(objs)
	}
	for k, v := range routes.snap.HTTPRoutes {
		out.HTTPRoutes[k] = v
	}
	for k, v := range routes.snap.GRPCRoutes {
		out.GRPCRoutes[k] = v
	}
	for k, v := range routes.snap.IngressGateways {
		out.IngressGateways[k] = v // its listeners, certificates and attached routes
		out.waypointIdentities[v.Identity] = k
	}
	for _, p := range routes.snap.Rejected {
		if k := p.Kind(); routeKind(k) {
			out.Rejected = append(out.Rejected, p)
		}
	}
	in.shards, in.routes = shards, routes
	return out, nil
}

// translated returns sh if it holds exactly objs, else their translation
// with the global objects.
func (in *Incremental) translated(sh *shard, objs []Object) (*shard, error) {
	if sh != nil && sameObjects(objs, sh.objs) {
		return sh, nil
	}
	snap, err := Translate(append(append(make([]Object, 0, len(in.global)+len(objs)), in.global...), objs...), in.opts)
	if err != nil {
		return nil, err
	}
	return &shard{objs: objs, snap: snap}, nil
}

// claim records sh's claims for ns; false when one is another namespace's.
func (in *Incremental) claim(sh *shard, ns string) bool {
	for _, c := range sh.snap.claims {
		if prev, ok := in.claims[c]; ok && prev != ns {
			return false
		}
		in.claims[c] = ns
	}
	return true
}

// release forgets the claims of ns's former shard sh (nil: none).
func (in *Incremental) release(sh *shard, ns string) {
	if sh == nil {
		return
	}
	for _, c := range sh.snap.claims {
		if in.claims[c] == ns {
			delete(in.claims, c)
		}
	}
}

// whole translates objs as one and forgets the shards: the next call
// starts afresh.
func (in *Incremental) whole(objs []Object) (*Snapshot, error) {
	in.global, in.shards, in.routes, in.claims = nil, map[string]*shard{}, nil, nil
	return Translate(objs, in.opts)
}

// mergeNamespace adds what namespace ns's translation decided about ns to
// out.
func mergeNamespace(out, s *Snapshot, ns string) {
	for k, w := range s.Workloads {
		out.Workloads[k] = w
	}
	for k, v := range s.Services {
		if v.Namespace == ns {
			out.Services[k] = v
		}
	}
	for k, v := range s.Waypoints {
		if v.Namespace == ns {
			out.Waypoints[k] = v
			out.waypointIdentities[v.Identity] = k
		}
	}
	for k, v := range s.LocalApps {
		out.LocalApps[k] = v
	}
	for k, v := range s.ConnectionPolicies {
		if v.Namespace == ns {
			out.ConnectionPolicies[k] = v
		}
	}
	for node, ids := range s.nodeIdentities {
		m := out.nodeIdentities[node]
		if m == nil {
			m = make(map[string]struct{}, len(ids))
			out.nodeIdentities[node] = m
		}
		for id := range ids {
			m[id] = struct{}{}
		}
	}
	for _, p := range s.Rejected {
		switch p.Kind() {
		case "Namespace":
			if p.Name() == ns {
				out.Rejected = append(out.Rejected, p)
			}
		default:
			if !routeKind(p.Kind()) && p.Namespace() == ns { // the routes' translation decides those
				out.Rejected = append(out.Rejected, p)
			}
		}
	}
}

// routeKind: objects of the kind are translated with the routes.
func routeKind(kind string) bool {
	return kind == "HTTPRoute" || kind == "GRPCRoute" || kind == "Ingress" || kind == "IngressClass"
}

// sameObjects: the same objects (by identity) from the same origins, in
// the same order.
func sameObjects(a, b []Object) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].Obj != b[i].Obj || a[i].Origin != b[i].Origin {
			return false
		}
	}
	return true
}
