package config

import (
	"fmt"
	"net/netip"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/validation"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/causeway-mesh/causeway/pkg/trust"
	"github.com/causeway-mesh/causeway/pkg/xds/meshv1"
)

// Translate turns a complete set of objects into a Snapshot. It either
// returns a snapshot in which every reference resolves and every address is
// unique, or an *InvalidError listing the problems with their origins; there
// is no partial result, so a caller keeps its last good snapshot.
func Translate(objs []Object, opts Options) (*Snapshot, error) {
	t := newTranslator(opts)
	t.run(objs)
	if err := t.ps.err(); err != nil {
		return nil, err
	}
	return t.out, nil
}

func newTranslator(opts Options) *translator {
	return &translator{
		opts:       opts.withDefaults(),
		namespaces: map[string]*namespaceInfo{},
		pods:       map[nsName]*podInfo{},
		podsByNS:   map[string][]nsName{},
		services:   map[nsName]*serviceInfo{},
		slices:     map[nsName][]*sliceInfo{},
		gateways:   map[nsName]*gatewayInfo{},
		grants:     map[string][]*gwv1.ReferenceGrant{},
		seen:       map[string]string{},
		out:        newSnapshot(),
	}
}

func (t *translator) run(objs []Object) {
	t.collect(objs)
	t.translateWaypoints()
	t.checkWaypointLabels()
	t.preparePods()
	t.translateServices()
	t.translateWorkloads()
	t.translateRoutes()
	t.checkAddresses()
	t.checkOutput()
}

type nsName struct{ ns, name string }

func (n nsName) String() string { return n.ns + "/" + n.name }

type namespaceInfo struct {
	origin string
	ns     *corev1.Namespace // nil when the namespace is only implied by its objects
}

func (n *namespaceInfo) labels() map[string]string {
	if n == nil || n.ns == nil {
		return nil
	}
	return n.ns.Labels
}

type podInfo struct {
	origin   string
	pod      *corev1.Pod
	uid      string
	ips      []string // canonical
	active   bool     // not Succeeded/Failed
	ready    bool
	waypoint *gatewayInfo // set on a waypoint's own pods
	serving  map[uint32]struct{}
}

type serviceInfo struct {
	origin string
	svc    *corev1.Service
	out    *meshv1.Service // nil for ExternalName services
}

type sliceInfo struct {
	origin string
	slice  *discoveryv1.EndpointSlice
}

type gatewayInfo struct {
	origin string
	gw     *gwv1.Gateway
	out    *meshv1.Waypoint // nil unless the gateway is a valid waypoint
}

type routeInfo[T any] struct {
	origin string
	route  T
}

type translator struct {
	opts       Options
	ps         problems
	namespaces map[string]*namespaceInfo
	pods       map[nsName]*podInfo
	podOrder   []nsName
	podsByNS   map[string][]nsName // podOrder by namespace: services and waypoints select in theirs
	services   map[nsName]*serviceInfo
	svcOrder   []nsName
	slices     map[nsName][]*sliceInfo // by the Service they belong to
	gateways   map[nsName]*gatewayInfo
	gwOrder    []nsName
	httpRoutes []routeInfo[*gwv1.HTTPRoute]
	grpcRoutes []routeInfo[*gwv1.GRPCRoute]
	grants     map[string][]*gwv1.ReferenceGrant // by namespace
	seen       map[string]string                 // "Kind ns/name" -> origin
	out        *Snapshot
	reports    *Reports // nil unless Analyze asked for them
}

func (t *translator) problem(origin, object, format string, args ...any) {
	t.ps.add(origin, object, format, args...)
	if t.reports == nil {
		return
	}
	msg := fmt.Sprintf(format, args...)
	if t.reports.Problems != nil {
		t.reports.Problems[object] = append(t.reports.Problems[object], msg)
	}
	if r := t.reports.route(object); r != nil {
		r.Problems = append(r.Problems, msg)
	}
}

// collect indexes the objects, defaulting namespaces and refusing duplicates.
func (t *translator) collect(objs []Object) {
	for _, o := range objs {
		var kind, ns, name string
		switch v := o.Obj.(type) {
		case *corev1.Namespace:
			kind, name = "Namespace", v.Name
		case *corev1.Pod:
			kind, ns, name = "Pod", defaultNS(&v.Namespace), v.Name
		case *corev1.Service:
			kind, ns, name = "Service", defaultNS(&v.Namespace), v.Name
		case *corev1.ServiceAccount:
			kind, ns, name = "ServiceAccount", defaultNS(&v.Namespace), v.Name
		case *discoveryv1.EndpointSlice:
			kind, ns, name = "EndpointSlice", defaultNS(&v.Namespace), v.Name
		case *gwv1.Gateway:
			kind, ns, name = "Gateway", defaultNS(&v.Namespace), v.Name
		case *gwv1.GatewayClass:
			kind, name = "GatewayClass", v.Name
		case *gwv1.HTTPRoute:
			kind, ns, name = "HTTPRoute", defaultNS(&v.Namespace), v.Name
		case *gwv1.GRPCRoute:
			kind, ns, name = "GRPCRoute", defaultNS(&v.Namespace), v.Name
		case *gwv1.ReferenceGrant:
			kind, ns, name = "ReferenceGrant", defaultNS(&v.Namespace), v.Name
		default:
			t.problem(o.Origin, "", "unsupported object %T", o.Obj)
			continue
		}
		key := kind + " " + name
		if ns != "" {
			key = kind + " " + ns + "/" + name
		}
		if name == "" {
			t.problem(o.Origin, kind, "metadata.name is required")
			continue
		}
		if prev, dup := t.seen[key]; dup {
			t.problem(o.Origin, key, "defined twice (also in %s)", prev)
			continue
		}
		t.seen[key] = o.Origin
		if ns != "" {
			if _, ok := t.namespaces[ns]; !ok {
				t.namespaces[ns] = &namespaceInfo{}
			}
		}
		id := nsName{ns, name}
		switch v := o.Obj.(type) {
		case *corev1.Namespace:
			t.namespaces[name] = &namespaceInfo{origin: o.Origin, ns: v}
		case *corev1.Pod:
			t.pods[id] = &podInfo{origin: o.Origin, pod: v}
			t.podOrder = append(t.podOrder, id)
			t.podsByNS[ns] = append(t.podsByNS[ns], id)
		case *corev1.Service:
			t.services[id] = &serviceInfo{origin: o.Origin, svc: v}
			t.svcOrder = append(t.svcOrder, id)
		case *discoveryv1.EndpointSlice:
			svc := v.Labels[LabelServiceName]
			if svc == "" {
				t.problem(o.Origin, key, "label %s naming its Service is required", LabelServiceName)
				continue
			}
			sk := nsName{ns, svc}
			t.slices[sk] = append(t.slices[sk], &sliceInfo{origin: o.Origin, slice: v})
		case *gwv1.Gateway:
			t.gateways[id] = &gatewayInfo{origin: o.Origin, gw: v}
			t.gwOrder = append(t.gwOrder, id)
		case *gwv1.HTTPRoute:
			t.httpRoutes = append(t.httpRoutes, routeInfo[*gwv1.HTTPRoute]{o.Origin, v})
		case *gwv1.GRPCRoute:
			t.grpcRoutes = append(t.grpcRoutes, routeInfo[*gwv1.GRPCRoute]{o.Origin, v})
		case *gwv1.ReferenceGrant:
			t.grants[ns] = append(t.grants[ns], v)
		}
	}
	// Slices must belong to a Service that exists.
	for sk, list := range t.slices {
		if _, ok := t.services[sk]; !ok {
			for _, s := range list {
				t.problem(s.origin, "EndpointSlice "+sk.ns+"/"+s.slice.Name,
					"dangling reference: Service %s does not exist", sk)
			}
		}
	}
}

func defaultNS(ns *string) string {
	if *ns == "" {
		*ns = corev1.NamespaceDefault
	}
	return *ns
}

// translateWaypoints builds a Waypoint for every Gateway of the waypoint class.
func (t *translator) translateWaypoints() {
	for _, id := range t.gwOrder {
		g := t.gateways[id]
		if string(g.gw.Spec.GatewayClassName) != WaypointClass {
			continue
		}
		obj := "Gateway " + id.String()
		var port uint32
		for _, l := range g.gw.Spec.Listeners {
			if string(l.Protocol) == WaypointProtocol {
				port = uint32(l.Port)
				break
			}
		}
		if port == 0 {
			t.problem(g.origin, obj, "a %s Gateway needs a listener with protocol %s (port 15008)", WaypointClass, WaypointProtocol)
			continue
		}
		waypointFor := meshv1.WaypointForService
		if v, ok := g.gw.Labels[LabelWaypointFor]; ok {
			switch v {
			case meshv1.WaypointForService, meshv1.WaypointForWorkload, meshv1.WaypointForAll:
				waypointFor = v
			default:
				t.problem(g.origin, obj, "label %s=%q: want service, workload or all", LabelWaypointFor, v)
				continue
			}
		}
		g.out = &meshv1.Waypoint{
			Name:        id.name,
			Namespace:   id.ns,
			HbonePort:   port,
			WaypointFor: waypointFor,
		}
	}
}

// checkWaypointLabels reports use-waypoint labels that name no waypoint, on
// every object that carries one, whether or not anything inherits it.
func (t *translator) checkWaypointLabels() {
	check := func(origin, obj, ns string, l map[string]string) {
		ref, set := useWaypoint(l, ns)
		if !set || ref == nil {
			return
		}
		g := t.gateways[*ref]
		switch {
		case g == nil || g.out == nil:
			t.problem(origin, obj, "dangling reference: %s=%s names waypoint %s, which is not a Gateway of class %s",
				LabelUseWaypoint, ref.name, ref, WaypointClass)
		case !WaypointAdmits(g.gw, ns, t.namespaces[ns].labels()):
			t.problem(origin, obj, "%s: %s", LabelUseWaypoint, notAdmitted(ref, ns))
		}
	}
	names := make([]string, 0, len(t.namespaces))
	for n := range t.namespaces {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		if ni := t.namespaces[n]; ni.ns != nil {
			check(ni.origin, "Namespace "+n, n, ni.ns.Labels)
		}
	}
	for _, id := range t.svcOrder {
		s := t.services[id]
		check(s.origin, "Service "+id.String(), id.ns, s.svc.Labels)
	}
	for _, id := range t.podOrder {
		p := t.pods[id]
		check(p.origin, "Pod "+id.String(), id.ns, p.pod.Labels)
	}
}

// useWaypoint reads the use-waypoint labels of one object: set reports
// whether the object decides at all; ref is nil when it opts out ("none").
func useWaypoint(l map[string]string, ns string) (ref *nsName, set bool) {
	v := l[LabelUseWaypoint]
	if v == "" {
		return nil, false
	}
	if v == UseWaypointNone {
		return nil, true
	}
	if wns := l[LabelUseWaypointNamespace]; wns != "" {
		ns = wns
	}
	return &nsName{ns, v}, true
}

// bindWaypoint applies docs/design.md §6: the most specific object that carries
// use-waypoint decides (objLabels before the namespace's), "none" opts out,
// and the binding holds only if the waypoint serves that kind of traffic
// (want: service or workload).
func (t *translator) bindWaypoint(objLabels map[string]string, ns, want string) *meshv1.Ref {
	ref, g := t.resolveWaypoint(objLabels, ns)
	if g == nil || g.out == nil {
		return nil // reported by checkWaypointLabels
	}
	if f := g.out.WaypointFor; f != want && f != meshv1.WaypointForAll {
		return nil
	}
	return &meshv1.Ref{Namespace: ref.ns, Name: ref.name}
}

// resolveWaypoint finds the waypoint an object's labels (or else its
// namespace's) name: ref is nil when nothing is named, g nil when the named
// Gateway does not exist.
func (t *translator) resolveWaypoint(objLabels map[string]string, ns string) (ref *nsName, g *gatewayInfo) {
	ref, set := useWaypoint(objLabels, ns)
	if !set {
		ref, _ = useWaypoint(t.namespaces[ns].labels(), ns)
	}
	if ref == nil {
		return nil, nil
	}
	return ref, t.gateways[*ref]
}

// WaypointAdmits reports whether a waypoint takes the traffic of namespace
// ns (with labels nsLabels): its own namespace's always, another's only as
// its HBONE listener's allowedRoutes.namespaces says (from All, or a
// Selector matching the namespace), as Istio does. Without this, anyone who
// can label a namespace could send its traffic through, and have it
// authorized by, a waypoint of another team.
func WaypointAdmits(gw *gwv1.Gateway, ns string, nsLabels map[string]string) bool {
	if gw.Namespace == ns {
		return true
	}
	for _, l := range gw.Spec.Listeners {
		if string(l.Protocol) != WaypointProtocol {
			continue
		}
		if l.AllowedRoutes == nil || l.AllowedRoutes.Namespaces == nil || l.AllowedRoutes.Namespaces.From == nil {
			return false // the default is Same
		}
		switch *l.AllowedRoutes.Namespaces.From {
		case gwv1.NamespacesFromAll:
			return true
		case gwv1.NamespacesFromSelector:
			sel, err := metav1.LabelSelectorAsSelector(l.AllowedRoutes.Namespaces.Selector)
			return err == nil && l.AllowedRoutes.Namespaces.Selector != nil && sel.Matches(labels.Set(nsLabels))
		}
		return false
	}
	return false
}

func notAdmitted(ref *nsName, ns string) string {
	return fmt.Sprintf("waypoint %s does not admit namespace %s (its %s listener's allowedRoutes.namespaces must be from All, or a Selector matching the namespace)",
		ref, ns, WaypointProtocol)
}

// preparePods parses each pod's addresses and readiness and finds waypoint pods.
func (t *translator) preparePods() {
	for _, id := range t.podOrder {
		p := t.pods[id]
		obj := "Pod " + id.String()
		p.uid = string(p.pod.UID)
		if p.uid == "" {
			p.uid = id.String()
		}
		p.active = p.pod.Status.Phase != corev1.PodSucceeded && p.pod.Status.Phase != corev1.PodFailed
		p.ready = true
		for _, c := range p.pod.Status.Conditions {
			if c.Type == corev1.PodReady && c.Status == corev1.ConditionFalse {
				p.ready = false
			}
		}
		for _, f := range [][2]string{{"spec.hostname", p.pod.Spec.Hostname}, {"spec.subdomain", p.pod.Spec.Subdomain}} {
			if why := badLabel(f[1]); why != "" {
				t.problem(p.origin, obj, "%s %q: %s", f[0], f[1], why)
			}
		}
		p.serving = map[uint32]struct{}{}
		if !p.pod.Spec.HostNetwork {
			// Host-network pods share their node's address; they are not addressable workloads.
			raw := make([]string, 0, 2)
			for _, ip := range p.pod.Status.PodIPs {
				raw = append(raw, ip.IP)
			}
			if len(raw) == 0 && p.pod.Status.PodIP != "" {
				raw = append(raw, p.pod.Status.PodIP)
			}
			for _, s := range raw {
				a, err := parseIP(s)
				if err != nil {
					t.problem(p.origin, obj, "pod IP: %v", err)
					continue
				}
				if !containsStr(p.ips, a) {
					p.ips = append(p.ips, a)
				}
			}
		}
		for _, c := range p.pod.Spec.Containers {
			for _, cp := range c.Ports {
				if cp.Protocol == "" || cp.Protocol == corev1.ProtocolTCP {
					p.serving[uint32(cp.ContainerPort)] = struct{}{}
				}
			}
		}
		if gwName := p.pod.Labels[LabelGatewayName]; gwName != "" {
			g := t.gateways[nsName{id.ns, gwName}]
			switch {
			case g == nil:
				t.problem(p.origin, obj, "dangling reference: label %s=%s names Gateway %s/%s, which does not exist",
					LabelGatewayName, gwName, id.ns, gwName)
			case g.out != nil:
				p.waypoint = g
			}
		}
	}
	// Waypoint identity and addresses come from its pods.
	for _, id := range t.gwOrder {
		g := t.gateways[id]
		if g.out == nil {
			continue
		}
		sa := ""
		var addrs []string
		for _, pid := range t.podsByNS[id.ns] { // a waypoint's pods are in its namespace
			p := t.pods[pid]
			if p.waypoint != g || !p.active {
				continue
			}
			psa := podServiceAccount(p.pod)
			if sa != "" && psa != sa {
				t.problem(p.origin, "Pod "+pid.String(), "waypoint %s has pods with different service accounts (%s and %s)", id, sa, psa)
			}
			sa = psa
			addrs = append(addrs, p.ips...)
		}
		if sa == "" {
			sa = id.name // Istio's convention: the waypoint's service account bears the Gateway's name
		}
		ident, err := trust.NewIdentity(t.opts.TrustDomain, id.ns, sa)
		if err != nil {
			t.problem(g.origin, "Gateway "+id.String(), "identity: %v", err)
			continue
		}
		g.out.Identity = ident.String()
		sort.Strings(addrs) // the same resource whatever order the source lists pods in
		g.out.Addresses = addrs
		t.out.waypointIdentities[g.out.Identity] = id.String()
		t.out.Waypoints[id.String()] = g.out
	}
}

func podServiceAccount(p *corev1.Pod) string {
	if p.Spec.ServiceAccountName != "" {
		return p.Spec.ServiceAccountName
	}
	return "default"
}

// translateServices builds Services with their ports, VIPs, endpoints and
// waypoint binding.
func (t *translator) translateServices() {
	for _, id := range t.svcOrder {
		s := t.services[id]
		obj := "Service " + id.String()
		if s.svc.Spec.Type == corev1.ServiceTypeExternalName {
			continue // not part of the mesh; backends naming it are invalid
		}
		out := &meshv1.Service{
			Name:      id.name,
			Namespace: id.ns,
			Hostname:  id.name + "." + id.ns + ".svc." + t.opts.ClusterDomain,
		}
		ips := s.svc.Spec.ClusterIPs
		if len(ips) == 0 && s.svc.Spec.ClusterIP != "" {
			ips = []string{s.svc.Spec.ClusterIP}
		}
		for _, ip := range ips {
			if ip == "" || ip == corev1.ClusterIPNone {
				continue
			}
			a, err := parseIP(ip)
			if err != nil {
				t.problem(s.origin, obj, "cluster IP: %v", err)
				continue
			}
			if !containsStr(out.Vips, a) {
				out.Vips = append(out.Vips, a)
			}
		}
		for _, p := range s.svc.Spec.Ports {
			if p.Protocol != "" && p.Protocol != corev1.ProtocolTCP {
				continue // the mesh carries TCP
			}
			sp := &meshv1.ServicePort{Name: p.Name, Port: uint32(p.Port)}
			switch {
			case p.TargetPort.Type == intstr.String:
				if n := p.TargetPort.StrVal; n == "" {
					sp.TargetPort = sp.Port
				} else if v, ok := numericPortName(n); ok {
					sp.TargetPort = v
				}
			case p.TargetPort.IntVal == 0:
				sp.TargetPort = sp.Port
			default:
				sp.TargetPort = uint32(p.TargetPort.IntVal)
			}
			if p.AppProtocol != nil {
				sp.AppProtocol = *p.AppProtocol
			}
			out.Ports = append(out.Ports, sp)
		}
		if slices := t.slices[id]; len(slices) > 0 {
			out.Endpoints = t.endpointsFromSlices(id, s, slices)
		} else {
			out.Endpoints = t.endpointsFromSelector(id, s)
		}
		sort.Slice(out.Endpoints, func(i, j int) bool {
			if out.Endpoints[i].Address != out.Endpoints[j].Address {
				return out.Endpoints[i].Address < out.Endpoints[j].Address
			}
			return out.Endpoints[i].WorkloadUid < out.Endpoints[j].WorkloadUid
		})
		out.Waypoint = t.bindWaypoint(s.svc.Labels, id.ns, meshv1.WaypointForService)
		s.out = out
		t.out.Services[id.String()] = out
	}
}

func numericPortName(s string) (uint32, bool) {
	var v uint32
	if _, err := fmt.Sscanf(s, "%d", &v); err != nil || fmt.Sprint(v) != s {
		return 0, false
	}
	return v, true
}

// svcPort finds the Kubernetes ServicePort a meshv1 port came from.
func svcPort(svc *corev1.Service, port uint32) *corev1.ServicePort {
	for i := range svc.Spec.Ports {
		if uint32(svc.Spec.Ports[i].Port) == port {
			return &svc.Spec.Ports[i]
		}
	}
	return nil
}

// endpointsFromSlices joins the Service's EndpointSlices (any number, by
// label kubernetes.io/service-name) as kube-proxy does: ready endpoints
// (ready unset means ready); when there are none, the serving endpoints of
// terminating pods, so connections still find a backend while a rollout
// drains the last ones.
func (t *translator) endpointsFromSlices(id nsName, s *serviceInfo, slices []*sliceInfo) []*meshv1.Endpoint {
	type candidate struct {
		ep  *meshv1.Endpoint
		pod *podInfo
	}
	var ready, terminating []candidate
	seen := map[string]bool{} // readiness|uid|address
	for _, si := range slices {
		sl := si.slice
		obj := "EndpointSlice " + id.ns + "/" + sl.Name
		if sl.AddressType == discoveryv1.AddressTypeFQDN {
			continue
		}
		byName := map[string]uint32{}
		for _, p := range sl.Ports {
			if p.Port == nil || (p.Protocol != nil && *p.Protocol != corev1.ProtocolTCP) {
				continue
			}
			name := ""
			if p.Name != nil {
				name = *p.Name
			}
			byName[name] = uint32(*p.Port)
		}
		ports := map[uint32]uint32{}
		for _, p := range s.svc.Spec.Ports {
			if tp, ok := byName[p.Name]; ok && (p.Protocol == "" || p.Protocol == corev1.ProtocolTCP) {
				ports[uint32(p.Port)] = tp
			}
		}
		for _, ep := range sl.Endpoints {
			c := ep.Conditions
			isReady := c.Ready == nil || *c.Ready
			isServing := c.Serving == nil && isReady || c.Serving != nil && *c.Serving
			isTerminating := c.Terminating != nil && *c.Terminating
			if !isReady && !(isServing && isTerminating) {
				continue
			}
			uid := ""
			var pod *podInfo
			if ref := ep.TargetRef; ref != nil && ref.Kind == "Pod" {
				pns := ref.Namespace
				if pns == "" {
					pns = id.ns
				}
				pod = t.pods[nsName{pns, ref.Name}]
				if pod == nil {
					t.problem(si.origin, obj, "dangling reference: endpoint targets Pod %s/%s, which does not exist", pns, ref.Name)
					continue
				}
				uid = pod.uid
			}
			if why := badLabel(ptrValue(ep.Hostname)); why != "" {
				t.problem(si.origin, obj, "endpoint hostname %q: %s", *ep.Hostname, why)
				continue
			}
			for _, addr := range ep.Addresses {
				a, err := parseIP(addr)
				if err != nil {
					t.problem(si.origin, obj, "endpoint address: %v", err)
					continue
				}
				key := fmt.Sprintf("%t|%s|%s", isReady, uid, a)
				if seen[key] {
					continue
				}
				seen[key] = true
				cand := candidate{ep: &meshv1.Endpoint{WorkloadUid: uid, Address: a, Ports: ports, Hostname: t.endpointHostname(s, ptrValue(ep.Hostname))}, pod: pod}
				if isReady {
					ready = append(ready, cand)
				} else {
					terminating = append(terminating, cand)
				}
			}
		}
	}
	if len(ready) == 0 {
		ready = terminating
	}
	out := make([]*meshv1.Endpoint, 0, len(ready))
	for _, c := range ready {
		out = append(out, c.ep)
		if c.pod != nil {
			for _, tp := range c.ep.Ports {
				c.pod.serving[tp] = struct{}{}
			}
		}
	}
	return out
}

// endpointHostname is the per-pod DNS name of an endpoint of a headless
// Service (<hostname>.<service>.<namespace>.svc.<domain>, as cluster DNS
// publishes it for StatefulSet pods), or "" when there is none. Hostnames
// are checked where they are read (pods, slices).
func (t *translator) endpointHostname(s *serviceInfo, hostname string) string {
	if hostname == "" || s.svc.Spec.ClusterIP != corev1.ClusterIPNone {
		return ""
	}
	return hostname + "." + s.svc.Name + "." + s.svc.Namespace + ".svc." + t.opts.ClusterDomain
}

// badLabel explains why s is not a DNS label (RFC 1123), or returns "".
func badLabel(s string) string {
	if s == "" {
		return ""
	}
	return strings.Join(validation.IsDNS1123Label(s), "; ")
}

func ptrValue[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}

// endpointsFromSelector derives endpoints as the EndpointSlice controller
// would: active, ready (unless publishNotReadyAddresses) pods of the
// namespace whose labels match the selector, each service port resolved on
// the pod (a named target port the pod does not declare leaves that port out).
func (t *translator) endpointsFromSelector(id nsName, s *serviceInfo) []*meshv1.Endpoint {
	if len(s.svc.Spec.Selector) == 0 {
		return nil
	}
	sel := labels.SelectorFromSet(s.svc.Spec.Selector)
	var out []*meshv1.Endpoint
	for _, pid := range t.podsByNS[id.ns] {
		p := t.pods[pid]
		if !p.active || len(p.ips) == 0 || !sel.Matches(labels.Set(p.pod.Labels)) {
			continue
		}
		if !p.ready && !s.svc.Spec.PublishNotReadyAddresses {
			continue
		}
		ports := map[uint32]uint32{}
		tcpPorts := 0
		for _, sp := range s.svc.Spec.Ports {
			if sp.Protocol != "" && sp.Protocol != corev1.ProtocolTCP {
				continue
			}
			tcpPorts++
			if tp, ok := resolveTargetPort(sp, p.pod); ok {
				ports[uint32(sp.Port)] = tp
				p.serving[tp] = struct{}{}
			}
		}
		if tcpPorts > 0 && len(ports) == 0 {
			continue
		}
		host := ""
		if p.pod.Spec.Subdomain == id.name {
			host = t.endpointHostname(s, p.pod.Spec.Hostname)
		}
		for _, a := range p.ips {
			out = append(out, &meshv1.Endpoint{WorkloadUid: p.uid, Address: a, Ports: ports, Hostname: host})
		}
	}
	return out
}

// resolveTargetPort returns the pod port a service port forwards to.
func resolveTargetPort(sp corev1.ServicePort, pod *corev1.Pod) (uint32, bool) {
	tp := sp.TargetPort
	if tp.Type == intstr.Int {
		if tp.IntVal == 0 {
			return uint32(sp.Port), true
		}
		return uint32(tp.IntVal), true
	}
	if tp.StrVal == "" {
		return uint32(sp.Port), true
	}
	for _, c := range pod.Spec.Containers {
		for _, cp := range c.Ports {
			if cp.Name == tp.StrVal && (cp.Protocol == "" || cp.Protocol == corev1.ProtocolTCP) {
				return uint32(cp.ContainerPort), true
			}
		}
	}
	if v, ok := numericPortName(tp.StrVal); ok {
		return v, true
	}
	return 0, false
}

// translateWorkloads turns pods into Workloads and builds the node index.
func (t *translator) translateWorkloads() {
	uids := map[string]string{}
	for _, id := range t.podOrder {
		p := t.pods[id]
		obj := "Pod " + id.String()
		if !p.active {
			continue
		}
		if prev, dup := uids[p.uid]; dup {
			t.problem(p.origin, obj, "uid %s is also used by Pod %s", p.uid, prev)
			continue
		}
		uids[p.uid] = id.String()
		sa := podServiceAccount(p.pod)
		ident, err := trust.NewIdentity(t.opts.TrustDomain, id.ns, sa)
		if err != nil {
			t.problem(p.origin, obj, "identity: %v", err)
			continue
		}
		w := &meshv1.Workload{
			Uid:            p.uid,
			Name:           id.name,
			Namespace:      id.ns,
			ServiceAccount: sa,
			Identity:       ident.String(),
			Node:           p.pod.Spec.NodeName,
			Addresses:      p.ips,
			Labels:         p.pod.Labels,
		}
		if a, ok := p.pod.Annotations[AnnotationAppAddress]; ok {
			addr, err := parseIP(a)
			if err != nil {
				t.problem(p.origin, obj, "annotation %s: %v", AnnotationAppAddress, err)
				continue
			}
			w.AppAddress = addr
		}
		if app, ok := p.pod.Annotations[AnnotationLocalApp]; ok {
			switch {
			case strings.TrimSpace(app) == "":
				t.problem(p.origin, obj, "annotation %s: empty (name echo or a command line)", AnnotationLocalApp)
				continue
			case p.waypoint != nil:
				t.problem(p.origin, obj, "annotation %s: a waypoint's pod runs the waypoint, not an app", AnnotationLocalApp)
				continue
			}
			t.out.LocalApps[p.uid] = app
		}
		for port := range p.serving {
			w.ServingPorts = append(w.ServingPorts, port)
		}
		sort.Slice(w.ServingPorts, func(i, j int) bool { return w.ServingPorts[i] < w.ServingPorts[j] })
		if p.waypoint != nil {
			// A waypoint listens on its own pod IP: never captured, never bound.
			w.WaypointForGateway = &meshv1.Ref{Namespace: id.ns, Name: p.waypoint.gw.Name}
		} else {
			w.Hbone = t.enrolled(p.pod)
			w.Waypoint = t.bindWaypoint(p.pod.Labels, id.ns, meshv1.WaypointForWorkload)
			if wp, clash := t.out.waypointIdentities[w.Identity]; clash {
				// Its node proxy (or its own service-account token) would
				// get the waypoint's certificate and pass the waypoint-only
				// check of every pod behind it.
				t.problem(p.origin, obj, "service account %s gives this pod the identity %s of waypoint %s, which only the waypoint's own pods may hold; "+
					"give the application its own service account", sa, w.Identity, wp)
				continue
			}
		}
		t.out.Workloads[w.Uid] = w
		if w.Hbone && w.Node != "" {
			ids := t.out.nodeIdentities[w.Node]
			if ids == nil {
				ids = map[string]struct{}{}
				t.out.nodeIdentities[w.Node] = ids
			}
			ids[w.Identity] = struct{}{}
		}
	}
}

// enrolled: dataplane-mode on the Pod decides (mesh or none), else the Namespace's.
func (t *translator) enrolled(p *corev1.Pod) bool {
	if p.Spec.HostNetwork {
		return false
	}
	if v, ok := p.Labels[LabelDataplaneMode]; ok {
		return v == DataplaneModeMesh
	}
	return t.namespaces[p.Namespace].labels()[LabelDataplaneMode] == DataplaneModeMesh
}

// checkAddresses refuses two owners for one address: pod IPs, app
// addresses and service VIPs share one space, since node proxies look
// destinations up by address.
func (t *translator) checkAddresses() {
	owner := map[string]string{}
	claim := func(origin, obj, addr, what string) {
		if prev, ok := owner[addr]; ok && prev != obj {
			t.problem(origin, obj, "duplicate address: %s %s is already used by %s", what, addr, prev)
			return
		}
		owner[addr] = obj
	}
	for _, id := range t.podOrder {
		p := t.pods[id]
		if !p.active {
			continue
		}
		for _, a := range p.ips {
			claim(p.origin, "Pod "+id.String(), a, "pod IP")
		}
	}
	for _, id := range t.podOrder {
		p := t.pods[id]
		if w := t.out.Workloads[p.uid]; w != nil && w.AppAddress != "" {
			claim(p.origin, "Pod "+id.String(), w.AppAddress, "app address")
		}
	}
	for _, id := range t.svcOrder {
		s := t.services[id]
		if s.out == nil {
			continue
		}
		for _, v := range s.out.Vips {
			claim(s.origin, "Service "+id.String(), v, "VIP")
		}
	}
}

// checkOutput runs the consumer-side validation on everything produced, so
// the control plane never serves what a client would NACK.
func (t *translator) checkOutput() {
	if len(t.ps.list) > 0 {
		return // an earlier problem may have left resources half built
	}
	for _, res := range t.out.Resources() {
		names := make([]string, 0, len(res))
		for n := range res {
			names = append(names, n)
		}
		sort.Strings(names)
		for _, n := range names {
			if err := meshv1.Validate(res[n]); err != nil {
				t.problem("translation", n, "%v", err)
			}
		}
	}
}

func parseIP(s string) (string, error) {
	a, err := netip.ParseAddr(strings.TrimSpace(s))
	if err != nil || a.Zone() != "" || a.IsUnspecified() {
		return "", fmt.Errorf("%q is not a usable IP address", s)
	}
	return a.Unmap().String(), nil
}

func containsStr(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}
